import Foundation
import TidemarkCore

/// Where a workspace of `serve` is, as `/status` and `tidemark status` say it.
public enum WorkspacePhase: String, Sendable, Codable, CaseIterable {
    /// Owned, before its first reconcile.
    case pending
    /// A reconcile runs.
    case reconciling
    /// The last reconcile succeeded.
    case ready
    /// A reconcile runs, and FCM has failed every request of it for `degraded_after` (tidemark goes on
    /// retrying within the retry budget): not ready.
    case degraded
    /// The last reconcile failed (retried after `retry_interval`, doubling), or the state store that
    /// keeps the claims cannot be reached.
    case failing
    /// A rail refused the last plan.
    case blocked
    /// `tidemark suspend` or `suspend: true` stopped it.
    case suspended
    /// Another replica owns it (or it is free and left to a replica that owns fewer).
    case standby
    /// This replica stopped: shut down, or the workspace left tidemark.yaml.
    case stopped

    /// The phase a reconcile's outcome leaves.
    public init(_ outcome: ReconcileResult.Outcome) {
        switch outcome {
        case .success: self = .ready
        case .blocked: self = .blocked
        case .failure: self = .failing
        }
    }
}

/// One workspace of `serve` as a state machine: what this replica knows of it (ownership, schedule,
/// failures, requests, waiting changes) and its status, changed only by `handle(_:at:)`, which takes
/// an event and the time and returns the effects to run. It does no I/O and reads no clock:
/// `WorkspaceRunner` delivers the events (one inbox), runs the effects and wakes it at `wakeAt`;
/// tests feed events and times by hand.
///
/// The rules it keeps (docs/serve.md, "How serve runs a workspace"):
///
/// - The record is read every `poll` (people's requests, a claim given up) and the claim renewed every
///   third of its duration, during a reconcile too; a read that fails makes the workspace `failing`
///   and not owned until the store answers again.
/// - A replica that comes to own the workspace (at start, at a takeover, or handed it to spread the
///   workspaces) reconciles it whole at once, once its watches (files, commands, change cursors,
///   LISTEN) have their starting point, or after `watchWait` without them: a change made while the
///   workspace changed hands is read by that reconcile, and one made after is seen by the watches.
///   A reconcile that started before the watches were ready is followed by another once they are.
/// - Owned, it reconciles whole when due (every `interval` plus jitter; after a failure sooner,
///   doubling from `retry_interval`; at least every `resync` when a source follows its changes), at
///   once on `tidemark reconcile`, and on changes the watches report (a batch of changed devices
///   when that is all that changed and no whole reconcile is due) except while it waits to retry a
///   failure (the retry reads them).
/// - Suspended, it does nothing and drops the changes reported (resuming reconciles at once).
/// - Between two reconciles it may hand the workspace to a replica that owns fewer (the runner asks
///   `ReplicaBalance`, when `mayHandOver` says it may).
/// - Stopping (a shutdown, or the workspace left tidemark.yaml) waits for a reconcile in flight, then
///   gives the claim and presence up.
public struct WorkspaceMachine: Sendable {
    /// What the machine runs with; replaced when the settings are reloaded.
    public struct Config: Sendable {
        /// This replica's name in claims.
        public var replica: String
        /// How long a claim lasts unless renewed (renewed every third of it).
        public var claim: Duration
        /// How often the record is read between renewals.
        public var poll: Duration
        /// The workspace's `serve` settings (schedule, suspend).
        public var settings: ServeSettings
        /// The shortest `resync` of the sources that follow their changes (nil: none follows them).
        public var resync: Duration?
        /// Whether the workspace has watches that report when they have their starting point.
        public var watches: Bool
        /// How long a new owner waits for its watches before its first reconcile.
        public var watchWait: Duration
        /// How long a free workspace waits for the replica that owns the fewest (`ReplicaBalance.grace`).
        public var grace: Duration
        /// How often a reconcile in flight says how far it has got (the log and the status).
        public var progressEvery: Duration = .seconds(30)

