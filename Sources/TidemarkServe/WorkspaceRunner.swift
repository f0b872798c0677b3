import CShims
import Foundation
import ServiceLifecycle
import Synchronization
import TidemarkCore
import TidemarkRuntime

/// What `/status` and `tidemark status` say of one workspace.
public struct WorkspaceStatus: Sendable, Codable, Equatable {
    /// Where the workspace is: `pending` (before its first reconcile), `reconciling`, `ready` (the
    /// last reconcile succeeded), `failing`, `blocked` (a rail refused the plan), `suspended`,
    /// `standby` (another replica owns it) or `stopped`.
    public var phase: String
    /// Whether the last reconcile succeeded.
    public var ready: Bool
    /// The workspace's name in state.
    public var workspace: String
    /// The state, as shown (never a password).
    public var state: String
    /// The manifests directory.
    public var manifests: String
    /// The backend and FCM project.
    public var backend: String
    /// The settings it runs with: `interval`, `drift`, `on_change`.
    public var settings: [String: String]
    /// Whether it is suspended.
    public var suspended: Bool
    /// The last reconcile, when one ran.
    public var last: ReconcileResult?
    /// When the last successful reconcile ended.
    public var lastSuccessAt: Date?
    /// Failures in a row (retried after `retry_interval`, doubling, at most `interval`).
    public var consecutiveFailures = 0
    /// When the next reconcile starts.
    public var nextRunAt: Date?
    /// The replica that reconciles it (host and process); in `standby`, the replica that owns it.
    public var replica: String
    /// Who suspended or resumed it last (`tidemark suspend`, `resume`), and when.
    public var suspendedBy: String?
    /// The last `tidemark reconcile` request this replica acted on, and who asked.
    public var reconcileRequestedAt: Date?
    /// Who asked for it.
    public var reconcileRequestedBy: String?
    /// The notifications sent for ongoing problems, and when (nil until an event was raised).
    public var notifications: NotifyLedger?
    /// The replica this one handed the workspace over to, to spread the workspaces (the last status
    /// it published says so); the new owner goes on with its schedule.
    public var handedOverTo: String?
    /// Device changes the inventory reported that no reconcile has started on yet (nil: no source
    /// of the workspace follows its changes).
    public var inventoryChangesWaiting: Int?
}

/// Reconciles one workspace while this replica owns it, as a service of `serve`'s service group.
///
/// Every `poll` it claims (or renews) the workspace in the state store: when another replica's claim
/// is live it stands by; when it owns it, it acts on the requests people left there (suspend,
/// resume, reconcile now), reconciles on its schedule (the first reconcile at start-up or at
/// takeover, then every `interval` plus jitter, sooner after a failure) and publishes its status for
/// `tidemark status`. During a reconcile a heartbeat renews the claim. Owning is not the state lock:
/// the apply takes that only for each reconcile. A shutdown that comes during an apply stops it
/// between journal steps, as it stops a CLI apply; then the claim is given up, so another replica
/// takes the workspace at once.
public final class WorkspaceRunner: Service, Sendable {
    /// How the runner keeps its claim and reads requests.
    public struct Ownership: Sendable {
        /// The store whose records say who owns the workspace (the workspace's state store).
        public var records: any StateStore
        /// This replica's name (`host/pid`).
        public var replica: String
        /// How long a claim lasts unless renewed: a replica that dies loses its workspaces this long
        /// after its last renewal.
        public var duration: Duration = .seconds(30)
        /// How often the claim is renewed and requests are read, between reconciles.
        public var poll: Duration = .seconds(2)
        /// How this replica spreads its workspaces with the others (one for all the runners of a
        /// `serve`); nil: one of the runner's own, which sees this workspace only.
        public var balance: ReplicaBalance?

        /// Ownership through `records` for `replica`, spread with the other replicas through `balance`.
        public init(
            records: any StateStore, replica: String, duration: Duration = .seconds(30), poll: Duration = .seconds(2),
            balance: ReplicaBalance? = nil
        ) {
            self.records = records
            self.replica = replica
            self.duration = duration
            self.poll = poll
            self.balance = balance
        }

