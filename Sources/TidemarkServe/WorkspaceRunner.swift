import CShims
import Foundation
import ServiceLifecycle
import Synchronization
import TidemarkCore
import TidemarkRuntime

/// What `/status` and `tidemark status` say of one workspace.
public struct WorkspaceStatus: Sendable, Codable, Equatable {
    /// Where the workspace is (`WorkspacePhase`).
    public var phase: WorkspacePhase
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
    /// When the reconcile in flight started (nil: none runs).
    public var reconcileStartedAt: Date?
    /// How far the reconcile in flight has got, as last said (every 30 s; nil before).
    public var progress: Progress?
    /// What FCM has answered to every request since when, while it keeps failing (`degraded`), and
    /// after a reconcile that failed because of it; nil while FCM answers.
    public var fcmTrouble: FCMTrouble?
    /// The topics and groups a rail holds, each since it was first held: their changes wait while
    /// everything else is applied (nil: none).
    public var held: [HeldChange]?

    /// How far a reconcile in flight has got.
    public struct Progress: Sendable, Codable, Equatable {
        /// What it does: `reading FCM`, `applying`, or `planning` before either reports.
        public var step: String
        /// Registrations read or token changes sent so far in the step.
        public var done: Int
        /// Registrations to read or token changes to send in the step.
        public var total: Int
        /// Seconds until the step is done at the rate so far (nil: too early to tell).
        public var etaSeconds: Int?
        /// When this was said.
        public var at: Date
    }

    /// FCM failing every request of a reconcile.
    public struct FCMTrouble: Sendable, Codable, Equatable {
        /// The last failure, in words (`HTTP 503 (UNAVAILABLE)`, `the connection was refused`).
        public var answer: String
        /// Since when no request has been answered.
        public var since: Date
    }
}

/// Reconciles one workspace while this replica owns it, as a service of `serve`'s service group.
///
/// The workspace is a `WorkspaceMachine`; the runner drives it. Events arrive in one inbox: the
/// machine's timer (record reads every `poll`, claim renewals, the schedule), what the watches report
/// (changes, their starting point), reloaded settings, the end of a reconcile, a shutdown. The runner
/// runs the effects the machine returns: it reads and claims the workspace's record (asking the
/// balance whether to take a free workspace or hand this one over), starts reconciles on threads of
/// their own (the inbox goes on meanwhile, so the claim is renewed during a reconcile), publishes
/// the status for `tidemark status`, sends events. Nothing polls: a replica with nothing to do wakes
/// for its timers only. Owning is not the state lock: the apply takes that only for each reconcile. A
/// shutdown that comes during an apply stops it between journal steps, as it stops a CLI apply; then
/// the claim is given up, so another replica takes the workspace at once.
public final class WorkspaceRunner: Service, Sendable {
    /// How the runner keeps its claim and reads requests.
    public struct Ownership: Sendable {
        /// The store whose records say who owns the workspace (the workspace's state store).
        public var records: any ServeRecordKeeping
        /// This replica's name (`Serve.replica`).
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
            records: any ServeRecordKeeping, replica: String, duration: Duration = .seconds(30),
            poll: Duration = .seconds(2),
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

    /// What arrives in the runner's inbox.
    enum Message: Sendable {
        /// An event for the machine.
        case event(WorkspaceMachine.Event)
        /// The watches reported changes (read from `woken` when taken).
        case woke
        /// The watches of the ownership `generation` have their starting point.
        case watching(generation: Int)
        /// A notification that failed every retry: forgotten, so the next reconcile raises it again.
        case undelivered(String)
        /// Settings reloaded.
        case reload
    }

    /// What the watches reported since the last reconcile started, and whether the inbox was told.
    private struct Woken {
        var changes = PendingChanges()
        var told = false
    }

    /// The workspace's name.
    public let name: String
    /// The workspace as the balance knows it: its state and name.
    private let key: String
    private let balance: ReplicaBalance
    /// The reconciler, the sources that follow their changes and the inputs watched (each replaced
    /// when the settings are reloaded), and the status's view of the settings.
    private let live:
        Mutex<(reconciler: Reconciler, followed: [FollowedSource], watched: WatchedInputs, shown: WorkspaceStatus)>
    private var reconciler: Reconciler { live.withLock { $0.reconciler } }
    private let ownership: Ownership
    private let metrics: ServeMetrics
    /// The reconcile in flight's progress and FCM's answers to it.
    private let watch: ReconcileWatch
    private let notifier: Notifier?
    private let log: ServeLog
    private let current: Mutex<WorkspaceStatus>
    /// The status as last published.
    private let published = Mutex<Data?>(nil)
    /// Whether this replica owns the workspace now (what the watches wait for).
    private let owning = OwnershipSignal()
    /// Grows when the settings are reloaded (the watches start over with the new sources and inputs).
    private let reloads = Beacon()
    /// What the inventory said changed since the last reconcile started.
    private let woken = Mutex(Woken())
    private let messages: AsyncStream<Message>
    private let inbox: AsyncStream<Message>.Continuation

