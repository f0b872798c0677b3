import Foundation
import Synchronization
import TidemarkCore
import TidemarkRuntime

/// One reconcile of one workspace, as the runtime's reconcile use case does it (`Runtime.reconcile`:
/// the same workflows, journal, refresh modes and rails as `tidemark apply`), chosen by the
/// workspace's `drift` and `on_change` settings and the sync windows' state its machine found when it
/// started the reconcile (`SyncWindow`); or a batch of changed devices
/// planned on their own from what the last whole reconcile read (`Runtime.reconcileChanges`).
///
/// The runtime is the workspace's one runtime, loaded when `serve` starts and again when its settings
/// are reloaded: the manifests and the inventory are read at every reconcile; tidemark.yaml (and the
/// inventory file it names) only when they changed, which each reconcile checks first, so an edit of
/// tidemark.yaml made with one of the manifests is never reconciled with the settings from before it.
/// Its state store is the one connection the workspace keeps.
public struct Reconciler: Sendable {
    /// The workspace's runtime (its settings and its state store), as last loaded.
    public var runtime: Runtime { current.now.runtime }
    /// Where the manifests are fetched from before each reconcile, when they come from git.
    public var source: GitManifests?
    /// What the workspace may do on its own, as last loaded.
    public var settings: ServeSettings { current.now.settings }
    /// Where the workflows' diagnostics and progress go (the log), besides what the result keeps.
    public var log: ServeLog
    /// The clock a reconcile is stamped and timed by.
    public var timing: Timing
    /// Whether the workspace follows its inventory's changes: a whole reconcile then keeps what it
    /// read in memory (`WarmPlan`), and a batch of changed devices is planned from it on its own.
    public var followsChanges = false
    /// Told of the reconcile's progress and of every attempt of its requests to FCM (set by the
    /// runner for each reconcile); nil: nobody.
    public var watch: ReconcileWatch?
    /// Told of every attempt of the reconcile's requests to FCM (the metrics); nil: nobody.
    public var attempts: FCMAttemptObserver?
    /// Told, when the manifests come from git, of the commit each reconcile fetched and the runtime
    /// that reads its checkout (serve's warning of workspaces that declare one topic); nil: nobody.
    public var fetched: (@Sendable (Runtime, String) -> Void)?
    /// What the last whole reconcile left for the batches; shared by the copies of this reconciler,
    /// and new with every reconciler (settings reloaded start from a whole reconcile).
    let warm = WarmCache()
    /// The runtime and settings as last loaded; shared by the copies of this reconciler.
    private let current: CurrentRuntime

    /// A reconciler of the workspace of `runtime` that acts as `settings` allow. With `reload`, a
    /// reconcile that finds tidemark.yaml (or the inventory file it names) changed since the runtime
    /// was loaded loads both again first; a file that no longer loads fails the reconcile, naming it.
    public init(
        runtime: Runtime, settings: ServeSettings, source: GitManifests? = nil,
        reload: (@Sendable () throws -> (runtime: Runtime, settings: ServeSettings))? = nil,
        log: ServeLog = .none, timing: Timing = .live
    ) {
        current = CurrentRuntime(runtime: runtime, settings: settings, reload: reload)
        self.source = source
        self.log = log
        self.timing = timing
    }

    /// Runs one reconcile; never throws: an error is a `failure` result naming its reason, a rail's
    /// refusal a `blocked` one. When `changes` are changed devices of one source only, the last
    /// whole reconcile left its reading in memory and `whole` is false, those devices are planned on
    /// their own; otherwise (a resync that is due passes `whole`), and whenever a batch cannot be (the
    /// log says why), the whole inventory is.
    ///
    /// `window` is the sync windows' state the workspace's machine found when it started the reconcile:
    /// while closed, changes are only planned (`effective(_:window:into:)`).
    ///
    /// `arriving` says which devices were reported changed since `changes` were taken: a resync leaves
    /// them out of its comparison (their change may have been in the whole read before it was reported).
    public func reconcile(
        changes: PendingChanges = PendingChanges(), whole: Bool = false, window: SyncWindow = .open,
        arriving: @escaping @Sendable () -> Set<String> = { [] }
    ) async -> ReconcileResult {
        if !whole, window.isOpen, let batch = changes.batch, let result = await reconcileBatch(batch) {
            return result
        }
        return await reconcileWhole(changes: changes, window: window, arriving: arriving)
    }

