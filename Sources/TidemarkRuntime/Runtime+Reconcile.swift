import Foundation
import TidemarkCore

/// What one reconcile of a workspace does: `serve` asks for one each round, with the workspace's
/// `drift` and `on_change` settings (narrowed by its sync windows).
///
/// | drift \ on_change | apply | plan |
/// |---|---|---|
/// | heal | drift report, then `apply` (reads FCM as `refresh` says, so drift is corrected with the changes) | drift report; `apply --drift-only` when drift was found; changes planned, waiting |
/// | warn | drift report; `apply --no-refresh` (changes only) | drift report; changes planned, waiting |
/// | off | `apply --no-refresh` | changes planned, waiting |
public struct ReconcileRequest: Sendable {
    /// What to do about drift.
    public var drift: ServeSettings.DriftPolicy
    /// What to do with the changes of the manifests and the inventory.
    public var onChange: ServeSettings.ChangePolicy
    /// The most the reconcile may unsubscribe; nil: `max_unsubscribes` of tidemark.yaml.
    public var maxUnsubscribes: UnsubscribeLimit?
    /// How many applies the state's history keeps after an apply; nil: all of them.
    public var historyKeep: Int?
    /// Called with every plan the reconcile makes, before it is carried out (its diagnostics, its reads).
    public var planReady: @Sendable (Plan) -> Void
    /// Seconds an apply waits for the state lock that another run (a person's `tidemark apply`)
    /// holds, before it fails with `state_locked` (0: at once).
    public var lockWait: Double = 0
    /// A rail that refuses one topic or group holds it, and the rest is applied (`--skip-held`);
    /// false: it refuses the whole plan.
    public var skipHeld = true

    /// A reconcile as `settings` say.
    public init(_ settings: ServeSettings, planReady: @escaping @Sendable (Plan) -> Void = { _ in }) {
        drift = settings.drift
        onChange = settings.onChange
        maxUnsubscribes = settings.maxUnsubscribes
        historyKeep = settings.historyKeep
        self.planReady = planReady
    }
}

/// What one reconcile did.
public struct ReconcileOutcome: Sendable {
    /// Nothing done yet.
    public init() {}

    /// Drifted memberships found, by kind (`DriftReport.Kind`'s raw values); nil when FCM was not read for drift.
    public var drift: [String: Int]?
    /// Registrations the drift check read, when one ran.
    public var driftChecked: Int?
    /// What the drift check's read covered, when one ran.
    public var driftCoverage: RefreshCoverage?
    /// Whether drift was corrected.
    public var driftHealed = false
    /// Changes planned and left waiting (`on_change: plan`).
    public var changesWaiting = 0
    /// The memberships state holds afterwards, when the reconcile planned.
    public var managedMemberships: Int?
    /// What each apply sent: an interrupted one finished first, then the reconcile's own.
    public var applied: [ApplySummary] = []
    /// What a whole apply settled (what the batches of changed devices start from); nil when none ran.
    public var settled: ApplyOutcome.Settled?
    /// Older applies deleted from the history (`history_keep`).
    public var historyTrimmed = 0
    /// Why the history could not be trimmed, when it could not (the apply itself went through).
    public var historyTrimFailure: Failure?
    /// What reporting the dead tokens found came to (nil when none were reported).
    public var deadTokens: DeadTokenWriteBack.Report?

    /// Whether a token change failed, in either apply, for a reason other than the token being unregistered.
    public var hasUnexpectedFailures: Bool { applied.contains(where: \.hasUnexpectedFailures) }
    /// Memberships added in FCM.
    public var subscribed: Int { applied.reduce(0) { $0 + $1.subscribed } }
    /// Memberships removed in FCM.
    public var unsubscribed: Int { applied.reduce(0) { $0 + $1.unsubscribed } }
    /// Device-group calls made.
    public var groupCalls: Int { applied.reduce(0) { $0 + $1.groupCalls } }
    /// Requests sent to FCM to change it.
    public var writeRequests: Int { applied.reduce(0) { $0 + $1.requests } }
    /// Drifted memberships found, opt-outs aside.
    public var driftFound: Int { DriftReport.found(in: drift) }
}