        /// A configuration for `replica`.
        public init(
            replica: String, claim: Duration, poll: Duration, settings: ServeSettings, resync: Duration? = nil,
            watches: Bool = false, watchWait: Duration = .seconds(5), grace: Duration = .seconds(10)
        ) {
            self.grace = grace
            self.replica = replica
            self.claim = claim
            self.poll = poll
            self.settings = settings
            self.resync = resync
            self.watches = watches
            self.watchWait = watchWait
        }
    }

    /// A handover the balance decided: to whom, and the counts that made it fairer.
    public struct HandOver: Sendable, Equatable {
        /// The replica that takes it.
        public var to: String
        /// How many workspaces this replica owned.
        public var mine: Int
        /// How many the other owned.
        public var theirs: Int

        /// A handover to `to`.
        public init(to: String, mine: Int, theirs: Int) {
            self.to = to
            self.mine = mine
            self.theirs = theirs
        }
    }

    /// What happens to a workspace.
    public enum Event: Sendable {
        /// A timer fired (`wakeAt`).
        case tick
        /// The record as read (`claimed`: the claim was renewed or taken); `handOver`: the balance's
        /// handover, asked only when `mayHandOver` said so.
        case record(ServeRecord, claimed: Bool, handOver: HandOver? = nil)
        /// Reading the record failed.
        case recordFailed(String)
        /// Changes are waiting (`pending`), `devices` of them changed devices (nil: no source of the
        /// workspace follows its changes, so the status counts none).
        case changed(pending: Bool, devices: Int?)
        /// The watches have their starting point (since this replica came to own the workspace).
        case watching
        /// How far the reconcile in flight has got and how FCM answers it (the runner reads its watch
        /// every few seconds).
        case progress(ReconcileWatch.Snapshot)
        /// A reconcile ended; `shuttingDown`: the service group was shutting down when it did.
        case reconciled(ReconcileResult, shuttingDown: Bool)
        /// The settings were reloaded: the configuration and what the status shows of them.
        case reloaded(Config, WorkspaceStatus)
        /// Stop: the service group shuts down, or the workspace left tidemark.yaml.
        case stop
    }

    /// What the runner does for the machine, in order.
    public enum Effect: Sendable, Equatable {
        /// Read the workspace's record; `claim`: renew the claim (and presence) with it.
        case readRecord(claim: Bool)
        /// This replica owns the workspace now (true) or no longer (false): metrics and watches.
        case lead(Bool)
        /// A log line, at its level.
        case log(String, level: ServeLog.Level = .info)
        /// Publish the status (when it changed since last published).
        case publish
        /// Forget what was published (another replica may have published since).
        case forgetPublished
        /// Start a reconcile: whole, or a batch of the waiting changes; `takeChanges`: take the waiting
        /// changes into it (not while waiting to retry a failure); `window`: whether the sync windows
        /// let its changes through (closed: it only plans them).
        case reconcile(whole: Bool, takeChanges: Bool, window: SyncWindow)
        /// Drop the waiting changes (suspended: resuming reconciles whole).
        case dropChanges
        /// Count a reconcile's result in the metrics.
        case measure(ReconcileResult)
        /// Send the events a reconcile's result raises.
        case notify(ReconcileResult)
        /// Suspended (true) or resumed: the metric.
        case suspended(Bool)
        /// Publish `status` (it names the new owner), then give the claim up and stay a candidate.
        case handOver(HandOver, status: WorkspaceStatus)
        /// Give the claim (when `owned`) and the presence up: the machine is finished.
        case release(owned: Bool)
    }

    /// The time of an event: monotonic, calendar, and a random draw for the jitter.
    public struct Moment: Sendable {
        /// Monotonic time.
        public var now: Duration
        /// Calendar time.
        public var wall: Date
        /// A uniformly distributed draw.
        public var draw: UInt64

        /// A moment.
        public init(now: Duration, wall: Date, draw: UInt64 = 0) {
            self.now = now
            self.wall = wall
            self.draw = draw
        }
    }