        /// A balance for `replica` with the grace and cooldown that fit a claim of `duration` renewed
        /// every `poll`: a free workspace waits for the replica with the fewest at most three polls (and
        /// at least a third of a claim), and handovers are a third of a claim apart.
        public static func balance(
            replica: String, duration: Duration, poll: Duration, timing: Timing
        ) -> ReplicaBalance {
            ReplicaBalance(
                replica: replica, grace: max(poll * 3, duration / 3), cooldown: max(poll * 3, duration / 3),
                now: timing.now)
        }
    }

    /// The workspace's name.
    public let name: String
    /// The workspace as the balance knows it: its state and name.
    private let key: String
    private let balance: ReplicaBalance
    /// The reconciler (replaced when the settings are reloaded) and whether the runner is to stop
    /// after its current round (its workspace left tidemark.yaml).
    private let live: Mutex<(reconciler: Reconciler, retired: Bool)>
    private var reconciler: Reconciler { live.withLock { $0.reconciler } }
    private let ownership: Ownership
    private let metrics: ServeMetrics
    private let notifier: Notifier?
    private let log: @Sendable (String) -> Void
    private let current: Mutex<WorkspaceStatus>
    /// The status as last published.
    private let published = Mutex<Data?>(nil)
    /// Whether this replica owns the workspace now (what the change follower asks).
    private let owning = Mutex(false)
    /// The sources whose changes wake the reconcile (replaced when the settings are reloaded).
    private let followed: Mutex<[FollowedSource]>
    /// The files and commands whose changes wake the reconcile (replaced when the settings are reloaded).
    private let watched: Mutex<WatchedInputs>
    /// What the inventory said changed since the last reconcile started.
    private let woken = Mutex(PendingChanges())

    /// A runner for the workspace `status` describes, reconciling with `reconciler` while it owns the
    /// workspace through `ownership`; it waits, draws its jitter and stamps its times by the
    /// reconciler's `timing`; the events its reconciles raise go to `notifier`.
    public init(
        status: WorkspaceStatus, reconciler: Reconciler, ownership: Ownership, metrics: ServeMetrics,
        notifier: Notifier? = nil, followed: [FollowedSource] = [], watched: WatchedInputs = WatchedInputs(),
        log: @escaping @Sendable (String) -> Void
    ) {
        self.followed = Mutex(followed)
        self.watched = Mutex(watched)
        self.name = status.workspace
        self.key = "\(status.state) \(status.workspace)"
        self.live = Mutex((reconciler, false))
        self.ownership = ownership
        self.balance =
            ownership.balance
            ?? Ownership.balance(
                replica: ownership.replica, duration: ownership.duration, poll: ownership.poll,
                timing: reconciler.timing)
        self.metrics = metrics
        self.notifier = notifier
        self.log = log
        self.current = Mutex(status)
    }

    private var timing: Timing { reconciler.timing }

    /// The workspace's status now.
    public var status: WorkspaceStatus { current.withLock { $0 } }

    /// Reloaded settings: the next round reconciles with `reconciler`, and the status shows the
    /// settings, manifests and backend of `status` (a reconcile in flight finishes as it began).
    public func update(
        _ reconciler: Reconciler, status: WorkspaceStatus, followed: [FollowedSource] = [],
        watched: WatchedInputs = WatchedInputs()
    ) {
        live.withLock { $0.reconciler = reconciler }
        self.followed.withLock { $0 = followed }
        self.watched.withLock { $0 = watched }
        current.withLock {
            $0.settings = status.settings
            $0.manifests = status.manifests
            $0.backend = status.backend
            $0.state = status.state
            if followed.isEmpty {
                $0.inventoryChangesWaiting = nil
            } else if $0.inventoryChangesWaiting == nil {
                $0.inventoryChangesWaiting = 0
            }
        }
    }

    /// Stops the runner after its current round (a reconcile in flight finishes); it gives its claim up.
    public func retire() {
        live.withLock { $0.retired = true }
    }

