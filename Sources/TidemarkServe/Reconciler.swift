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
    /// Whether the workspace follows its inventory's changes: a whole reconcile then keeps what it
    /// read in memory (`WarmPlan`), and a batch of changed devices is planned from it on its own.
    public var followsChanges = false
    /// What the last whole reconcile left for the batches; shared by the copies of this reconciler,
    /// and new with every reconciler (settings reloaded start from a whole reconcile).
    let warm = WarmCache()

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
    /// refusal a `blocked` one. When `changes` are changed devices of one source only, the last
    /// whole reconcile left its reading in memory and `whole` is false, those devices are planned on
    /// their own; otherwise (a resync that is due passes `whole`), and whenever a batch cannot be (the
    /// log says why), the whole inventory is.
    ///
    /// `arriving` says which devices were reported changed since `changes` were taken: a resync leaves
    /// them out of its comparison (their change may have been in the whole read before it was reported).
    public func reconcile(
        changes: PendingChanges = PendingChanges(), whole: Bool = false,
        arriving: @escaping @Sendable () -> Set<String> = { [] }
    ) async -> ReconcileResult {
        if !whole, let batch = changes.batch, let result = await reconcileBatch(batch) { return result }
        return await reconcileWhole(changes: changes, arriving: arriving)
    }

    private func reconcileWhole(
        changes: PendingChanges, arriving: @Sendable () -> Set<String>
    ) async -> ReconcileResult {
        let start = timing.now()
        let output = CollectingOutput(log: log)
        var result = ReconcileResult(outcome: .success, startedAt: timing.wallClock(), seconds: 0)
        // What the batches since the last whole reconcile built, compared with this whole read.
        let previous = warm.take()
        do {
            var manifests: String?
            if let source {
                let fetched = try await source.fetch()
                result.commit = fetched.commit
                manifests = fetched.directory
            }
            let runtime = try load(manifests)
            // The tokens this read finds unchanged keep the strings the last one made (see StringReuse).
            let settled = try await StringReuse.$current.withValue(previous.map { StringReuse($0.plan.state.tokens) }) {
                try await run(runtime, output: output, into: &result)
            }
            if followsChanges, let settled {
                if let previous, previous.filesDigest == settled.loaded.filesDigest, changes.fullReads.isEmpty,
                    changes.rereads.isEmpty
                {
                    let pending = Set(changes.devices.values.flatMap { $0 })
                    var diverged = Self.divergences(
                        previous.plan, settled.loaded, table: settled.state.tokens.table, pending: pending)
                    if !diverged.isEmpty {
                        // A change committed just before the whole read may be reported only now: wait
                        // until the follower polled once since the read began, and leave those out.
                        let settledBy = start + ChangeFollower.poll + .milliseconds(500)
                        if timing.now() < settledBy { try? await timing.sleep(settledBy - timing.now()) }
                        let reported = arriving()
                        diverged.removeAll { reported.contains($0) }
                    }
                    result.divergences = diverged.count
                    if !diverged.isEmpty {
                        let named = diverged.prefix(10).joined(separator: ", ")
                        log(
                            "workspace=\(runtime.workspaceName) resync: \(PlanRenderer.counted(diverged.count, "device")) (\(named)\(diverged.count > 10 ? ", …" : "")) had memberships the batches of changed devices had not brought to what the whole read says; this reconcile corrected them. A change the cursor passed over (a late commit) or a defect: please report it with this line"
                        )
                    }
                }
                warm.put(
                    WarmCache.Entry(
                        plan: WarmPlan(
                            loaded: settled.loaded, state: settled.state, files: runtime.manifestSource().files,
                            tokenFileBytes: runtime.settings.limits.tokenFileBytes,
                            shrinkGuard: runtime.resolved.shrinkGuard, sharingTokens: previous == nil),
                        manifests: manifests, filesDigest: settled.loaded.filesDigest))
            }
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

    /// Plans and applies the batch's devices on their own, from what the last whole reconcile left;
    /// nil when they must be planned with the whole inventory (logged, with why).
    private func reconcileBatch(_ batch: (source: String, ids: [String])) async -> ReconcileResult? {
        guard var entry = warm.take() else { return nil }
        let start = timing.now()
        var result = ReconcileResult(outcome: .success, startedAt: timing.wallClock(), seconds: 0)
        let settings = effectiveSettings(at: timing.wallClock(), into: &result)
        // Outside the sync windows, or with on_change: plan, the whole reconcile says what waits.
        guard settings.onChange == .apply else { return nil }
        let output = CollectingOutput(log: log)
        var name = "-"
        do {
            let runtime = try load(entry.manifests)
            name = runtime.workspaceName
            guard let (rows, problems) = try await runtime.readDevices(batch.ids, of: batch.source) else {
                throw PlanInFull("'\(batch.source)' is not a PostgreSQL source of tidemark.yaml")
            }
            if let problem = problems.first(where: { $0.severity == .error }) {
                throw PlanInFull("a changed row has a problem: \(problem.description)")
            }
            guard let backend = entry.plan.state.backend else { throw PlanInFull("state records no backend yet") }
            let planner = Planner(
                differ: Differ(groupsTurnedDown: runtime.deadlines.groupsTurnedDown), tidemarkVersion: Runtime.version)
            let change = try entry.plan.planChanges(
                devices: batch.ids, rows: rows, source: ConfiguredSource.display(batch.source), planner: planner,
                backend: backend, now: timing.wallClock(),
                maxUnsubscribes: settings.maxUnsubscribes ?? runtime.settings.maxUnsubscribes)
            if change.plan.diagnostics.hasErrors {
                let first = change.plan.diagnostics.first { $0.severity == .error }
                throw PlanInFull("its plan is refused (\(first.map { Self.plain($0.message) } ?? "an error"))")
            }
            let applied = try await runtime.applyChanges(change, output: output)
            result.changedDevices = batch.ids.count
            result.managedMemberships = applied.state.managedMemberships
            if let summary = applied.summary {
                result.subscribed = summary.subscribed
                result.unsubscribed = summary.unsubscribed
                result.writeRequests = summary.requests
                if summary.hasUnexpectedFailures {
                    // State holds what was done; the next reconcile reads everything and tries the rest.
                    let error = ReconcileError.tokenFailures(summary.failures)
                    result.outcome = .failure
                    result.reason = error.reason
                    result.message = error.description
                    result.seconds = Timing.seconds(timing.now() - start)
                    return result
                }
            }
            entry.plan.commit(change, state: applied.state)
            warm.put(entry)
            if !applied.dead.isEmpty {
                let report = try await runtime.writeBackDead(applied.dead, to: nil)
                if !report.failures.isEmpty {
                    log("reporting dead tokens failed: \(report.failures.joined(separator: "; "))")
                }
            }
        } catch let full as PlanInFull {
            log(
                "workspace=\(name) \(PlanRenderer.counted(batch.ids.count, "changed device")) of '\(batch.source)' planned with the whole inventory: \(full.description)"
            )
            return nil
        } catch {
            let message = Self.plain(Failure(error).message)
            if Task.isShuttingDownGracefully || Task.isCancelled {
                result.outcome = .failure
                result.reason = Failure(error).reason
                result.message = message
                result.seconds = Timing.seconds(timing.now() - start)
                return result
            }
            log(
                "workspace=\(name) a batch of \(PlanRenderer.counted(batch.ids.count, "changed device")) failed (\(message)); planning with the whole inventory"
            )
            return nil
        }
        result.seconds = Timing.seconds(timing.now() - start)
        return result
    }

    /// The devices of `loaded` (a whole read, resolved into `table`) whose topic memberships differ
    /// from what `warm` (the batches since the last whole read) built, leaving out `pending` (changes
    /// not yet planned); sorted. Only topics whose digests differ are compared token by token.
    static func divergences(
        _ warm: WarmPlan, _ loaded: LoadedManifests, table: TokenTable, pending: Set<String>
    )
        -> [String]
    {
        let warmTable = warm.state.tokens.table
        let built = warm.desired.digests(tokens: warmTable).entries
        let before = Dictionary(warm.desired.topics.map { ($0.name, $0) }, uniquingKeysWith: { a, _ in a })
        var devices = Set<String>()
        for topic in loaded.desired.topics {
            let key = State.versionKey(.topic, topic.name)
            guard built[key] != loaded.entryDigests[key] else { continue }
            let was = Set((before[topic.name]?.members ?? TokenSet()).map { warmTable[$0] })
            let now = Set(topic.members.map { table[$0] })
            for token in was.symmetricDifference(now) {
                let device =
                    loaded.inventory.index(ofToken: token).map { loaded.inventory.deviceIDs[$0] }
                    ?? warm.device(holding: token) ?? "token \(Redaction.redact(token))"
                if !pending.contains(device) { devices.insert(device) }
            }
        }
        return devices.sorted()
    }

    /// Runs the whole reconcile; returns what its apply settled, when a whole plan was carried out
    /// (what a `WarmPlan` starts from).
    private func run(
        _ runtime: Runtime, output: CollectingOutput, into result: inout ReconcileResult
    ) async throws -> ApplyOutcome.Settled? {
        let settings = effectiveSettings(at: timing.wallClock(), into: &result)
        var settled: ApplyOutcome.Settled?
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
            settled = try await apply(runtime, planning, output: output, into: &result)
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
        return settled
    }

    @discardableResult
    private func apply(
        _ runtime: Runtime, _ planning: PlanRequest, output: CollectingOutput, into result: inout ReconcileResult
    ) async throws -> ApplyOutcome.Settled? {
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
            throw ReconcileError.tokenFailures(
                [outcome.resumed, outcome.applied].compactMap { $0 }.flatMap(\.failures))
        }
        if !outcome.dead.isEmpty {
            let report = try await runtime.writeBackDead(outcome.dead, to: nil)
            if !report.failures.isEmpty {
                log("reporting dead tokens failed: \(report.failures.joined(separator: "; "))")
            }
        }
        return outcome.settled
    }
}