    /// The configuration.
    public private(set) var config: Config
    /// The status, as `/status` shows it.
    public private(set) var status: WorkspaceStatus
    /// Whether this replica owns the workspace.
    public private(set) var owned = false
    /// Whether a reconcile runs.
    public private(set) var reconciling = false
    /// Whether the machine stopped (the runner ends).
    public private(set) var finished = false
    /// When the reconcile in flight started, on the monotonic clock (nil: none runs).
    public private(set) var reconcileStarted: Duration?
    /// When the reconcile in flight last said how far it has got.
    private var progressSaid: Duration?

    private var readAt: Duration?
    private var claimedAt: Duration?
    private var reading = false
    private var failures = 0
    /// When the next whole reconcile is due (nil: at once).
    private var nextRun: Duration?
    private var handledRequest: Date?
    private var request: (at: Date?, by: String?)?
    private var lastProblem: String?
    private var suspended = false
    private var ownedSince: Duration?
    private var watching = false
    /// Whether a reconcile started since this replica came to own the workspace.
    private var startedSinceOwned = false
    /// A reconcile started before the watches had their starting point: a whole one follows.
    private var catchUp = false
    private var saidWatchesLate = false
    private var changes = false
    private var stopping = false

    /// A machine for the workspace `status` describes (not owned, nothing read yet).
    public init(config: Config, status: WorkspaceStatus) {
        self.config = config
        self.status = status
    }

    /// The notifications ledger the runner keeps in the status.
    public mutating func record(notifications: NotifyLedger?) {
        status.notifications = notifications
    }

    /// When the machine next needs a `tick` (nil: only events wake it).
    public func wakeAt() -> Duration? {
        guard !finished else { return nil }
        var times: [Duration] = []
        if !reading {
            if reconciling {
                times.append((claimedAt ?? .zero) + config.claim / 3)
            } else if !stopping {
                times.append((readAt ?? .zero) + config.poll)
            }
        }
        if owned, !reconciling, !suspended, !stopping {
            if let nextRun { times.append(nextRun) }
            if !watching, let since = ownedSince { times.append(since + config.watchWait) }
        }
        return times.min()
    }

    /// Whether the workspace may be handed over when `record` is read: owned, between two reconciles
    /// (or suspended).
    public func mayHandOver(_ record: ServeRecord) -> Bool {
        owned && !reconciling && !stopping && record.owner == config.replica
            && (nextRun != nil || config.settings.suspend || record.suspended)
    }

    /// Takes `event` at `moment`; returns the effects to run, in order.
    public mutating func handle(_ event: Event, at moment: Moment) -> [Effect] {
        guard !finished else { return [] }
        var effects: [Effect] = []
        switch event {
        case .tick: break
        case .record(let record, let claimed, let handOver):
            read(record, claimed: claimed, handOver: handOver, moment, &effects)
        case .recordFailed(let message):
            readFailed(message, moment, &effects)
        case .changed(let pending, let devices):
            changes = pending
            if let devices { status.inventoryChangesWaiting = devices }
        case .watching:
            watching = true
        case .progress(let snapshot):
            progressed(snapshot, moment, &effects)
        case .reconciled(let result, let shuttingDown):
            reconciled(result, shuttingDown: shuttingDown, moment, &effects)
        case .reloaded(let config, let shown):
            self.config = config
            status.settings = shown.settings
            status.manifests = shown.manifests
            status.backend = shown.backend
            status.state = shown.state
            status.inventoryChangesWaiting =
                shown.inventoryChangesWaiting == nil ? nil : (status.inventoryChangesWaiting ?? 0)
        case .stop:
            stopping = true
            if !reconciling { finish(&effects) }
        }
        if !finished { due(moment, &effects) }
        return effects
    }