    private func reconcileWhole(
        changes: PendingChanges, window: SyncWindow, arriving: @Sendable () -> Set<String>
    ) async -> ReconcileResult {
        let start = timing.now()
        let output = CollectingOutput(log: log, watch: watch)
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
            let (loaded, settings) = try current.fresh()
            let reading = manifests.map { loaded.reading(manifests: $0) } ?? loaded
            if manifests != nil, let commit = result.commit { fetched?(reading, commit) }
            let runtime = observed(reading)
            // The tokens this read finds unchanged keep the strings the last one made (see StringReuse).
            let settled = try await StringReuse.$current.withValue(previous.map { StringReuse($0.plan.state.tokens) }) {
                try await run(
                    runtime, Self.effective(settings, window: window, into: &result), output: output, into: &result)
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
                        log.warning(
                            "workspace=\(runtime.workspaceName) resync: \(PlanRenderer.counted(diverged.count, "device")) (\(named)\(diverged.count > 10 ? ", …" : "")) had memberships the batches of changed devices had not brought to what the whole read says; this reconcile corrected them. A change the cursor passed over (a late commit) or a defect: please report it with this line"
                        )
                    }
                }
                warm.put(
                    WarmCache.Entry(
                        plan: WarmPlan(
                            loaded: settled.loaded, state: settled.state, files: runtime.manifestSource().files,
                            tokenFileBytes: runtime.settings.limits.tokenFileBytes,
                            shrinkGuard: runtime.resolved.shrinkGuard, sharingTokens: previous == nil,
                            held: settled.held),
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
                result.reason = failure.reason.rawValue
                result.message = failure.plainMessage
            } else {
                result.outcome = .failure
                result.reason = failure.reason.rawValue
                let diagnostics = output.errors.map(\.description)
                result.message = ([failure.plainMessage] + diagnostics).joined(separator: " ")
            }
        }
        result.readRequests = output.planReads
        result.deadlines = output.deadlines
        result.held = output.held
        // The apply's plan read FCM after the drift check: its coverage is the latest.
        if let coverage = output.coverage { result.sweep = ReconcileResult.Sweep(coverage) }
        result.seconds = Timing.seconds(timing.now() - start)
        return result
    }

    /// `runtime` with its requests to FCM told to the watch and the metrics.
    private func observed(_ runtime: Runtime) -> Runtime {
        guard watch != nil || attempts != nil else { return runtime }
        var runtime = runtime
        let (watch, attempts) = (self.watch, self.attempts)
        runtime.fcmObserver = { attempt in
            attempts?(attempt)
            watch?.observe(attempt)
        }
        return runtime
    }

    /// How long a whole reconcile waits for the state lock another run holds (a person's `tidemark
    /// apply`) before it fails with `state_locked`; the next try comes after `retry_interval`.
    static let lockWait = Duration.seconds(120)

    /// Errors that are a guard refusing a plan rather than something broken: the workspace is blocked.
    static let blockingReasons: Set<FailureReason> = [.inventoryShrank, .tooManyDead]

    /// `settings` as `window` leaves them: while it is closed, changes are only planned
    /// (`on_change: plan`) and drift only reported, unless `heal_outside_windows`; `result` says so.
    public static func effective(
        _ settings: ServeSettings, window: SyncWindow, into result: inout ReconcileResult
    ) -> ServeSettings {
        guard case .closed(let opensAt) = window else { return settings }
        var settings = settings
        result.windowClosed = true
        result.windowOpensAt = opensAt
        settings.onChange = .plan
        if settings.drift == .heal, !settings.healOutsideWindows { settings.drift = .warn }
        return settings
    }

    /// Plans and applies the batch's devices on their own, from what the last whole reconcile left;
    /// nil when they must be planned with the whole inventory (logged, with why).
    private func reconcileBatch(_ batch: (source: String, ids: [String])) async -> ReconcileResult? {
        // Settings changed since the last whole reconcile: the whole reconcile loads them again.
        guard !current.now.runtime.settingsChanged(), var entry = warm.take() else { return nil }
        let start = timing.now()
        var result = ReconcileResult(outcome: .success, startedAt: timing.wallClock(), seconds: 0)
        let settings = self.settings
        // With on_change: plan, the whole reconcile says what waits (the machine asks for it).
        guard settings.onChange == .apply else {
            warm.put(entry)
            return nil
        }
        let output = CollectingOutput(log: log, watch: watch)
        let runtime = observed(entry.manifests.map { self.runtime.reading(manifests: $0) } ?? self.runtime)
        let name = runtime.workspaceName
        do {
            let applied = try await runtime.reconcileChanges(
                batch.ids, of: batch.source, from: &entry.plan, maxUnsubscribes: settings.maxUnsubscribes,
                output: output)
            result.changedDevices = batch.ids.count
            result.managedMemberships = applied.managedMemberships
            // What the whole plan held still waits: a batch leaves it out too.
            result.held = entry.plan.held
            if let summary = applied.summary {
                result.subscribed = summary.subscribed
                result.unsubscribed = summary.unsubscribed
                result.writeRequests = summary.requests
                if summary.hasUnexpectedFailures {
                    // State holds what was done; the next reconcile reads everything and tries the rest.
                    let error = ReconcileError.tokenFailures(summary.failures)
                    result.outcome = .failure
                    result.reason = error.reason.rawValue
                    result.message = error.description
                    result.seconds = Timing.seconds(timing.now() - start)
                    return result
                }
            }
            warm.put(entry)
            logDeadTokenFailures(applied.deadTokens)
        } catch let full as PlanInFull {
            log(
                "workspace=\(name) \(PlanRenderer.counted(batch.ids.count, "changed device")) of '\(batch.source)' planned with the whole inventory: \(full.description)"
            )
            return nil
        } catch {
            let failure = Failure(error)
            if Task.isShuttingDownGracefully || Task.isCancelled {
                result.outcome = .failure
                result.reason = failure.reason.rawValue
                result.message = failure.plainMessage
                result.seconds = Timing.seconds(timing.now() - start)
                return result
            }
            log.warning(
                "workspace=\(name) a batch of \(PlanRenderer.counted(batch.ids.count, "changed device")) failed (\(failure.plainMessage)); planning with the whole inventory"
            )
            return nil
        }
        result.seconds = Timing.seconds(timing.now() - start)
        return result
    }

    /// Logs the hooks that could not be told of dead tokens (the reconcile itself went through).
    private func logDeadTokenFailures(_ report: DeadTokenWriteBack.Report?) {
        guard let report, !report.failures.isEmpty else { return }
        log.warning("reporting dead tokens failed: \(report.failures.joined(separator: "; "))")
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

    /// Runs the whole reconcile (`Runtime.reconcile`); returns what its apply settled, when a whole
    /// plan was carried out (what a `WarmPlan` starts from).
    private func run(
        _ runtime: Runtime, _ settings: ServeSettings, output: CollectingOutput, into result: inout ReconcileResult
    ) async throws -> ApplyOutcome.Settled? {
        var request = ReconcileRequest(settings, planReady: { output.planned($0) })
        // A person's apply (the way out of 'blocked') is waited for, not failed on.
        request.lockWait = Timing.seconds(Self.lockWait)
        var outcome = ReconcileOutcome()
        defer { Self.record(outcome, into: &result) }
        try await runtime.reconcile(request, output: output, into: &outcome)
        if outcome.historyTrimmed > 0 {
            log(
                "workspace=\(runtime.workspaceName) apply history trimmed: \(PlanRenderer.counted(outcome.historyTrimmed, "older apply", plural: "older applies")) deleted (history_keep: \(settings.historyKeep))"
            )
        }
        if let failure = outcome.historyTrimFailure {
            log.warning(
                "workspace=\(runtime.workspaceName) the apply history could not be trimmed (history_keep): \(failure.plainMessage)"
            )
        }
        logDeadTokenFailures(outcome.deadTokens)
        if outcome.hasUnexpectedFailures { throw ReconcileError.tokenFailures(outcome.applied.flatMap(\.failures)) }
        return outcome.settled
    }

    /// What the reconcile did, in its result (also when it threw part way).
    private static func record(_ outcome: ReconcileOutcome, into result: inout ReconcileResult) {
        result.drift = outcome.drift
        result.driftChecked = outcome.driftChecked
        if let coverage = outcome.driftCoverage { result.sweep = ReconcileResult.Sweep(coverage) }
        result.driftHealed = outcome.driftHealed
        result.changesWaiting = outcome.changesWaiting
        if let managed = outcome.managedMemberships { result.managedMemberships = managed }
        result.subscribed = outcome.subscribed
        result.unsubscribed = outcome.unsubscribed
        result.groupCalls = outcome.groupCalls
        result.writeRequests = outcome.writeRequests
    }
}