    /// A runner for the workspace `status` describes, reconciling with `reconciler` while it owns the
    /// workspace through `ownership`; it waits, draws its jitter and stamps its times by the
    /// reconciler's `timing`; the events its reconciles raise go to `notifier`.
    public init(
        status: WorkspaceStatus, reconciler: Reconciler, ownership: Ownership, metrics: ServeMetrics,
        notifier: Notifier? = nil, followed: [FollowedSource] = [], watched: WatchedInputs = WatchedInputs(),
        log: ServeLog
    ) {
        self.name = status.workspace
        self.key = "\(status.state) \(status.workspace)"
        self.live = Mutex((reconciler, followed, watched, status))
        self.ownership = ownership
        self.balance =
            ownership.balance
            ?? Ownership.balance(
                replica: ownership.replica, duration: ownership.duration, poll: ownership.poll,
                timing: reconciler.timing)
        self.metrics = metrics
        watch = ReconcileWatch(timing: reconciler.timing)
        self.notifier = notifier
        self.log = log
        self.current = Mutex(status)
        (messages, inbox) = AsyncStream.makeStream(of: Message.self)
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
        live.withLock { $0 = (reconciler, followed, watched, status) }
        reloads.bump()
        inbox.yield(.reload)
    }

    /// Stops the runner after its current round (a reconcile in flight finishes); it gives its claim up.
    public func retire() {
        inbox.yield(.event(.stop))
    }

    /// Reconciles while it owns the workspace, until the service group shuts down; meanwhile the
    /// changes of the sources that follow them wake it between scheduled reconciles.
    public func run() async throws {
        let follower = ChangeFollower(workspace: name, timing: timing, log: log)
        let inbox = self.inbox
        await withDiscardingTaskGroup { group in
            group.addTask {
                await follower.run(
                    sources: { self.live.withLock { $0.followed } }, inputs: { self.live.withLock { $0.watched } },
                    owning: self.owning, reloads: self.reloads, wake: { self.wake($0) },
                    ready: { inbox.yield(.watching(generation: $0)) })
            }
            await withGracefulShutdownHandler {
                await drive()
            } onGracefulShutdown: {
                inbox.yield(.event(.stop))
            }
            group.cancelAll()
        }
    }

    /// Notes what the inventory said changed; the machine starts a reconcile at once if it is waiting
    /// (not while it waits to retry a failure: the retry reads the changes).
    public func wake(_ change: InventoryChange) {
        let (waiting, tell) = woken.withLock { woken -> (Int, Bool) in
            if case .fullRead(let source, _) = change { metrics.inventoryFullRead(workspace: name, source: source) }
            woken.changes.add(change)
            defer { woken.told = true }
            return (woken.changes.deviceCount, !woken.told)
        }
        metrics.inventoryChangesWaiting(workspace: name, waiting)
        if tell { inbox.yield(.woke) }
    }

    /// The most changed devices a batch takes: a burst (a migration touching 100,000 rows) is
    /// drained in batches of this many, so that a batch's plan and journal, not the burst, set the
    /// memory serve needs. Large, because each batch costs a few seconds besides its sends (at a
    /// million devices, mostly saving the state of every topic it touched): at 10,000 devices that
    /// was a tenth of a burst's time; at 50,000 (minutes of sends at FCM's quota) it is a few percent.
    static let batchLimit = 50_000
    /// How often a reconcile in flight's watch is read and given to the machine.
    static let watchEvery = Duration.seconds(5)

    /// The machine's configuration for the settings now.
    private func config() -> WorkspaceMachine.Config {
        let (reconciler, followed, watched) = live.withLock { ($0.reconciler, $0.followed, $0.watched) }
        return WorkspaceMachine.Config(
            replica: ownership.replica, claim: ownership.duration, poll: ownership.poll,
            settings: reconciler.settings, resync: followed.map(\.feed.resync).min(),
            watches: !followed.isEmpty || !watched.isEmpty, grace: balance.grace)
    }

    /// Whether a source of the workspace follows its changes (the status counts waiting devices).
    private var follows: Bool { live.withLock { !$0.followed.isEmpty } }