    private var retired: Bool { live.withLock { $0.retired } }

    /// Reconciles while it owns the workspace, until the service group shuts down; meanwhile the
    /// changes of the sources that follow them wake it between scheduled reconciles.
    public func run() async throws {
        let follower = ChangeFollower(workspace: name, timing: timing, log: log)
        try await withThrowingDiscardingTaskGroup { group in
            group.addTask {
                await follower.run(
                    sources: { self.followed.withLock { $0 } }, inputs: { self.watched.withLock { $0 } },
                    active: { self.owning.withLock { $0 } }, wake: { self.wake($0) })
            }
            try await reconcileWhileOwned()
            group.cancelAll()
        }
    }

    /// Notes what the inventory said changed; the runner reconciles at once if it is waiting (not
    /// while it waits to retry a failure: the retry reads the changes).
    public func wake(_ change: InventoryChange) {
        let waiting = woken.withLock { woken -> Int in
            if case .fullRead(let source, _) = change { metrics.inventoryFullRead(workspace: name, source: source) }
            woken.add(change)
            return woken.deviceCount
        }
        current.withLock { $0.inventoryChangesWaiting = waiting }
        metrics.inventoryChangesWaiting(workspace: name, waiting)
    }

    /// The most changed devices a batch takes: a burst (a migration touching 100,000 rows) is
    /// drained in batches of this many, so that a batch's plan and journal, not the burst, set the
    /// memory serve needs. Large, because each batch costs a few seconds besides its sends (at a
    /// million devices, mostly saving the state of every topic it touched): at 10,000 devices that
    /// was a tenth of a burst's time; at 50,000 (minutes of sends at FCM's quota) it is a few percent.
    static let batchLimit = 50_000

    /// What woke the runner since the last reconcile started, taken: everything, or with `limit` at
    /// most that many changed devices of one source (the rest wait for the next batch, `left`).
    private func takeWoken(limit: Int? = nil) -> (taken: PendingChanges, left: Int) {
        let (taken, left) = woken.withLock { woken in
            let taken = woken.take(upTo: limit ?? 0)
            return (taken, woken.deviceCount)
        }
        current.withLock { if $0.inventoryChangesWaiting != nil { $0.inventoryChangesWaiting = left } }
        metrics.inventoryChangesWaiting(workspace: name, left)
        return (taken, left)
    }

    /// Records whether this replica owns the workspace: in its metrics, and for the change follower.
    private func lead(_ leader: Bool) {
        owning.withLock { $0 = leader }
        metrics.leader(workspace: name, leader)
    }