    /// What is due at `moment`: a record read, a reconcile.
    private mutating func due(_ moment: Moment, _ effects: inout [Effect]) {
        let now = moment.now
        if !reading, !stopping {
            let renew = claimedAt.map { now - $0 >= config.claim / 3 } ?? true
            if reconciling ? renew : (readAt.map { now - $0 >= config.poll } ?? true) {
                reading = true
                effects.append(.readRecord(claim: renew))
            }
        }
        guard owned, !reconciling, !suspended, !stopping else { return }
        if !watching, !startedSinceOwned, let since = ownedSince {
            if now - since < config.watchWait { return }
            if !saidWatchesLate {
                saidWatchesLate = true
                effects.append(
                    .log(
                        "workspace=\(status.workspace) its watches did not have their starting point within \(ServeSettings.describe(config.watchWait)); reconciling now, and again once they do"
                    ))
            }
        }
        let retrying = failures > 0 && nextRun.map { now < $0 } == true
        let wholeDue = nextRun.map { now >= $0 } ?? true
        let catchUpDue = catchUp && watching
        let byChanges = !retrying && changes
        guard wholeDue || request != nil || byChanges || catchUpDue else {
            if status.phase == .suspended {
                // Resumed: the phase the last reconcile left.
                status.phase = status.last.map { WorkspacePhase($0.outcome) } ?? .pending
                effects.append(.publish)
            }
            return
        }
        // Outside the sync windows (or with on_change: plan) changes are planned whole, never in batches.
        let window = SyncWindow(config.settings.windows, at: moment.wall)
        let batches = window.isOpen && config.settings.onChange == .apply
        reconciling = true
        reconcileStarted = now
        progressSaid = now
        status.reconcileStartedAt = moment.wall
        status.progress = nil
        startedSinceOwned = true
        if !watching { catchUp = true } else if catchUpDue { catchUp = false }
        status.phase = .reconciling
        if let request {
            status.reconcileRequestedAt = request.at
            status.reconcileRequestedBy = request.by
        }
        request = nil
        effects.append(.reconcile(whole: wholeDue || catchUpDue || !batches, takeChanges: !retrying, window: window))
        effects.append(.publish)
    }

    private mutating func read(
        _ record: ServeRecord, claimed: Bool, handOver: HandOver?, _ moment: Moment, _ effects: inout [Effect]
    ) {
        reading = false
        readAt = moment.now
        if claimed { claimedAt = moment.now }
        lastProblem = nil
        let replica = config.replica
        let name = status.workspace
        if reconciling {
            if record.owner != replica {
                effects.append(
                    .log(
                        "workspace=\(name) claim taken by \(record.owner ?? "another replica") during a reconcile; the state lock's fencing keeps the two apart"
                    ))
            }
            return
        }
        guard record.owner == replica else {
            let owner = record.owner ?? "-"
            if owned || status.phase != .standby || status.replica != owner {
                if let owner = record.owner {
                    effects.append(
                        .log(
                            "workspace=\(name) standby: replica \(owner) owns it; this replica takes it over when that one stops renewing its claim"
                        ))
                } else {
                    effects.append(
                        .log(
                            "workspace=\(name) standby: free, left to a replica that owns fewer workspaces; this replica takes it if none has within \(ServeSettings.describe(config.grace))"
                        ))
                }
            }
            effects.append(.lead(false))
            owned = false
            ownedSince = nil
            status.phase = .standby
            status.replica = owner
            status.nextRunAt = nil
            return
        }
        if !owned { takeOver(record, moment, &effects) }
        if let handOver {
            status.handedOverTo = handOver.to
            effects.append(.handOver(handOver, status: status))
            effects.append(.lead(false))
            owned = false
            ownedSince = nil
            status.phase = .standby
            status.nextRunAt = nil
            effects.append(
                .log(
                    "workspace=\(name) handed over to spread the workspaces: this replica owned \(handOver.mine), replica \(handOver.to) owns \(handOver.theirs); it reconciles it from now on"
                ))
            return
        }
        let nowSuspended = config.settings.suspend || record.suspended
        let wasSuspended = status.suspended
        status.suspended = nowSuspended
        status.suspendedBy = record.suspendedBy
        suspended = nowSuspended
        if nowSuspended != wasSuspended {
            effects.append(.suspended(nowSuspended))
            effects.append(
                .log(
                    "workspace=\(name) \(nowSuspended ? "suspended" : "resumed")\(record.suspendedBy.map { " by \($0)" } ?? "")"
                ))
        }
        if nowSuspended {
            // Changes while suspended are not followed one by one: resuming reconciles at once.
            if changes {
                effects.append(.dropChanges)
                changes = false
                nextRun = nil
            }
            status.phase = .suspended
            status.nextRunAt = nil
            effects.append(.publish)
            return
        }
        if let asked = record.reconcileRequestedAt, asked > (handledRequest ?? .distantPast) {
            handledRequest = asked
            request = (asked, record.reconcileRequestedBy)
            effects.append(
                .log("workspace=\(name) reconcile requested\(record.reconcileRequestedBy.map { " by \($0)" } ?? "")"))
        }
    }

