import Foundation
import Synchronization
import TidemarkCore
import TidemarkRuntime

/// One reconcile of one workspace: the same runtime, workflows, journal, refresh modes and rails as
/// `tidemark apply`, chosen by the workspace's `drift` and `on_change` settings.
///
/// | drift \ on_change | apply | plan |
/// |---|---|---|
/// | heal | drift report, then `apply` (reads FCM as `refresh` says, so drift is corrected with the changes) | drift report; `apply --drift-only` when drift was found; changes planned, waiting |
/// | warn | drift report; `apply --no-refresh` (changes only) | drift report; changes planned, waiting |
/// | off | `apply --no-refresh` | changes planned, waiting |
///
/// The runtime is loaded again for every reconcile, so edits of tidemark.yaml, the manifests and the
/// inventory are read each time, and nothing of one reconcile is held into the next.
public struct Reconciler: Sendable {
    /// Builds the runtime of one reconcile (reads tidemark.yaml; throws its errors), with its manifests
    /// in the directory given when they were fetched from git.
    public var load: @Sendable (_ manifests: String?) throws -> Runtime
    /// Where the manifests are fetched from before each reconcile, when they come from git.
    public var source: GitManifests?
    /// What the workspace may do on its own.
    public var settings: ServeSettings
    /// Where the workflows' diagnostics and progress go (the log), besides what the result keeps.
    public var log: @Sendable (String) -> Void
    /// The clock a reconcile is stamped and timed by.
    public var timing: Timing

    /// A reconciler that builds its runtime with `load` and acts as `settings` allow.
    public init(
        load: @escaping @Sendable (_ manifests: String?) throws -> Runtime, settings: ServeSettings,
        source: GitManifests? = nil, log: @escaping @Sendable (String) -> Void = { _ in }, timing: Timing = .live
    ) {
        self.load = load
        self.source = source
        self.settings = settings
        self.log = log
        self.timing = timing
    }

    /// Runs one reconcile; never throws: an error is a `failure` result naming its reason, a rail's
    /// refusal a `blocked` one.
    public func reconcile() async -> ReconcileResult {
        let start = timing.now()
        let output = CollectingOutput(log: log)
        var result = ReconcileResult(outcome: .success, startedAt: timing.wallClock(), seconds: 0)
        do {
            var manifests: String?
            if let source {
                let fetched = try await source.fetch()
                result.commit = fetched.commit
                manifests = fetched.directory
            }
            let runtime = try load(manifests)
            try await run(runtime, output: output, into: &result)
        } catch {
            let failure = Failure(error)
            let rails = output.rails
            if let rail = rails.first {
                result.outcome = .blocked
                result.reason = rail.code
                result.message = rails.map(\.message).joined(separator: " ")
            } else if Self.blockingReasons.contains(failure.reason) {
                result.outcome = .blocked
                result.reason = failure.reason
                result.message = Self.plain(failure.message)
            } else {
                result.outcome = .failure
                result.reason = failure.reason
                let diagnostics = output.errors.map(\.description)
                result.message = ([Self.plain(failure.message)] + diagnostics).joined(separator: " ")
            }
        }
        result.readRequests = output.planReads
        result.deadlines = output.deadlines
        result.seconds = Timing.seconds(timing.now() - start)
        return result
    }

    /// Errors that are a guard refusing a plan rather than something broken: the workspace is blocked.
    static let blockingReasons: Set<String> = ["inventory_shrank", "too_many_dead"]

    /// A message without its `error: ` prefix (the status and the log say what it is).
    static func plain(_ message: String) -> String {
        message.hasPrefix("error: ") ? String(message.dropFirst("error: ".count)) : message
    }

    /// The settings this reconcile runs with: outside the sync windows, changes are only planned
    /// (`on_change: plan`) and drift only reported, unless `heal_outside_windows`; `result` says so.
    public func effectiveSettings(at now: Date, into result: inout ReconcileResult) -> ServeSettings {
        var settings = self.settings
        guard !settings.windows.isEmpty, !ServeWindow.allowChanges(settings.windows, at: now) else { return settings }
        result.windowClosed = true
        result.windowOpensAt = ServeWindow.nextAllowed(settings.windows, after: now)
        settings.onChange = .plan
        if settings.drift == .heal, !settings.healOutsideWindows { settings.drift = .warn }
        return settings
    }

    private func run(_ runtime: Runtime, output: CollectingOutput, into result: inout ReconcileResult) async throws {
        let settings = effectiveSettings(at: timing.wallClock(), into: &result)
        let policy = runtime.settings.refresh
        let limit = settings.maxUnsubscribes ?? runtime.settings.maxUnsubscribes
        let readsFCM = policy.mode != .none
        if settings.drift != .off, readsFCM {
            do {
                let report = try await runtime.drift(policy, output: output)
                var counts: [String: Int] = [:]
                for kind in DriftReport.Kind.allCases { counts[kind.rawValue] = report.count(kind) }
                result.drift = counts
                result.driftChecked = report.registrationsRead
            } catch let error as WorkflowError where error.reason == "no_state" {
                // Nothing applied yet: nothing to drift from. The first apply reads what it needs.
            }
        }
        switch settings.onChange {
        case .apply:
            var planning = PlanRequest(policy: policy, maxUnsubscribes: limit)
            if settings.drift != .heal { planning.refresh.mode = .none }
            try await apply(runtime, planning, output: output, into: &result)
            result.driftHealed = settings.drift == .heal && result.driftFound > 0
        case .plan:
            if settings.drift == .heal, result.driftFound > 0 {
                let planning = PlanRequest(policy: policy, maxUnsubscribes: limit, driftOnly: true)
                try await apply(runtime, planning, output: output, into: &result)
                result.driftHealed = true
            }
            var waiting = PlanRequest(policy: policy, maxUnsubscribes: limit)
            waiting.refresh.mode = .none
            let planned = try await runtime.plan(waiting, output: output)
            output.planned(planned.plan)
            result.managedMemberships = planned.state.managedMemberships
            result.changesWaiting = planned.plan.operations.count
            if planned.plan.diagnostics.hasErrors { throw WorkflowError.planHasErrors }
        }
    }