    private func reconcileWhileOwned() async throws {
        var generator = timing.generator
        var owned = false
        var failures = 0
        var nextRun: Duration?
        var handledRequest: Date?
        var lastProblem: String?
        var claimedAt: Duration?
        defer { lead(false) }
        while !Task.isShuttingDownGracefully, !Task.isCancelled, !retired {
            let settings = reconciler.settings
            let record: ServeRecord
            do {
                // The claim (or, standing by, the presence) is renewed every third of its duration; in
                // between, the record is only read (people's requests; a claim given up). A free
                // workspace is taken when the balance says this replica should have it.
                let (replica, duration) = (ownership.replica, ownership.duration)
                var seen: ServeRecord
                if let claimed = claimedAt, timing.now() - claimed < duration / 3 {
                    seen = try await ownership.records.serveRecord()
                } else {
                    seen = try await ownership.records.claimOwnership(replica, for: duration, take: false)
                    claimedAt = timing.now()
                }
                balance.observe(key, seen)
                if seen.owner == nil, balance.shouldTake(key) {
                    seen = try await ownership.records.claimOwnership(replica, for: duration, take: true)
                    claimedAt = timing.now()
                    balance.observe(key, seen)
                }
                record = seen
                metrics.replicas(balance.replicas.count)
                lastProblem = nil
            } catch {
                // The records live in the state store: unreachable, nothing can be reconciled either.
                let message = Reconciler.plain(Failure(error).message)
                if lastProblem != message {
                    log("workspace=\(name) cannot claim the workspace in its state store: \(message)")
                    lastProblem = message
                }
                owned = false
                lead(false)
                current.withLock {
                    $0.phase = "failing"
                    $0.ready = false
                }
                await pause(ownership.poll)
                continue
            }
            guard record.owner == ownership.replica else {
                let standing = current.withLock { ($0.phase, $0.replica) }
                if owned || standing.0 != "standby" || standing.1 != (record.owner ?? "-") {
                    if let owner = record.owner {
                        log(
                            "workspace=\(name) standby: replica \(owner) owns it; this replica takes it over when that one stops renewing its claim"
                        )
                    } else {
                        log(
                            "workspace=\(name) standby: free, left to a replica that owns fewer workspaces; this replica takes it if none has within \(ServeSettings.describe(balance.grace))"
                        )
                    }
                }
                owned = false
                lead(false)
                current.withLock {
                    $0.phase = "standby"
                    $0.replica = record.owner ?? "-"
                    $0.nextRunAt = nil
                }
                await pause(ownership.poll)
                continue
            }
            if !owned {
                owned = true
                lead(true)
                // What the previous owner sent stays sent: an ongoing problem is not told twice.
                let previous = record.status.flatMap {
                    try? WorkspaceStatus.decoder.decode(WorkspaceStatus.self, from: $0)
                }
                current.withLock {
                    $0.replica = ownership.replica
                    $0.handedOverTo = nil
                    if let ledger = previous?.notifications { $0.notifications = ledger }
                }
                // Another replica may have published since this one last did.
                published.withLock { $0 = nil }
                nextRun = nil
                // A request made before this replica owned the workspace is served by the reconcile at once.
                handledRequest = record.reconcileRequestedAt
                if let previous, previous.handedOverTo != nil {
                    // Handed over between two reconciles: nothing was left half-done, so the schedule
                    // goes on where the previous owner left it, and so does what the status says of it;
                    // a request it had not acted on yet is served at once.
                    nextRun = carryOver(previous)
                    failures = previous.consecutiveFailures
                    handledRequest = previous.reconcileRequestedAt
                    let next = previous.nextRunAt.map { ISO8601DateFormatter().string(from: $0) } ?? "now"
                    log(
                        "workspace=\(name) handed over to this replica (\(ownership.replica), claim \(record.ownerFence)) by replica \(previous.replica); next reconcile as scheduled: \(nextRun == nil ? "now" : next)"
                    )
                } else {
                    log(
                        "workspace=\(name) owned by this replica (\(ownership.replica), claim \(record.ownerFence)); reconciling now"
                    )
                }
            }
            let suspended = settings.suspend || record.suspended
            // Between two reconciles (or suspended), a workspace may go to a replica that owns fewer.
            if nextRun != nil || suspended, let target = balance.handOverTarget(key) {
                await handOver(to: target)
                owned = false
                continue
            }
            let wasSuspended = current.withLock { status -> Bool in
                let was = status.suspended
                status.suspended = suspended
                status.suspendedBy = record.suspendedBy
                return was
            }
            if suspended != wasSuspended {
                metrics.suspended(workspace: name, suspended)
                log(
                    "workspace=\(name) \(suspended ? "suspended" : "resumed")\(record.suspendedBy.map { " by \($0)" } ?? "")"
                )
            }
            if suspended {
                // Changes while suspended are not followed one by one: resuming reconciles at once.
                if !takeWoken().taken.isEmpty { nextRun = nil }
                current.withLock {
                    $0.phase = "suspended"
                    $0.nextRunAt = nil
                }
                await publish()
                await pause(ownership.poll)
                continue
            }
            var requested = false
            if let asked = record.reconcileRequestedAt, asked > (handledRequest ?? .distantPast) {
                handledRequest = asked
                requested = true
                log("workspace=\(name) reconcile requested\(record.reconcileRequestedBy.map { " by \($0)" } ?? "")")
            }
            // After a failure the retry wait holds for changes too (they are read by that retry);
            // otherwise a change starts a reconcile at once.
            let retrying = failures > 0 && nextRun.map { timing.now() < $0 } == true
            // A whole reconcile (the resync) that is due runs now, changes or not: under a steady
            // stream of changes there is always a batch waiting, and the resync would never come.
            let wholeDue = nextRun.map { timing.now() >= $0 } ?? true
            let (woke, left) = retrying ? (PendingChanges(), 0) : takeWoken(limit: wholeDue ? nil : Self.batchLimit)
            if !woke.isEmpty {
                requested = true
                log(
                    "workspace=\(name) reconcile started by the inventory: \(Self.describe(woke))\(left > 0 ? " (\(PlanRenderer.counted(left, "more device change")) waiting for the next batch)" : "")"
                )
            }
            if let due = nextRun, timing.now() < due, !requested {
                // Resumed: the phase the last reconcile left.
                current.withLock { status in
                    if status.phase == "suspended" {
                        status.phase = status.last.map { Self.phase($0.outcome) } ?? "pending"
                    }
                }
                await publish()
                await ServeWait.pause(min(ownership.poll, due - timing.now()), timing: timing) {
                    !retrying && self.woken.withLock { !$0.isEmpty }
                }
                continue
            }
            current.withLock {
                $0.phase = "reconciling"
                if requested {
                    $0.reconcileRequestedAt = record.reconcileRequestedAt
                    $0.reconcileRequestedBy = record.reconcileRequestedBy
                }
            }
            await publish()
            let result = await reconcileHoldingClaim(woke, whole: wholeDue)
            if Task.isShuttingDownGracefully, result.outcome != .success {
                // Stopped between journal steps by the shutdown: not a failure of the workspace.
                current.withLock { $0.phase = "stopped" }
                log(
                    "reconcile workspace=\(name) stopped by the shutdown: what finished is journaled, and the next owner resumes it"
                )
                break
            }
            metrics.record(workspace: name, result)
            failures = result.outcome == .failure ? failures + 1 : 0
            if result.changedDevices != nil, result.outcome == .success, let due = nextRun {
                // A batch of changed devices leaves the schedule of whole reconciles (the resync) as it was.
                current.withLock { status in
                    status.last = result
                    status.ready = true
                    status.phase = Self.phase(result.outcome)
                    status.consecutiveFailures = 0
                    status.lastSuccessAt = result.finishedAt
                }
                log(Self.line(workspace: name, result, next: max(.zero, due - timing.now())))
                notify(result)
                await publish()
                continue
            }
            var wait = settings.wait(afterFailures: failures)
            if failures == 0, let resync = followed.withLock({ $0.compactMap(\.settings.resync).min() }) {
                // A workspace that follows its changes reads everything again at least every 'resync'.
                wait = min(wait, .seconds(resync))
            }
            let jitterMilliseconds = Int64(Timing.seconds(settings.jitter) * 1000)
            if jitterMilliseconds > 0 {
                wait += .milliseconds(Int64.random(in: 0...jitterMilliseconds, using: &generator))
            }
            nextRun = timing.now() + wait
            let next = timing.wallClock().addingTimeInterval(Timing.seconds(wait))
            current.withLock { status in
                status.last = result
                status.ready = result.outcome == .success
                status.phase = Self.phase(result.outcome)
                status.consecutiveFailures = failures
                if result.outcome == .success { status.lastSuccessAt = result.finishedAt }
                status.nextRunAt = next
            }
            log(Self.line(workspace: name, result, next: wait))
            notify(result)
            await publish()
        }
        balance.forget(key)
        if owned {
            current.withLock { $0.phase = "stopped" }
            await publish()
        }
        // The claim (when owned) and the presence end, so the others share the workspaces without it at once.
        try? await ownership.records.releaseOwnership(ownership.replica)
        if owned { log("workspace=\(name) released by this replica") }
    }