    /// This replica came to own the workspace: it reconciles at once, once its watches are ready.
    private mutating func takeOver(_ record: ServeRecord, _ moment: Moment, _ effects: inout [Effect]) {
        owned = true
        ownedSince = moment.now
        watching = !config.watches
        catchUp = false
        saidWatchesLate = false
        startedSinceOwned = false
        effects.append(.lead(true))
        let previous = record.publishedStatus
        status.replica = config.replica
        status.handedOverTo = nil
        // What the previous owner sent stays sent: an ongoing problem is not told twice.
        if let ledger = previous?.notifications { status.notifications = ledger }
        // What was held stays held since when it was, until a reconcile here re-plans it.
        status.held = previous?.held
        // Another replica may have published since this one last did.
        effects.append(.forgetPublished)
        nextRun = nil
        // A request made before this replica owned the workspace is served by the reconcile at once.
        handledRequest = record.reconcileRequestedAt
        let name = status.workspace
        let claim = "\(config.replica), claim \(record.ownerFence)"
        let waits = config.watches ? " (once its watches have their starting point)" : ""
        if let previous, previous.handedOverTo != nil {
            // Handed over between two reconciles: what the status says goes on (the last reconcile, the
            // failures in a row), and a request the previous owner had not acted on is served. The
            // reconcile runs at once: what changed while the workspace changed hands was seen by
            // neither replica's watches.
            status.last = previous.last
            status.lastSuccessAt = previous.lastSuccessAt
            status.consecutiveFailures = previous.consecutiveFailures
            status.ready = previous.ready
            status.phase = previous.last.map { WorkspacePhase($0.outcome) } ?? status.phase
            failures = previous.consecutiveFailures
            handledRequest = previous.reconcileRequestedAt
            effects.append(
                .log(
                    "workspace=\(name) handed over to this replica (\(claim)) by replica \(previous.replica); reconciling now\(waits), to read what changed while it changed hands"
                ))
        } else {
            effects.append(.log("workspace=\(name) owned by this replica (\(claim)); reconciling now\(waits)"))
        }
        status.nextRunAt = nil
    }

    private mutating func readFailed(_ message: String, _ moment: Moment, _ effects: inout [Effect]) {
        reading = false
        readAt = moment.now
        // During a reconcile the claim's fencing keeps two owners apart: the reconcile goes on.
        guard !reconciling else { return }
        if lastProblem != message {
            effects.append(
                .log(
                    "workspace=\(status.workspace) cannot claim the workspace in its state store: \(message)",
                    level: .warning))
            lastProblem = message
        }
        if owned { effects.append(.lead(false)) }
        owned = false
        ownedSince = nil
        status.phase = .failing
        status.ready = false
    }

