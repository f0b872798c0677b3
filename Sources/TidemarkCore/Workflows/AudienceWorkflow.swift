import Foundation

/// `tidemark audience`: who a send to a condition reaches, by the manifests or by what tidemark
/// observed (read afresh from a backend when one is given). Writes nothing.
public struct AudienceWorkflow: Sendable {
    /// Where the audiences are declared.
    public var manifests: any ManifestSource
    /// Where their members are kept.
    public var store: any StateStore
    /// Where diagnostics and progress go.
    public var output: any WorkflowOutput

    /// The workflow over these parts; silent unless given an output.
    public init(manifests: any ManifestSource, store: any StateStore, output: any WorkflowOutput = SilentOutput()) {
        self.manifests = manifests
        self.store = store
        self.output = output
    }

    /// State and the manifests, resolved into state's token table (for a named audience).
    public func load() async throws -> (State, LoadedManifests) {
        let (state, loaded) = try await WorkflowParts.loadStateAndManifests(manifests: manifests, store: store)
        try WorkflowParts.stopOnErrors(loaded, output: output)
        return (state, loaded)
    }

    /// `refreshFrom`: read every known registration from this backend first (for `source: .observed`).
    public func run(
        _ condition: FCMCondition, source: Audience.Source, refreshFrom backend: (any Backend)? = nil,
        timing: Timing = .live
    ) async throws -> (Audience, LoadedManifests) {
        var (state, loaded) = try await WorkflowParts.loadStateAndManifests(manifests: manifests, store: store)
        try WorkflowParts.stopOnErrors(loaded, output: output)
        if let backend {
            let parts = WorkflowParts(
                manifests: manifests, store: store, backend: backend, timing: timing, output: output,
                tidemarkVersion: "")
            state.recordRefresh(try await parts.refreshAll(state: state, loaded: loaded))
        }
        return (Audience(condition: condition, source: source, desired: loaded.desired, state: state), loaded)
    }
}
