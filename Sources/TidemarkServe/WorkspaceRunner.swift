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

        /// Ownership through `records` for `replica`.
        public init(
            records: any StateStore, replica: String, duration: Duration = .seconds(30), poll: Duration = .seconds(2)
        ) {
            self.records = records
            self.replica = replica
            self.duration = duration
            self.poll = poll
        }
    }

    /// The workspace's name.
    public let name: String
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

    /// A runner for the workspace `status` describes, reconciling with `reconciler` while it owns the
    /// workspace through `ownership`; it waits, draws its jitter and stamps its times by the
    /// reconciler's `timing`; the events its reconciles raise go to `notifier`.
    public init(
        status: WorkspaceStatus, reconciler: Reconciler, ownership: Ownership, metrics: ServeMetrics,
        notifier: Notifier? = nil, log: @escaping @Sendable (String) -> Void
    ) {
        self.name = status.workspace
        self.live = Mutex((reconciler, false))
        self.ownership = ownership
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
    public func update(_ reconciler: Reconciler, status: WorkspaceStatus) {
        live.withLock { $0.reconciler = reconciler }
        current.withLock {
            $0.settings = status.settings
            $0.manifests = status.manifests
            $0.backend = status.backend
            $0.state = status.state
        }
    }

    /// Stops the runner after its current round (a reconcile in flight finishes); it gives its claim up.
    public func retire() {
        live.withLock { $0.retired = true }
    }

    private var retired: Bool { live.withLock { $0.retired } }

    /// Reconciles while it owns the workspace, until the service group shuts down.
    public func run() async throws {
        var generator = timing.generator
        var owned = false
        var failures = 0
        var nextRun: Duration?
        var handledRequest: Date?
        var lastProblem: String?
        var claimedAt: Duration?
        defer { metrics.leader(workspace: name, false) }
        while !Task.isShuttingDownGracefully, !Task.isCancelled, !retired {
            let settings = reconciler.settings
            let record: ServeRecord
            do {
                // A claim is made (or renewed) every third of its duration; in between, the record is
                // only read (people's requests; a claim given up, which a standby replica takes at once).
                var read: ServeRecord?
                if let claimed = claimedAt, timing.now() - claimed < ownership.duration / 3 {
                    read = try await ownership.records.serveRecord()
                }
                if let read, owned || read.owner != nil {
                    record = read
                } else {
                    let (replica, duration) = (ownership.replica, ownership.duration)
                    record = try await ownership.records.claimOwnership(replica, for: duration)
                    claimedAt = timing.now()
                }
                lastProblem = nil
            } catch {
                // The records live in the state store: unreachable, nothing can be reconciled either.
                let message = Reconciler.plain(Failure(error).message)
                if lastProblem != message {
                    log("workspace=\(name) cannot claim the workspace in its state store: \(message)")
                    lastProblem = message
                }
                owned = false
                metrics.leader(workspace: name, false)
                current.withLock {
                    $0.phase = "failing"
                    $0.ready = false
                }
                await pause(ownership.poll)
                continue
            }
            guard record.owner == ownership.replica else {
                if owned || current.withLock({ $0.phase != "standby" }) {
                    log(
                        "workspace=\(name) standby: replica \(record.owner ?? "?") owns it; this replica takes it over when that one stops renewing its claim"
                    )
                }
                owned = false
                metrics.leader(workspace: name, false)
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
                log(
                    "workspace=\(name) owned by this replica (\(ownership.replica), claim \(record.ownerFence)); reconciling now"
                )
                metrics.leader(workspace: name, true)
                // What the previous owner sent stays sent: an ongoing problem is not told twice.
                let previous = record.status.flatMap {
                    try? WorkspaceStatus.decoder.decode(WorkspaceStatus.self, from: $0)
                }
                current.withLock {
                    $0.replica = ownership.replica
                    if let ledger = previous?.notifications { $0.notifications = ledger }
                }
                // Another replica may have published since this one last did.
                published.withLock { $0 = nil }
                nextRun = nil
                // A request made before this replica owned the workspace is served by the reconcile at once.
                handledRequest = record.reconcileRequestedAt
            }
            let suspended = settings.suspend || record.suspended
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
            if let due = nextRun, timing.now() < due, !requested {
                // Resumed: the phase the last reconcile left.
                current.withLock { status in
                    if status.phase == "suspended" {
                        status.phase = status.last.map { Self.phase($0.outcome) } ?? "pending"
                    }
                }
                await publish()
                await pause(min(ownership.poll, due - timing.now()))
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
            let result = await reconcileHoldingClaim()
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
            var wait = settings.wait(afterFailures: failures)
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
        if owned {
            current.withLock { $0.phase = "stopped" }
            await publish()
            let replica = ownership.replica
            try? await ownership.records.releaseOwnership(replica)
            log("workspace=\(name) released by this replica")
        }
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
    private func reconcileHoldingClaim() async -> ReconcileResult {
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
            group.addTask(executorPreference: ReconcileExecutor.shared) { await reconciler.reconcile() }
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
    static func pause(_ duration: Duration, timing: Timing) async {
        let end = timing.now() + duration
        while !Task.isShuttingDownGracefully, !Task.isCancelled {
            let left = end - timing.now()
            guard left > .zero else { return }
            try? await timing.sleep(min(left, .milliseconds(250)))
        }
    }
}