    /// Gives the workspace up to `target.to`, which owns fewer (this replica stays a candidate): the
    /// status says so and keeps the schedule for the next owner.
    private func handOver(to target: (to: String, mine: Int, theirs: Int)) async {
        current.withLock { $0.handedOverTo = target.to }
        await publish()
        do {
            try await ownership.records.releaseOwnership(ownership.replica, leaving: false)
        } catch {
            // The claim lapses on its own; the workspace is taken when it does.
            log("workspace=\(name) cannot give its claim up: \(Reconciler.plain(Failure(error).message))")
        }
        lead(false)
        metrics.handover(workspace: name)
        current.withLock {
            $0.phase = "standby"
            $0.nextRunAt = nil
        }
        log(
            "workspace=\(name) handed over to spread the workspaces: this replica owned \(target.mine), replica \(target.to) owns \(target.theirs); it reconciles it from now on"
        )
    }

    /// Takes on what the status `previous` said of the workspace before it was handed over: its last
    /// reconcile and when the next one is due. Returns when that is, on the monotonic clock.
    private func carryOver(_ previous: WorkspaceStatus) -> Duration? {
        current.withLock { status in
            status.last = previous.last
            status.lastSuccessAt = previous.lastSuccessAt
            status.consecutiveFailures = previous.consecutiveFailures
            status.ready = previous.ready
            status.phase = previous.last.map { Self.phase($0.outcome) } ?? status.phase
            status.nextRunAt = previous.nextRunAt
        }
        guard let next = previous.nextRunAt else { return nil }
        let seconds = next.timeIntervalSince(timing.wallClock())
        return seconds > 0 ? timing.now() + .milliseconds(Int64(seconds * 1000)) : nil
    }