    private func apply(
        _ runtime: Runtime, _ planning: PlanRequest, output: CollectingOutput, into result: inout ReconcileResult
    ) async throws {
        let settings = self.settings
        var request = ApplyRequest(
            planning: planning, approve: { _ in .approved },
            planReady: { outcome in output.planned(outcome.plan) },
            approveResume: { _ in .approved })
        request.pruneAfter = runtime.settings.pruneAfter
        let outcome = try await runtime.apply(request, output: output)
        if let managed = outcome.managedMemberships { result.managedMemberships = managed }
        if outcome.applied != nil || outcome.resumed != nil {
            do {
                let trimmed = try await runtime.stateStore().trimHistory(keep: settings.historyKeep)
                if trimmed > 0 {
                    log(
                        "workspace=\(runtime.workspaceName) apply history trimmed: \(PlanRenderer.counted(trimmed, "older apply", plural: "older applies")) deleted (history_keep: \(settings.historyKeep))"
                    )
                }
            } catch {
                log(
                    "workspace=\(runtime.workspaceName) the apply history could not be trimmed (history_keep): \(Self.plain(Failure(error).message))"
                )
            }
        }
        for summary in [outcome.resumed, outcome.applied].compactMap({ $0 }) {
            result.subscribed += summary.subscribed
            result.unsubscribed += summary.unsubscribed
            result.groupCalls += summary.groupCalls
            result.writeRequests += summary.requests
        }
        if outcome.hasUnexpectedFailures {
            let failures = [outcome.resumed, outcome.applied].compactMap { $0 }.flatMap(\.failures)
                .filter { !$0.error.meansUnregistered }
            throw ReconcileError(
                reason: "token_failures",
                description:
                    "\(PlanRenderer.counted(failures.count, "token change")) failed (\(Set(failures.map { $0.error.code.rawValue }).sorted().joined(separator: ", "))); the next reconcile tries them again."
            )
        }
        if !outcome.dead.isEmpty {
            let report = try await runtime.writeBackDead(outcome.dead, to: nil)
            if !report.failures.isEmpty {
                log("reporting dead tokens failed: \(report.failures.joined(separator: "; "))")
            }
        }
    }
}

/// A reconcile that finished with something only `serve` words: tokens FCM would not change.
struct ReconcileError: TidemarkError {
    var reason: String
    var description: String
}

extension ApplyOutcome {
    /// The summary of the plan this apply carried out, if it ran one.
    var applied: ApplySummary? {
        if case .applied(let summary) = result { summary } else { nil }
    }
}

/// Keeps what a reconcile's workflows report that its result needs (the rails that refused the plan,
/// the errors, the requests the plan read), and logs the rest.
final class CollectingOutput: WorkflowOutput {
    private struct Collected {
        var errors: [Diagnostic] = []
        var deadlines: [ReconcileResult.Notice] = []
        var planReads = 0

        mutating func add(_ diagnostics: [Diagnostic]) {
            errors += diagnostics.filter { $0.severity == .error }
            for diagnostic in diagnostics where diagnostic.severity == .warning {
                guard let code = diagnostic.code, code.hasPrefix("deadline."),
                    !deadlines.contains(where: { $0.code == code })
                else { continue }
                deadlines.append(ReconcileResult.Notice(code: code, message: diagnostic.message))
            }
        }
    }
    private let collected = Mutex(Collected())
    private let log: @Sendable (String) -> Void

    init(log: @escaping @Sendable (String) -> Void) { self.log = log }

    /// Error diagnostics reported so far.
    var errors: [Diagnostic] { collected.withLock { $0.errors } }
    /// The errors that are rails (`rail.…` codes).
    var rails: [(code: String, message: String)] {
        errors.compactMap { diagnostic in
            guard let code = diagnostic.code, code.hasPrefix("rail.") else { return nil }
            let location = diagnostic.location.map { "\($0): " } ?? ""
            return (code, location + diagnostic.message)
        }
    }
    /// Requests the plans read from FCM.
    var planReads: Int { collected.withLock { $0.planReads } }
    /// The FCM deadlines warned of, once each.
    var deadlines: [ReconcileResult.Notice] { collected.withLock { $0.deadlines } }

    func planned(_ plan: Plan) {
        collected.withLock {
            $0.planReads += plan.reads ?? 0
            $0.add(plan.diagnostics)
        }
        for diagnostic in plan.diagnostics where diagnostic.severity == .error { log(diagnostic.description) }
    }

    func emit(_ event: WorkflowEvent) {
        switch event {
        case .diagnostics(let diagnostics):
            collected.withLock { $0.add(diagnostics) }
            for diagnostic in diagnostics { log(diagnostic.description) }
        case .retrying(let notice):
            log(
                "\(notice.call) is being retried (attempt \(notice.attempt), \(Int(notice.waited)) s so far): \(notice.cause); check \(notice.setting)"
            )
        case .abandoned(let startedAt):
            log("an interrupted apply started at \(startedAt) was abandoned: the manifests or backend changed since")
        case .resuming(_, let done, let total):
            log("finishing an interrupted apply (\(done) of \(total) operations were done)")
        default:
            break
        }
    }
}
