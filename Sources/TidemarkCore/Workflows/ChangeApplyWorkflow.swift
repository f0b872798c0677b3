import Foundation
import ServiceLifecycle

/// What applying a batch of changed devices came to.
public struct ChangeApplied: Sendable {
    /// What was sent, as any apply says it; nil when the batch had nothing to do.
    public var summary: ApplySummary?
    /// State as the apply left it (what the `WarmPlan` takes on).
    public var state: State
    /// Devices the inventory lists whose token FCM reported dead.
    public var dead: [DeadDevice]
}

extension ApplyWorkflow {
    /// Applies a batch planned by `WarmPlan.planChanges` through the same journal, rails and
    /// executor as any apply: every operation is journaled as it finishes, so a batch interrupted here
    /// is finished or abandoned by the next apply like any other (its plan records a digest no full
    /// read matches, so it is abandoned: what was in flight is read from FCM, and the full plan that
    /// follows does what is left). The caller holds the state lock. A plan with errors (a rail) is
    /// refused with `planHasErrors`; a store that holds another state than the batch was planned
    /// from refuses the save.
    public func applyChanges(_ change: ChangePlan) async throws -> ChangeApplied {
        let writer = JournalWriter()
        return try await writer.run {
            try await cancelWhenGracefulShutdown { try await applyingChanges(change, writer: writer) }
        }
    }

    private func applyingChanges(_ change: ChangePlan, writer: JournalWriter) async throws -> ChangeApplied {
        let plan = change.plan
        if plan.diagnostics.hasErrors {
            parts.output.emit(.diagnostics(plan.diagnostics))
            throw WorkflowError.planHasErrors
        }
        let inventory = change.loaded.inventory
        guard plan.hasChanges else {
            // The devices' tokens are still recorded (a device that came back, a rotation that changed
            // nothing in FCM): state knows whose each token is.
            var state = change.state
            let devices = state.recordDevices(inventory)
            let departed = state.noteDepartures(
                declared: change.loaded.desired.knownTokens, at: parts.timing.unixTime())
            if !devices.isEmpty || !departed.isEmpty {
                var write = StateWrite()
                write.tokens = devices + departed
                try await parts.store.save(&state, write, at: parts.timing.unixTime())
            }
            return ChangeApplied(summary: nil, state: state, dead: [])
        }
        var state = change.state
        state.claim(backend: plan.backend, lineage: parts.timing.uuid())
        let session = try await ApplySession.begin(
            plan: plan, desired: change.loaded.desired, store: parts.store, state: state, timing: parts.timing,
            inventory: inventory, answers: parts.deadAnswers(inventory), writer: writer)
        let summary = try await execute(plan, done: [], tokensDone: [:], session: session)
        let final = await session.state
        return ChangeApplied(
            summary: summary, state: final, dead: DeadDevice.collect(state: final, inventory: inventory))
    }
}