    /// The reconcile in flight reported how far it has got: `degraded` once FCM has failed every
    /// request for `degraded_after` (and back to `reconciling` when it answers), and a progress line
    /// every `progressEvery`.
    private mutating func progressed(
        _ snapshot: ReconcileWatch.Snapshot, _ moment: Moment, _ effects: inout [Effect]
    ) {
        guard reconciling, let started = reconcileStarted, snapshot.started == started else { return }
        let name = status.workspace
        let now = moment.now
        if let since = snapshot.retryingSince, now - since >= config.settings.degradedAfter {
            let answer = snapshot.answer ?? "no answer"
            let sinceDate = moment.wall.addingTimeInterval(-Timing.seconds(now - since))
            status.fcmTrouble = WorkspaceStatus.FCMTrouble(answer: answer, since: sinceDate)
            if status.phase != .degraded {
                status.phase = .degraded
                status.ready = false
                effects.append(
                    .log(
                        "workspace=\(name) degraded: every request to FCM has failed for \(ServeSettings.describe(now - since)) (last answer: \(answer)); not ready until FCM answers again. The reconcile goes on retrying within its retry budget, then fails",
                        level: .warning))
                effects.append(.publish)
            }
        } else if snapshot.retryingSince == nil, status.phase == .degraded || status.fcmTrouble != nil {
            let since = status.fcmTrouble?.since
            status.fcmTrouble = nil
            if status.phase == .degraded {
                status.phase = .reconciling
                status.ready = status.last?.outcome == .success
                let after =
                    since.map {
                        " after \(ServeSettings.describe(.seconds(max(0, moment.wall.timeIntervalSince($0)))))"
                    } ?? ""
                effects.append(.log("workspace=\(name) FCM answers again\(after); the reconcile goes on"))
            }
            effects.append(.publish)
        }
        if now - (progressSaid ?? started) >= config.progressEvery {
            progressSaid = now
            let step = snapshot.step ?? "planning"
            status.progress = WorkspaceStatus.Progress(
                step: step, done: snapshot.done, total: snapshot.total,
                etaSeconds: snapshot.etaSeconds.map { Int($0.rounded()) }, at: moment.wall)
            effects.append(.log(Self.progressLine(workspace: name, snapshot, elapsed: now - started)))
            effects.append(.publish)
        }
    }

    /// `workspace=… reconcile in progress for 2m: applying, 12,000 of 160,000 (7%), about 4m left`.
    static func progressLine(workspace: String, _ snapshot: ReconcileWatch.Snapshot, elapsed: Duration) -> String {
        var line = "workspace=\(workspace) reconcile in progress for \(ServeSettings.describe(elapsed)): "
        guard let step = snapshot.step, snapshot.total > 0 else {
            return line + "planning (reading the manifests, the inventory and state)"
        }
        let noun = step == "applying" ? "token change" : "registration"
        let percent = Int(Double(snapshot.done) * 100 / Double(snapshot.total))
        line +=
            "\(step), \(PlanRenderer.formatCount(snapshot.done)) of \(PlanRenderer.counted(snapshot.total, noun)) (\(percent)%)"
        if let eta = snapshot.etaSeconds {
            line += ", about \(ServeSettings.describe(.seconds(max(1, eta.rounded())))) left at the rate so far"
        }
        if let since = snapshot.retryingSince {
            line +=
                "; FCM failing since \(ServeSettings.describe(elapsed - (since - snapshot.started))) ago: \(snapshot.answer ?? "no answer")"
        }
        return line
    }