/// What a batch of changed devices, planned on its own, did.
public struct ChangedDevicesOutcome: Sendable {
    /// What was sent; nil when the batch had nothing to do.
    public var summary: ApplySummary?
    /// The memberships state holds afterwards.
    public var managedMemberships: Int
    /// What reporting the dead tokens found came to (nil when none were found).
    public var deadTokens: DeadTokenWriteBack.Report?
}

extension Runtime {
    /// One reconcile: a drift check when `drift` asks for one and the project reads FCM, then the
    /// changes applied (under the state lock, through the journal) or planned and left waiting.
    /// After an apply the history is trimmed to `historyKeep` and the dead tokens found are
    /// reported to the sources' `on_dead` hooks. Throws what `plan` and `apply` throw;
    /// `planHasErrors` when a plan left waiting has errors. What it did before it threw (the drift
    /// found, what an apply sent) stays in `outcome`.
    public func reconcile(
        _ request: ReconcileRequest, output: any WorkflowOutput, into outcome: inout ReconcileOutcome
    ) async throws {
        let flags = PlanningFlags(maxUnsubscribes: request.maxUnsubscribes)
        let policy = refreshPolicy(flags)
        func planRequest(_ flags: PlanningFlags, driftOnly: Bool = false) -> PlanRequest {
            var planning = self.planRequest(flags, driftOnly: driftOnly)
            planning.skipHeld = request.skipHeld
            planning.topicRail = unattendedRail(flags)
            return planning
        }
        if request.drift != .off, policy.mode != .none {
            do {
                let report = try await drift(policy, output: output)
                var counts: [String: Int] = [:]
                for kind in DriftReport.Kind.allCases { counts[kind.rawValue] = report.count(kind) }
                outcome.drift = counts
                outcome.driftChecked = report.registrationsRead
                outcome.driftCoverage = report.coverage
            } catch let error as WorkflowError where error.reason == .noState {
                // Nothing applied yet: nothing to drift from. The first apply reads what it needs.
            }
        }
        switch request.onChange {
        case .apply:
            var planning = planRequest(flags)
            if request.drift != .heal { planning.refresh.mode = .none }
            try await reconcileApply(planning, request, output: output, into: &outcome)
            outcome.driftHealed = request.drift == .heal && outcome.driftFound > 0
        case .plan:
            if request.drift == .heal, outcome.driftFound > 0 {
                let planning = planRequest(flags, driftOnly: true)
                try await reconcileApply(planning, request, output: output, into: &outcome)
                outcome.driftHealed = true
                // The drift-only apply settled no whole plan: the batches start from the next one.
                outcome.settled = nil
            }
            var waiting = planRequest(flags)
            waiting.refresh.mode = .none
            let planned = try await plan(waiting, output: output)
            request.planReady(planned.plan)
            outcome.managedMemberships = planned.state.managedMemberships
            outcome.changesWaiting = planned.plan.operations.count
            if planned.plan.diagnostics.hasErrors { throw WorkflowError.planHasErrors }
        }
    }

    private func reconcileApply(
        _ planning: PlanRequest, _ reconcile: ReconcileRequest, output: any WorkflowOutput,
        into outcome: inout ReconcileOutcome
    ) async throws {
        let planReady = reconcile.planReady
        var request = try applyRequest(planning)
        request.planReady = { planReady($0.plan) }
        let applied = try await apply(
            request, output: output, lockTimeout: reconcile.lockWait, holder: "tidemark serve (reconcile)")
        if let managed = applied.managedMemberships { outcome.managedMemberships = managed }
        outcome.applied += [applied.resumed, applied.applied].compactMap { $0 }
        outcome.settled = applied.settled
        if let keep = reconcile.historyKeep, !outcome.applied.isEmpty {
            do {
                outcome.historyTrimmed += try await historyTrimming().trimHistory(keep: keep)
            } catch {
                outcome.historyTrimFailure = Failure(error)
            }
        }
        outcome.deadTokens = try await reportDeadTokens(of: applied, to: nil)
    }