/// A workspace's runtime and settings as last loaded, loaded again when the settings files changed.
final class CurrentRuntime: Sendable {
    private let state: Mutex<(runtime: Runtime, settings: ServeSettings)>
    private let reload: (@Sendable () throws -> (runtime: Runtime, settings: ServeSettings))?

    init(
        runtime: Runtime, settings: ServeSettings,
        reload: (@Sendable () throws -> (runtime: Runtime, settings: ServeSettings))?
    ) {
        state = Mutex((runtime, settings))
        self.reload = reload
    }

    /// As last loaded.
    var now: (runtime: Runtime, settings: ServeSettings) { state.withLock { $0 } }

    /// As the settings files say now: loaded again when they changed since (throws the load's error,
    /// naming the file and line, and keeps what it had).
    func fresh() throws -> (runtime: Runtime, settings: ServeSettings) {
        let kept = now
        guard let reload, kept.runtime.settingsChanged() else { return kept }
        let loaded = try reload()
        state.withLock { $0 = loaded }
        return loaded
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
    var reason: FailureReason
    var description: String

    /// Tokens FCM would not change for a reason other than being unregistered, of `failures`.
    static func tokenFailures(_ failures: [TokenFailure]) -> ReconcileError {
        let failed = failures.filter { !$0.error.meansUnregistered }
        let codes = Set(failed.map { $0.error.code.rawValue }).sorted().joined(separator: ", ")
        return ReconcileError(
            reason: .tokenFailures,
            description:
                "\(PlanRenderer.counted(failed.count, "token change")) failed (\(codes)); the next reconcile tries them again."
        )
    }
}

/// Keeps what a reconcile's workflows report that its result needs (the rails that refused the plan,
/// the errors, the requests the plan read), and logs the rest.
final class CollectingOutput: WorkflowOutput {
    private struct Collected {
        var errors: [Diagnostic] = []
        var deadlines: [ReconcileResult.Notice] = []
        var planReads = 0
        var coverage: RefreshCoverage?
        var held: [HeldChange]?

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
    private let log: ServeLog
    private let watch: ReconcileWatch?