    /// The phase a reconcile's outcome leaves.
    static func phase(_ outcome: ReconcileResult.Outcome) -> String {
        switch outcome {
        case .success: "ready"
        case .blocked: "blocked"
        case .failure: "failing"
        }
    }

    /// One reconcile, with a heartbeat beside it renewing the claim every third of its duration.
    private func reconcileHoldingClaim(_ changes: PendingChanges, whole: Bool) async -> ReconcileResult {
        let ownership = self.ownership
        let timing = self.timing
        let name = self.name
        let log = self.log
        return await withTaskGroup(of: ReconcileResult?.self) { group in
            group.addTask {
                while !Task.isCancelled {
                    do {
                        try await timing.sleep(ownership.duration / 3)
                    } catch {
                        return nil
                    }
                    if let record = try? await ownership.records.claimOwnership(
                        ownership.replica, for: ownership.duration),
                        record.owner != ownership.replica
                    {
                        log(
                            "workspace=\(name) claim taken by \(record.owner ?? "another replica") during a reconcile; the state lock's fencing keeps the two apart"
                        )
                    }
                }
                return nil
            }
            let reconciler = self.reconciler
            // On threads of its own, so the health endpoints never wait for a thread behind it.
            group.addTask(executorPreference: ReconcileExecutor.shared) {
                let result = await reconciler.reconcile(changes: changes, whole: whole) {
                    self.woken.withLock { Set($0.devices.values.flatMap { $0 }) }
                }
                if (result.changedDevices ?? Self.batchLimit) >= Self.batchLimit / 10 {
                    // A whole reconcile (or a large batch) peaked; what it freed goes back to the
                    // system, so the resident size between resyncs is what the workspace keeps, not its
                    // last peak. Here, on the reconcile's threads: a trim of a large heap takes a while.
                    _ = tidemark_release_free_memory()
                }
                return result
            }
            var outcome: ReconcileResult?
            for await result in group {
                if let result {
                    outcome = result
                    group.cancelAll()
                }
            }
            return outcome!
        }
    }

