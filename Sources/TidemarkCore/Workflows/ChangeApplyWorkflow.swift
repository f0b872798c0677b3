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
        // Under the lock: the state the batch was planned from must be the stored one (another run
        // may have applied since), and nothing may be unfinished (the next whole apply settles it).
        let planned = StateRevision(of: change.state)
        if let stored = try await parts.store.revision(), stored != planned {
            throw ChangeApplyError.stateMoved(stored: stored, planned: planned)
        }
        if try await parts.store.unfinishedApply() != nil { throw ChangeApplyError.unfinishedApply }
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

/// Why a batch of changed devices was not applied: the whole reconcile that follows deals with it.
public enum ChangeApplyError: TidemarkError, Equatable {
    /// Another run wrote state since the batch's state was read.
    case stateMoved(stored: StateRevision, planned: StateRevision)
    /// An apply was interrupted; a whole apply finishes or abandons it first.
    case unfinishedApply

    /// A short reason.
    public var reason: FailureReason {
        switch self {
        case .stateMoved: "state_moved"
        case .unfinishedApply: "unfinished_apply"
        }
    }

    /// What happened.
    public var description: String {
        switch self {
        case .stateMoved(let stored, let planned):
            "state was written by another run since the batch was planned (the store holds \(stored), the batch was planned from \(planned))"
        case .unfinishedApply: "an interrupted apply must be finished or abandoned first"
        }
    }
}