    /// The machine's loop: each message is handled, the effects run, the timer set for the next
    /// `wakeAt`, the status shown; until the machine finishes.
    private func drive() async {
        var machine = WorkspaceMachine(config: config(), status: status)
        var queue: [WorkspaceMachine.Event] = [.tick]
        var iterator = messages.makeAsyncIterator()
        var timer: (at: Duration, task: Task<Void, Never>)?
        var running: Task<ReconcileResult, Never>?
        let timing = self.timing
        let inbox = self.inbox
        while !machine.finished {
            let event: WorkspaceMachine.Event
            if !queue.isEmpty {
                event = queue.removeFirst()
            } else if let message = await iterator.next() {
                guard let taken = machineEvent(of: message, &machine) else { continue }
                event = taken
            } else {
                // Cancelled: stop, and end a reconcile in flight with it.
                queue = []
                var effects = machine.handle(.stop, at: moment(timing))
                if let running, machine.reconciling {
                    running.cancel()
                    let result = await running.value
                    effects += machine.handle(
                        .reconciled(result, shuttingDown: true), at: moment(timing))
                }
                for effect in effects { await perform(effect, &machine, &queue, &running) }
                break
            }
            for effect in machine.handle(event, at: moment(timing)) {
                await perform(effect, &machine, &queue, &running)
            }
            current.withLock { $0 = machine.status }
            let at = machine.wakeAt()
            if at != timer?.at {
                timer?.task.cancel()
                timer = at.map { at in
                    (
                        at,
                        Task {
                            let wait = at - timing.now()
                            if wait > .zero {
                                do { try await timing.sleep(wait) } catch { return }
                            }
                            inbox.yield(.event(.tick))
                        }
                    )
                }
            }
        }
        timer?.task.cancel()
        current.withLock { $0 = machine.status }
    }

    /// The machine's event for `message` (nil: handled here).
    private func machineEvent(of message: Message, _ machine: inout WorkspaceMachine) -> WorkspaceMachine.Event? {
        switch message {
        case .event(let event):
            if case .progress(let snapshot) = event, machine.reconcileStarted == snapshot.started {
                metrics.progress(workspace: name, snapshot)
            }
            return event
        case .woke:
            let (pending, devices) = woken.withLock { woken in
                woken.told = false
                return (!woken.changes.isEmpty, woken.changes.deviceCount)
            }
            return .changed(pending: pending, devices: devices)
        case .watching(let generation):
            return owning.generation == generation && owning.isOwning ? .watching : nil
        case .undelivered(let id):
            var ledger = machine.status.notifications
            ledger?.sent[id] = nil
            machine.record(notifications: ledger)
            return nil
        case .reload:
            var shown = live.withLock { $0.shown }
            shown.inventoryChangesWaiting = follows ? 0 : nil
            return .reloaded(config(), shown)
        }
    }

    private func moment(_ timing: Timing) -> WorkspaceMachine.Moment {
        .init(now: timing.now(), wall: timing.wallClock(), draw: timing.random())
    }

    /// Runs one of the machine's effects; events it produces go to `queue`, ahead of the inbox.
    private func perform(
        _ effect: WorkspaceMachine.Effect, _ machine: inout WorkspaceMachine, _ queue: inout [WorkspaceMachine.Event],
        _ running: inout Task<ReconcileResult, Never>?
    ) async {
        switch effect {
        case .readRecord(let claim):
            queue.append(await readRecord(claim: claim, machine))
        case .lead(let leader):
            owning.set(leader)
            metrics.leader(workspace: name, leader, replica: ownership.replica, status: machine.status)
        case .log(let line, let level):
            log(level, line)
        case .publish:
            metrics.status(workspace: name, machine.status)
            await publish(machine.status)
        case .forgetPublished:
            published.withLock { $0 = nil }
        case .reconcile(let whole, let takeChanges, let window):
            let (taken, left) = takeWoken(takeChanges ? (whole ? 0 : Self.batchLimit) : nil)
            if !taken.isEmpty {
                log(
                    "workspace=\(name) reconcile started by the inventory: \(Self.describe(taken))\(left > 0 ? " (\(PlanRenderer.counted(left, "more device change")) waiting for the next batch)" : "")"
                )
            }
            queue.append(
                .changed(
                    pending: woken.withLock { !$0.changes.isEmpty },
                    devices: machine.status.inventoryChangesWaiting == nil ? nil : left))
            metrics.reconciling(workspace: name, since: machine.status.reconcileStartedAt)
            running = startReconcile(
                taken, whole: whole, window: window, started: machine.reconcileStarted ?? timing.now())
        case .dropChanges:
            _ = takeWoken(0)
            queue.append(.changed(pending: false, devices: machine.status.inventoryChangesWaiting == nil ? nil : 0))
        case .measure(let result):
            metrics.reconciling(workspace: name, since: nil)
            metrics.record(workspace: name, result)
        case .notify(let result):
            notify(result, &machine)
        case .suspended(let suspended):
            metrics.suspended(workspace: name, suspended)
        case .handOver(_, let status):
            await publish(status)
            do {
                try await ownership.records.releaseOwnership(ownership.replica, leaving: false)
            } catch {
                // The claim lapses on its own; the workspace is taken when it does.
                log.warning("workspace=\(name) cannot give its claim up: \(Failure(error).plainMessage)")
            }
            metrics.handover(workspace: name)
        case .release(let owned):
            balance.forget(key)
            // The claim (when owned) and the presence end, so the others share the workspaces without it at once.
            try? await ownership.records.releaseOwnership(ownership.replica)
            if owned { log("workspace=\(name) released by this replica") }
        }
    }