    /// Reports the dead devices an apply found, as every front end does: to `file` (NDJSON) and to
    /// each source's `on_dead` hook, after the apply and outside its lock (the hooks write to the
    /// app's database, not to state). Nil, reporting nothing, after a declined apply or one that
    /// only finished an interrupted one. Throws `DeadTokenWriteBack.FileError` when `file` cannot be
    /// written; a hook that fails is in the report's `failures`.
    public func reportDeadTokens(of outcome: ApplyOutcome, to file: String?) async throws -> DeadTokenWriteBack.Report?
    {
        guard outcome.result.reportsDead, file != nil || !outcome.dead.isEmpty else { return nil }
        return try await writeBackDead(outcome.dead, to: file)
    }

    /// Plans the changed devices `ids` of the source `name` on their own, from `warm` (what the last
    /// whole reconcile read, as the batches since left it), and applies them under the state lock;
    /// `warm` takes on what was applied. Throws `PlanInFull` when they must be planned with the whole
    /// inventory (the source follows no changes, a row has a problem, a rail refuses the batch's plan),
    /// and what the apply throws. The dead tokens found are reported to the sources' hooks.
    public func reconcileChanges(
        _ ids: [String], of name: String, from warm: inout WarmPlan, maxUnsubscribes: UnsubscribeLimit?,
        output: any WorkflowOutput
    ) async throws -> ChangedDevicesOutcome {
        guard let (rows, problems) = try await readDevices(ids, of: name) else {
            throw PlanInFull("'\(name)' is not a source of tidemark.yaml whose changes are followed")
        }
        if let problem = problems.first(where: { $0.severity == .error }) {
            throw PlanInFull("a changed row has a problem: \(problem.description)")
        }
        guard let backend = warm.state.backend else { throw PlanInFull("state records no backend yet") }
        let planner = Planner(
            differ: Differ(groupsTurnedDown: deadlines.groupsTurnedDown), tidemarkVersion: Self.version)
        let flags = PlanningFlags(maxUnsubscribes: maxUnsubscribes)
        let change = try warm.planChanges(
            devices: ids, rows: rows, source: ConfiguredSource.display(name), planner: planner, backend: backend,
            now: timing.wallClock(), maxUnsubscribes: unsubscribeLimit(flags), topicRail: unattendedRail(flags))
        if change.plan.diagnostics.hasErrors {
            let first = change.plan.diagnostics.first { $0.severity == .error }
            throw PlanInFull("its plan is refused (\(first.map { Failure.plain($0.message) } ?? "an error"))")
        }
        let applied = try await applyChanges(change, output: output)
        var outcome = ChangedDevicesOutcome(
            summary: applied.summary, managedMemberships: applied.state.managedMemberships)
        // A batch with failures leaves `warm` as it was: the next reconcile reads everything.
        guard !(applied.summary?.hasUnexpectedFailures ?? false) else { return outcome }
        warm.commit(change, state: applied.state)
        if !applied.dead.isEmpty { outcome.deadTokens = try await writeBackDead(applied.dead, to: nil) }
        return outcome
    }
}

extension ApplyOutcome {
    /// The summary of the plan this apply carried out, if it ran one.
    public var applied: ApplySummary? {
        if case .applied(let summary) = result { summary } else { nil }
    }
}

extension ApplyOutcome.Result {
    /// Whether the dead devices found are reported (to --dead-tokens and the sources' hooks): not
    /// after a declined apply, nor when only an interrupted one was finished.
    public var reportsDead: Bool {
        switch self {
        case .applied, .nothingToDo, .refreshed: true
        case .declined, .resumedOnly: false
        }
    }
}