    init(log: ServeLog, watch: ReconcileWatch? = nil) {
        self.log = log
        self.watch = watch
    }

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

    /// What the last plan that read FCM covered.
    var coverage: RefreshCoverage? { collected.withLock { $0.coverage } }

    /// The topics and groups the last plan held; nil when no plan was made.
    var held: [HeldChange]? { collected.withLock { $0.held } }

    func planned(_ plan: Plan) {
        collected.withLock {
            $0.planReads += plan.reads ?? 0
            if let coverage = plan.coverage, coverage.mode != .none { $0.coverage = coverage }
            if plan.driftOnly == nil { $0.held = plan.held ?? [] }
            $0.add(plan.diagnostics)
        }
        for diagnostic in plan.diagnostics.filter({ $0.severity == .error }).condensed() {
            log.error(diagnostic.description)
        }
    }

    func emit(_ event: WorkflowEvent) {
        switch event {
        case .diagnostics(let diagnostics):
            collected.withLock { $0.add(diagnostics) }
            for diagnostic in diagnostics.condensed() {
                log(
                    diagnostic.severity == .error ? .error : diagnostic.severity == .warning ? .warning : .info,
                    diagnostic.description)
            }
        case .retrying(let notice):
            log.warning(
                "\(notice.call) is being retried (attempt \(notice.attempt), \(Int(notice.waited)) s so far): \(notice.cause); \(notice.advice)"
            )
        case .abandoned(let startedAt):
            log("an interrupted apply started at \(startedAt) was abandoned: the manifests or backend changed since")
        case .resuming(_, let done, let total):
            log("finishing an interrupted apply (\(done) of \(total) operations were done)")
        case .refreshProgress, .applyProgress:
            watch?.progressed(event)
        default:
            break
        }
    }
}