    /// Reads (`claim`: renews) the record; a free workspace is taken when the balance says this replica
    /// should have it, and an owned one handed over when the machine may and the balance says so.
    private func readRecord(claim: Bool, _ machine: WorkspaceMachine) async -> WorkspaceMachine.Event {
        let (records, replica, duration) = (ownership.records, ownership.replica, ownership.duration)
        do {
            // During a reconcile a claim that lapsed (a long stall) is taken back when nobody took it.
            var seen =
                claim
                ? try await records.claimOwnership(replica, for: duration, take: machine.reconciling)
                : try await records.serveRecord()
            var claimed = claim
            balance.observe(key, seen)
            if seen.owner == nil, balance.shouldTake(key) {
                seen = try await records.claimOwnership(replica, for: duration, take: true)
                claimed = true
                balance.observe(key, seen)
            }
            metrics.replicas(balance.replicas.count)
            let handOver =
                machine.mayHandOver(seen)
                ? balance.handOverTarget(key).map {
                    WorkspaceMachine.HandOver(to: $0.to, mine: $0.mine, theirs: $0.theirs)
                }
                : nil
            return .record(seen, claimed: claimed, handOver: handOver)
        } catch {
            return .recordFailed(Failure(error).plainMessage)
        }
    }

    /// Takes what woke the runner: nil takes nothing; 0 everything; otherwise at most that many changed
    /// devices of one source (the rest wait for the next batch, `left`).
    private func takeWoken(_ limit: Int?) -> (taken: PendingChanges, left: Int) {
        let (taken, left) = woken.withLock { woken in
            guard let limit else { return (PendingChanges(), woken.changes.deviceCount) }
            let taken = woken.changes.take(upTo: limit)
            return (taken, woken.changes.deviceCount)
        }
        metrics.inventoryChangesWaiting(workspace: name, left)
        return (taken, left)
    }

    /// Starts a reconcile on threads of its own (so the health endpoints and the inbox never wait for
    /// a thread behind it); its result comes back to the inbox.
    ///
    /// While it runs, its watch (how far it has got, how FCM answers) is read every `watchEvery` and
    /// given to the machine.
    private func startReconcile(
        _ changes: PendingChanges, whole: Bool, window: SyncWindow, started: Duration
    ) -> Task<ReconcileResult, Never> {
        var reconciler = self.reconciler
        let inbox = self.inbox
        let (watch, metrics, name, timing) = (self.watch, self.metrics, self.name, self.timing)
        watch.begin(at: started)
        reconciler.watch = watch
        reconciler.attempts = { metrics.fcmAttempt(workspace: name, $0) }
        let every = Self.watchEvery
        return Task(executorPreference: ReconcileExecutor.shared) {
            let ticker = Task {
                while true {
                    do { try await timing.sleep(every) } catch { return }
                    if Task.isCancelled { return }
                    inbox.yield(.event(.progress(watch.snapshot())))
                }
            }
            let result = await reconciler.reconcile(changes: changes, whole: whole, window: window) {
                self.woken.withLock { Set($0.changes.devices.values.flatMap { $0 }) }
            }
            ticker.cancel()
            if (result.changedDevices ?? Self.batchLimit) >= Self.batchLimit / 10 {
                // A whole reconcile (or a large batch) peaked; what it freed goes back to the system, so
                // the resident size between resyncs is what the workspace keeps, not its last peak. Here,
                // on the reconcile's threads: a trim of a large heap takes a while.
                _ = tidemark_release_free_memory()
            }
            inbox.yield(.event(.reconciled(result, shuttingDown: Task.isShuttingDownGracefully)))
            return result
        }
    }