    /// Sends the events `result` raises to the webhooks that want them: each ongoing problem once, and
    /// again after the target's `renotify`; a delivery that fails every retry is forgotten, so the
    /// next reconcile raises it again.
    private func notify(_ result: ReconcileResult) {
        guard let notifier, !notifier.targets.isEmpty else { return }
        let (name, replica, now) = (self.name, ownership.replica, timing.wallClock())
        let due = current.withLock { status in
            var ledger = status.notifications ?? NotifyLedger()
            let events = ServeEvent.events(of: result, workspace: name, replica: replica, troubled: ledger.troubled)
            let due = ledger.due(events, targets: notifier.settings, now: now)
            status.notifications = ledger
            return due
        }
        for (target, event) in due {
            let id = NotifyLedger.entry(target, event)
            notifier.send(event, to: target) { [self] in
                current.withLock { $0.notifications?.sent[id] = nil }
            }
        }
    }

    /// Publishes the status for `tidemark status` when it changed since it was last published (and
    /// this replica still owns the workspace).
    private func publish() async {
        let encoded = (try? WorkspaceStatus.encoder.encode(status)) ?? Data("{}".utf8)
        guard published.withLock({ $0 != encoded }) else { return }
        let replica = ownership.replica
        if (try? await ownership.records.publishStatus(encoded, replica: replica)) == true {
            published.withLock { $0 = encoded }
        }
    }

    /// Waits `duration`, or less when the group shuts down.
    private func pause(_ duration: Duration) async {
        await ServeWait.pause(duration, timing: timing)
    }

    /// What the inventory said, for the log: "3 devices changed in 'app-db'; 'events' read in full: …".
    static func describe(_ woke: PendingChanges) -> String {
        var parts: [String] = []
        if woke.deviceCount > 0 {
            let sources = woke.devices.keys.sorted().map { "'\($0)'" }.joined(separator: ", ")
            parts.append("\(PlanRenderer.counted(woke.deviceCount, "device change")) in \(sources)")
        }
        for (source, why) in woke.fullReads.sorted(by: { $0.key < $1.key }) {
            parts.append("'\(source)' read in full: \(why)")
        }
        for (source, why) in woke.rereads.sorted(by: { $0.key < $1.key }) {
            parts.append("\(source == "manifests" || source == "inventory files" ? source : "'\(source)'"): \(why)")
        }
        return parts.joined(separator: "; ")
    }

    /// The log line of a reconcile: `workspace=… result=… seconds=… reason=… next=…: summary`.
    static func line(workspace: String, _ result: ReconcileResult, next: Duration) -> String {
        var fields = [
            "workspace=\(workspace)", "result=\(result.outcome.rawValue)",
            "seconds=\(String(format: "%.2f", result.seconds))",
        ]
        if let reason = result.reason { fields.append("reason=\(reason)") }
        fields.append("next_in=\(ServeSettings.describe(next))")
        return "reconcile " + fields.joined(separator: " ") + ": " + result.summary
    }
}

extension WorkspaceStatus {
    /// The JSON of `/status`, of `tidemark status --format json` and of the status kept in the store:
    /// snake_case keys, ISO 8601 times.
    public static var encoder: JSONEncoder {
        let encoder = JSONEncoder()
        encoder.keyEncodingStrategy = .convertToSnakeCase
        encoder.dateEncodingStrategy = .iso8601
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        return encoder
    }

    /// Reads what `encoder` wrote.
    public static var decoder: JSONDecoder {
        let decoder = JSONDecoder()
        decoder.keyDecodingStrategy = .convertFromSnakeCase
        decoder.dateDecodingStrategy = .iso8601
        return decoder
    }
}

/// How `serve`'s services wait between their rounds.
enum ServeWait {
    /// Waits `duration`, or less when the service group shuts down, in steps of at most a quarter of
    /// a second that look at the shutdown in between (a runner waits this way every poll, so nothing
    /// is set up and torn down around each wait).
    static func pause(
        _ duration: Duration, timing: Timing, until done: @Sendable () -> Bool = { false }
    ) async {
        let end = timing.now() + duration
        while !Task.isShuttingDownGracefully, !Task.isCancelled, !done() {
            let left = end - timing.now()
            guard left > .zero else { return }
            try? await timing.sleep(min(left, .milliseconds(250)))
        }
    }
}