    private mutating func reconciled(
        _ reported: ReconcileResult, shuttingDown: Bool, _ moment: Moment, _ effects: inout [Effect]
    ) {
        var result = reported
        reconciling = false
        reconcileStarted = nil
        progressSaid = nil
        status.reconcileStartedAt = nil
        status.progress = nil
        // What FCM answered stays said after a failure; anything else means FCM answered.
        if result.outcome != .failure { status.fcmTrouble = nil }
        let name = status.workspace
        if shuttingDown, result.outcome != .success {
            // Stopped between journal steps by the shutdown: not a failure of the workspace.
            status.phase = .stopped
            effects.append(
                .log(
                    "reconcile workspace=\(name) stopped by the shutdown: what finished is journaled, and the next owner resumes it"
                ))
            finish(&effects)
            return
        }
        result.held = held(result.held, at: moment.wall, &effects)
        effects.append(.measure(result))
        failures = result.outcome == .failure ? failures + 1 : 0
        status.last = result
        status.ready = result.outcome == .success
        status.phase = WorkspacePhase(result.outcome)
        status.consecutiveFailures = failures
        if result.outcome == .success { status.lastSuccessAt = result.finishedAt }
        if result.changedDevices != nil, result.outcome == .success, let due = nextRun {
            // A batch of changed devices leaves the schedule of whole reconciles (the resync) as it was.
            effects.append(
                .log(
                    Self.line(workspace: name, result, next: max(.zero, due - moment.now)),
                    level: Self.level(of: result)))
        } else {
            var wait = config.settings.wait(afterFailures: failures)
            if failures == 0, let resync = config.resync {
                // A workspace that follows its changes reads everything again at least every 'resync'.
                wait = min(wait, resync)
            }
            let jitter = Int64(Timing.seconds(config.settings.jitter) * 1000)
            if jitter > 0 { wait += .milliseconds(Int64(moment.draw % UInt64(jitter + 1))) }
            if result.outcome == .success, result.windowClosed, let opens = result.windowOpensAt,
                result.changesWaiting > 0 || (result.driftFound > 0 && !result.driftHealed)
            {
                // What the windows held back is applied when they open, not at the next scheduled reconcile.
                let untilOpen = Duration.milliseconds(Int64(max(0, opens.timeIntervalSince(moment.wall)) * 1000))
                wait = min(wait, untilOpen + .seconds(1))
            }
            nextRun = moment.now + wait
            status.nextRunAt = moment.wall.addingTimeInterval(Timing.seconds(wait))
            effects.append(.log(Self.line(workspace: name, result, next: wait), level: Self.level(of: result)))
        }
        effects.append(.notify(result))
        effects.append(.publish)
        if stopping { finish(&effects) }
    }

    /// The holds a reconcile reported (nil: it made no plan, and what was held still is), each with
    /// the time it was first held; the status takes them on, and the log says what is newly held
    /// and what was released.
    private mutating func held(_ reported: [HeldChange]?, at wall: Date, _ effects: inout [Effect]) -> [HeldChange]? {
        let before = status.held ?? []
        guard let reported else { return status.held }
        let name = status.workspace
        var now = reported
        for index in now.indices {
            let was = before.first { $0.subject == now[index].subject && $0.rail == now[index].rail }
            now[index].since = was?.since ?? now[index].since ?? wall
            if was == nil {
                effects.append(
                    .log(
                        "workspace=\(name) \(now[index].subject) is held by \(now[index].rail)\(now[index].at.map { " (\($0))" } ?? ""): its changes wait, everything else is applied. \(now[index].message)",
                        level: .warning))
            }
        }
        let still = Set(now.map(\.subject))
        for gone in before where !still.contains(gone.subject) {
            effects.append(
                .log(
                    "workspace=\(name) \(gone.subject) is released: its plan passes \(gone.rail) now (the manifests changed, the rail was raised, or a person applied it)"
                ))
        }
        status.held = now.isEmpty ? nil : now
        return now
    }

    private mutating func finish(_ effects: inout [Effect]) {
        finished = true
        if owned {
            if status.phase != .stopped { status.phase = .stopped }
            effects.append(.publish)
        }
        effects.append(.release(owned: owned))
        if owned { effects.append(.lead(false)) }
        owned = false
    }

    /// The level of a reconcile's log line: a failure is an error, a rail's refusal or a state lock
    /// another run held through the wait a warning.
    static func level(of result: ReconcileResult) -> ServeLog.Level {
        switch result.outcome {
        case .success: .info
        case .blocked: .warning
        // Another run (a person's apply) held the state lock through the wait: retried, not broken.
        case .failure
        where result.reason == FailureReason.stateLocked.rawValue || result.reason == FailureReason.leaseLost.rawValue:
            .warning
        case .failure: .error
        }
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