    /// Sends the events `result` raises to the webhooks that want them: each ongoing problem once, and
    /// again after the target's `renotify`; a delivery that fails every retry is forgotten, so the
    /// next reconcile raises it again.
    private func notify(_ result: ReconcileResult, _ machine: inout WorkspaceMachine) {
        guard let notifier, !notifier.targets.isEmpty else { return }
        var ledger = machine.status.notifications ?? NotifyLedger()
        let events = ServeEvent.events(
            of: result, workspace: name, replica: ownership.replica, troubled: ledger.troubled,
            failures: machine.status.consecutiveFailures)
        let due = ledger.due(events, targets: notifier.settings, now: timing.wallClock())
        machine.record(notifications: ledger)
        let inbox = self.inbox
        for (target, event) in due {
            let id = NotifyLedger.entry(target, event)
            notifier.send(event, to: target) { inbox.yield(.undelivered(id)) }
        }
    }

    /// Publishes `status` for `tidemark status` when it changed since it was last published (and this
    /// replica still owns the workspace).
    private func publish(_ status: WorkspaceStatus) async {
        let encoded = (try? WorkspaceStatus.encoder.encode(status)) ?? Data("{}".utf8)
        guard published.withLock({ $0 != encoded }) else { return }
        let replica = ownership.replica
        if (try? await ownership.records.publishStatus(encoded, replica: replica)) == true {
            published.withLock { $0 = encoded }
        }
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
}

/// Whether this replica owns a workspace, for the watches that run only while it does: they wait for
/// it without polling. Each time it starts owning is a new generation, so a watch's report of its
/// starting point is told apart from one of an earlier ownership.
final class OwnershipSignal: Sendable {
    private let owning = Mutex(false)
    /// Counts the times it started owning: the generations, and what waiters wait on.
    private let starts = Beacon()

    /// Records whether this replica owns the workspace; starting to own wakes the watches.
    func set(_ owning: Bool) {
        let started = self.owning.withLock { was -> Bool in
            defer { was = owning }
            return owning && !was
        }
        // Owning is recorded before the generation grows: a waiter that sees the new generation sees it.
        if started { starts.bump() }
    }

    /// Whether it owns the workspace now.
    var isOwning: Bool { owning.withLock { $0 } }
    /// The generation of the ownership now (grows each time it starts owning).
    var generation: Int { starts.value }

    /// Returns once this replica owns the workspace (at once when it does), or when the task is
    /// cancelled or the service group shuts down.
    func waitUntilOwning() async {
        while !Task.isCancelled, !Task.isShuttingDownGracefully {
            let mark = starts.value
            if isOwning { return }
            await starts.wait(beyond: mark)
        }
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
    /// Waits `duration`, or less when the task is cancelled: one sleep, not a poll. The watches are
    /// cancelled when their runner stops; the services that wait this way run inside
    /// `cancelWhenGracefulShutdown`, so a shutdown cancels them too.
    static func pause(_ duration: Duration, timing: Timing) async {
        guard duration > .zero, !Task.isCancelled else { return }
        try? await timing.sleep(duration)
    }
}

/// A count that grows (settings reloaded) and that tasks wait on to grow, without polling.
final class Beacon: Sendable {
    private struct Inner {
        var value = 0
        var waiters: [Int: CheckedContinuation<Void, Never>] = [:]
        var nextWaiter = 0
    }

    private let inner = Mutex(Inner())

    /// The count now.
    var value: Int { inner.withLock { $0.value } }

    /// Grows the count; wakes every waiter.
    func bump() {
        let waiters = inner.withLock { inner -> [CheckedContinuation<Void, Never>] in
            inner.value += 1
            defer { inner.waiters = [:] }
            return Array(inner.waiters.values)
        }
        for waiter in waiters { waiter.resume() }
    }

    /// Returns once the count is beyond `value`, or when the task is cancelled or the service group
    /// shuts down.
    func wait(beyond value: Int) async {
        let id = inner.withLock { inner -> Int in
            inner.nextWaiter += 1
            return inner.nextWaiter
        }
        await withTaskCancellationOrGracefulShutdownHandler {
            await withCheckedContinuation { continuation in
                let now = inner.withLock { inner -> Bool in
                    if inner.value > value || Task.isCancelled || Task.isShuttingDownGracefully { return true }
                    inner.waiters[id] = continuation
                    return false
                }
                if now { continuation.resume() }
            }
        } onCancelOrGracefulShutdown: {
            self.inner.withLock { $0.waiters.removeValue(forKey: id) }?.resume()
        }
    }
}