/// What the last whole reconcile left in memory for the batches of changed devices.
final class WarmCache: Sendable {
    /// A whole reading and where its manifests were.
    struct Entry: Sendable {
        /// The manifests, inventory, desired state and state, as the batches since have left them.
        var plan: WarmPlan
        /// The manifests directory of a git checkout; nil for the project's own.
        var manifests: String?
        /// The manifest files' digest when read (a resync compares only readings of the same files).
        var filesDigest: String
    }

    private let entry = Mutex<Entry?>(nil)

    /// Takes the entry out (a batch puts it back once applied; a failed one leaves none).
    func take() -> Entry? {
        entry.withLock { taken in
            defer { taken = nil }
            return taken
        }
    }
    /// Puts an entry in.
    func put(_ new: Entry) { entry.withLock { $0 = new } }
}

/// A reconcile that finished with something only `serve` words: tokens FCM would not change.
struct ReconcileError: TidemarkError {
    var reason: String
    var description: String

    /// Tokens FCM would not change for a reason other than being unregistered, of `failures`.
    static func tokenFailures(_ failures: [TokenFailure]) -> ReconcileError {
        let failed = failures.filter { !$0.error.meansUnregistered }
        let codes = Set(failed.map { $0.error.code.rawValue }).sorted().joined(separator: ", ")
        return ReconcileError(
            reason: "token_failures",
            description:
                "\(PlanRenderer.counted(failed.count, "token change")) failed (\(codes)); the next reconcile tries them again."
        )
    }
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
        for diagnostic in plan.diagnostics.filter({ $0.severity == .error }).condensed() {
            log(diagnostic.description)
        }
    }

    func emit(_ event: WorkflowEvent) {
        switch event {
        case .diagnostics(let diagnostics):
            collected.withLock { $0.add(diagnostics) }
            for diagnostic in diagnostics.condensed() { log(diagnostic.description) }
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
