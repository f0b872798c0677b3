import Foundation

/// What `tidemark import` adopted.
public struct ImportOutcome: Sendable {
    /// Memberships adopted per declared topic.
    public var adopted: [String: Int]
    /// Registrations read from FCM.
    public var registrationsRead: Int
    /// Of those, the ones FCM does not know.
    public var dead: Int
    /// Declared groups found in FCM.
    public var groupsFound: [String]
    /// The serial state was written at; nil on a dry run.
    public var serial: Int?

    /// Memberships adopted in all.
    public var adoptedTotal: Int { adopted.values.reduce(0, +) }
}

/// `tidemark import`: read FCM and adopt memberships that already exist, without changing FCM.
///
/// The caller holds the state lock around `run` unless it is a dry run.
public struct ImportWorkflow: Sendable {
    /// The parts it reads and records to.
    public var parts: WorkflowParts

    /// The workflow over `parts`.
    public init(_ parts: WorkflowParts) { self.parts = parts }

    /// Adopts what FCM holds for `targets`; a dry run reports it and writes nothing.
    public func run(targets: Targets = .all, dryRun: Bool = false) async throws -> ImportOutcome {
        if let pending = try await parts.store.unfinishedApply() {
            throw WorkflowError.unfinished(pending, at: parts.store.location)
        }
        var (state, loaded) = try await parts.loadStateAndManifests()
        try parts.stopOnErrors(loaded)
        try PlanWorkflow.checkSelectors(targets, state: state, loaded: loaded)
        let refresh = try await parts.refreshAll(state: state, loaded: loaded)
        let before = state
        let observations = state.recordRefresh(refresh)
        let adopted = state.adopt(loaded.desired, targets: targets)
        let groups = loaded.desired.groups.map(\.name).filter {
            targets.coversGroup($0) && state.groups[$0]?.key != nil
        }
        var outcome = ImportOutcome(
            adopted: adopted, registrationsRead: refresh.refreshed.count,
            dead: refresh.dead.count, groupsFound: groups, serial: nil)
        guard !dryRun else { return outcome }
        // Nothing adopted and nothing new seen: writing would only move the serial and make every open
        // pull request's saved plan stale.
        if adopted.isEmpty, observations.isEmpty, !before.lineage.isEmpty, before.backend != nil {
            outcome.serial = before.serial
            return outcome
        }
        parts.claim(&state)
        // Which device holds each token, as an apply records it: every token is written anyway, and the
        // first apply after an import then has no million rows of bookkeeping to write.
        _ = state.recordDevices(loaded.inventory)
        var write = StateWrite()
        write.includeTopicsAndGroups(before: before, after: state)
        write.allTokens = true
        outcome.serial = try await parts.store.save(&state, write, at: parts.timing.unixTime())
        return outcome
    }
}
