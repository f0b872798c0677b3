import Foundation

/// What a prune forgot (or would forget, on a dry run).
public struct PruneOutcome: Sendable {
    /// The tokens forgotten (or to forget).
    public var selection: PruneSelection
    /// Tokens in state before.
    public var tokensBefore: Int
    /// The serial written; nil on a dry run, when nothing was pruned, or when there is no state.
    public var serial: Int?
}

/// `tidemark state prune`, and the automatic prune after an apply (`prune_after:`): forgets dead tokens
/// and tokens that left the inventory once they have not been seen for a retention, so that state
/// does not grow forever. Never while an apply is unfinished, never when the manifests or inventory
/// could not be read (everything would look undeclared).
///
/// The caller holds the state lock around `run` unless it is a dry run.
public struct PruneWorkflow: Sendable {
    /// Where the manifests and inventory are read from: what is declared is never forgotten.
    public var manifests: any ManifestSource
    /// The state to prune.
    public var store: any StateStore
    /// The clock that decides what is old enough.
    public var timing: Timing
    /// Where progress and diagnostics go.
    public var output: any WorkflowOutput

    /// The fewest tokens an automatic prune forgets (or a tenth of state, when that is more).
    public static let automaticMinimum = 1000

    /// A prune of `store`'s state against `manifests`.
    public init(
        manifests: any ManifestSource, store: any StateStore, timing: Timing = .live,
        output: any WorkflowOutput = SilentOutput()
    ) {
        self.manifests = manifests
        self.store = store
        self.timing = timing
        self.output = output
    }

    /// Forgets what left at least `retention` seconds ago, in one save (none with `dryRun`).
    public func run(retention: Int64, dryRun: Bool = false) async throws -> PruneOutcome {
        if let pending = try await store.unfinishedApply() {
            throw WorkflowError.unfinished(pending, at: store.location)
        }
        let (state, loaded) = try await WorkflowParts.loadStateAndManifests(manifests: manifests, store: store)
        try WorkflowParts.stopOnErrors(loaded, output: output)
        guard !state.lineage.isEmpty else {
            return PruneOutcome(selection: PruneSelection(), tokensBefore: 0, serial: nil)
        }
        if dryRun {
            let selection = state.prunable(
                declared: loaded.desired.knownTokens, now: timing.unixTime(), retention: retention)
            return PruneOutcome(selection: selection, tokensBefore: state.tokens.count, serial: nil)
        }
        return try await Self.prune(
            state, declared: loaded.desired.knownTokens, store: store, now: timing.unixTime(), retention: retention)
    }

    /// Prunes `state` and saves it when anything goes; `minimum` skips a prune of fewer tokens.
    static func prune(
        _ state: State, declared: TokenSet, store: any StateStore, now: Int64, retention: Int64, minimum: Int = 1
    ) async throws -> PruneOutcome {
        let selection = state.prunable(declared: declared, now: now, retention: retention)
        guard selection.count >= max(1, minimum) else {
            return PruneOutcome(selection: PruneSelection(), tokensBefore: state.tokens.count, serial: nil)
        }
        var pruned = state.removing(selection)
        let serial = try await store.save(&pruned, .compacting(pruned), at: now)
        return PruneOutcome(selection: selection, tokensBefore: state.tokens.count, serial: serial)
    }
}
