import Foundation

/// `tidemark drift`: read FCM and classify what moved that nobody planned. Writes nothing.
public struct DriftWorkflow: Sendable {
    /// The parts it reads.
    public var parts: WorkflowParts

    /// The workflow over `parts`.
    public init(_ parts: WorkflowParts) { self.parts = parts }

    /// Reads what `policy` asks for and reports what moved; writes nothing.
    public func run(_ policy: RefreshPolicy = .all) async throws -> DriftReport {
        guard policy.reads else {
            throw WorkflowError.nothingToRead(command: "drift")
        }
        let (state, loaded) = try await parts.loadStateAndManifests()
        // With no state there is nothing tidemark made or saw to compare with: never "No drift".
        if state.lineage.isEmpty { throw WorkflowError.noState(location: parts.store.location) }
        try parts.stopOnErrors(loaded)
        let run = try await parts.refresh(policy, state: state, loaded: loaded)
        guard let refresh = run.observed else { throw WorkflowError.nothingToRead(command: "drift") }
        let now = parts.timing.wallClock()
        let plan = parts.planner().plan(
            loaded: loaded, state: state, refresh: refresh,
            backend: parts.backend.identity, now: now)
        let items = DriftReport.classify(
            plan.observations, desired: loaded.desired, state: state,
            inventory: loaded.inventory)
        let pending = plan.subscribeCount + plan.unsubscribeCount + plan.operations.filter(\.kind.isGroupCall).count
        var report = DriftReport(
            tidemarkVersion: parts.tidemarkVersion, checkedAt: now, lineage: state.lineage,
            serial: state.serial, backend: parts.backend.identity, registrationsRead: refresh.refreshed.count,
            items: items, pendingChanges: pending)
        report.coverage = run.coverage
        let warnings = loaded.diagnostics.filter { $0.severity == .warning }
        report.warnings = warnings.isEmpty ? nil : warnings
        report.estimate(sampled: Set(run.sampled.map { state.tokens[$0] }))
        return report
    }
}

extension DriftReport {
    /// How `tidemark drift` ends: 2 for drift when asked.
    public func exitStatus(detailedExitcode: Bool) -> ExitStatus {
        detailedExitcode && hasDrift ? .changes : .success
    }
}
