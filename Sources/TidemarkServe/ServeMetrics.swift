import Foundation
import Prometheus
import Synchronization
import TidemarkCore

/// `serve`'s metrics, in Prometheus's text format on `/metrics`.
///
/// Made on swift-prometheus's collector registry (the Prometheus backend of swift-metrics), one
/// registry per `serve`, never the process-wide default: each family carries its HELP text, which
/// `promtool check metrics` asks for and an on-call engineer reads. Labels are the workspace and a
/// few fixed words; no token, device id or user id is ever a label.
///
/// A workspace's health (its phase, readiness, last success, owner, what waits and what it manages)
/// is the owner's truth, and only the replica that owns the workspace exports it: a standby exports
/// none of those series (it exports `tidemark_workspace_leader 0`, the workspace's info and its
/// counters), so `max by (workspace)` over every replica is the owner's value whichever replicas
/// are scraped. A replica that loses a workspace removes its series at once.
public final class ServeMetrics: Sendable {
    /// The registry the families live in.
    public let registry = PrometheusCollectorRegistry()
    /// The workspaces this replica owns: the only ones whose owner-only series it exports.
    private let owned = Mutex<Set<String>>([])
    /// Reads the process's figures at each scrape.
    private let process: ProcessMetrics
    /// When the reconcile in flight of each workspace started.
    private let inFlight = Mutex<[String: Date]>([:])
    /// The oldest last read of a registration of each workspace's fleet (the drift sweep).
    private let sweptSince = Mutex<[String: Date]>([:])
    /// The `tidemark_held` series each workspace exports now.
    private let heldSeries = Mutex<[String: Set<Targets.Subject>]>([:])

    /// The most `tidemark_held` series one workspace exports (the first by kind and name); the count,
    /// `tidemark_held_changes`, counts them all. Names are manifest names, not user data, and a
    /// refusal of more than a few topics at once is one problem, not many.
    static let heldSeriesLimit = 20

    /// A registry with `tidemark_build_info` (`version`, `commit`) and the process's metrics; a
    /// workspace's families are declared by `declare(workspace:settings:quota:sources:)`.
    public init(version: String = "unknown", commit: String = "unknown", process: ProcessMetrics = ProcessMetrics()) {
        self.process = process
        registry.makeGauge(
            name: "tidemark_build_info", labels: [("version", version), ("commit", commit)],
            help: "Always 1: the version and commit of the tidemark binary that serves these metrics."
        ).set(to: 1)
    }

    /// The exposition, as `/metrics` answers it: the registry's families, then the process's
    /// (`process_cpu_seconds_total`, `process_resident_memory_bytes`, …, read at each scrape).
    public func exposition() -> [UInt8] {
        var buffer: [UInt8] = []
        buffer.reserveCapacity(8192)
        updateInProgress()
        registry.emit(into: &buffer)
        buffer += Array(process.exposition().utf8)
        return buffer
    }

    static let durationBuckets: [Duration] = [
        .milliseconds(100), .milliseconds(250), .milliseconds(500), .seconds(1), .seconds(2), .seconds(5),
        .seconds(10), .seconds(30), .seconds(60), .seconds(120), .seconds(300), .seconds(600), .seconds(1800),
    ]

    /// Declares a workspace's series that every replica exports, counters at 0 (`sources`: the
    /// inventory sources whose changes it follows, for `tidemark_inventory_full_reads_total`), and
    /// `tidemark_workspace_info{backend, project}`, 1 on every replica that runs the workspace. The
    /// owner's series come with ownership (`leader(workspace:_:replica:)`).
    public func declare(
        workspace: String, settings: ServeSettings, quota: Double, backend: String = "", project: String = "",
        sources: [String] = []
    ) {
        for outcome in ReconcileResult.Outcome.allCases {
            _ = reconcileTotal(workspace, outcome)
        }
        for op in ["subscribe", "unsubscribe", "group"] { _ = changes(workspace, op) }
        for kind in FCMAttempt.Kind.allCases {
            for (outcome, code) in FCMAttempt.outcomes { _ = fcmRequests(workspace, kind, outcome, code) }
        }
        for source in sources { _ = fullReads(workspace, source) }
        registry.makeGauge(
            name: "tidemark_workspace_info",
            labels: [("workspace", workspace), ("backend", backend), ("project", project)],
            help:
                "Always 1 on every replica that runs the workspace, with the backend and FCM project it reconciles against: the series to compare tidemark_workspace_owner with (a workspace with info and no owner has none)."
        ).set(to: 1)
        gauge("tidemark_workspace_leader", workspace, Self.leaderHelp).set(to: 0)
        gauge("tidemark_fcm_quota_per_second", workspace, Self.quotaHelp).set(to: quota)
        _ = handovers(workspace)
        _ = changeBatches(workspace)
        _ = divergences(workspace)
    }

    /// The phases `tidemark_workspace_phase` exports (an owner is never `standby` or `stopped`).
    static let exportedPhases: [WorkspacePhase] = WorkspacePhase.allCases.filter { $0 != .standby && $0 != .stopped }

    /// Exports the owner's view of the workspace from `status` (phase, readiness, last success, what
    /// waits), when this replica owns it; nothing otherwise.
    public func status(workspace: String, _ status: WorkspaceStatus) {
        guard owns(workspace) else { return }
        for phase in Self.exportedPhases {
            registry.makeGauge(
                name: "tidemark_workspace_phase", labels: [("workspace", workspace), ("phase", phase.rawValue)],
                help: Self.phaseHelp
            ).set(to: status.phase == phase ? 1 : 0)
        }
        gauge("tidemark_workspace_ready", workspace, Self.readyHelp).set(to: status.ready ? 1 : 0)
        gauge("tidemark_workspace_suspended", workspace, Self.suspendedHelp).set(to: status.suspended ? 1 : 0)
        if let at = status.lastSuccessAt {
            gauge("tidemark_last_success_timestamp_seconds", workspace, Self.lastSuccessHelp).set(
                to: at.timeIntervalSince1970)
        }
        if let waiting = status.inventoryChangesWaiting {
            gauge("tidemark_inventory_changes_waiting", workspace, Self.inventoryWaitingHelp).set(to: Double(waiting))
        }
        held(workspace: workspace, status.held ?? [])
    }

    /// Exports what a rail holds: `tidemark_held_changes` counts them, and `tidemark_held` is 1 for
    /// each (at most `heldSeriesLimit`); a released one's series goes.
    private func held(workspace: String, _ held: [HeldChange]) {
        gauge("tidemark_held_changes", workspace, Self.heldCountHelp).set(to: Double(held.count))
        let now = Set(
            held.map(\.subject).sorted { ($0.kind.rawValue, $0.name) < ($1.kind.rawValue, $1.name) }.prefix(
                Self.heldSeriesLimit))
        let before = heldSeries.withLock { series in
            defer { series[workspace] = now }
            return series[workspace] ?? []
        }
        for subject in before.subtracting(now) { registry.unregisterGauge(heldGauge(workspace, subject)) }
        for subject in now { heldGauge(workspace, subject).set(to: 1) }
    }

    private func heldGauge(_ workspace: String, _ subject: Targets.Subject) -> Gauge {
        registry.makeGauge(
            name: "tidemark_held",
            labels: [("workspace", workspace), ("kind", subject.kind.rawValue), ("name", subject.name)],
            help: Self.heldHelp)
    }

    /// Whether this replica owns `workspace` (exports its owner-only series).
    private func owns(_ workspace: String) -> Bool { owned.withLock { $0.contains(workspace) } }

    /// Removes the owner-only series of `workspace`, `replica`'s owner series included.
    private func withdraw(workspace: String, replica: String) {
        var gauges = [
            ("tidemark_workspace_ready", Self.readyHelp),
            ("tidemark_last_success_timestamp_seconds", Self.lastSuccessHelp),
            ("tidemark_changes_waiting", Self.waitingHelp),
            ("tidemark_inventory_changes_waiting", Self.inventoryWaitingHelp),
            ("tidemark_managed_memberships", Self.managedHelp), ("tidemark_workspace_suspended", Self.suspendedHelp),
            ("tidemark_reconcile_in_progress_seconds", Self.inProgressHelp),
            ("tidemark_reconcile_changes_applied", Self.appliedHelp),
            ("tidemark_reconcile_changes_planned", Self.plannedHelp),
            ("tidemark_drift_sweep_oldest_read_seconds", Self.sweepHelp),
            ("tidemark_drift_sweep_unread_registrations", Self.unreadHelp),
            ("tidemark_held_changes", Self.heldCountHelp),
        ].map { gauge($0.0, workspace, $0.1) }
        sweptSince.withLock { $0[workspace] = nil }
        let held = heldSeries.withLock { $0.removeValue(forKey: workspace) ?? [] }
        gauges += held.map { heldGauge(workspace, $0) }
        gauges += Self.exportedPhases.map {
            registry.makeGauge(
                name: "tidemark_workspace_phase", labels: [("workspace", workspace), ("phase", $0.rawValue)],
                help: Self.phaseHelp)
        }
        gauges += Self.driftKinds.map {
            registry.makeGauge(
                name: "tidemark_drift_memberships", labels: [("workspace", workspace), ("kind", $0.label)],
                help: Self.driftHelp)
        }
        gauges.append(
            registry.makeGauge(
                name: "tidemark_workspace_owner", labels: [("workspace", workspace), ("replica", replica)],
                help: Self.ownerHelp))
        for gauge in gauges { registry.unregisterGauge(gauge) }
    }

    private func changeBatches(_ workspace: String) -> Counter {
        registry.makeCounter(
            name: "tidemark_change_batches_total", labels: [("workspace", workspace)],
            help:
                "Reconciles that planned a batch of changed devices on their own (from what the last whole reconcile left in memory), not the whole inventory."
        )
    }

    private func divergences(_ workspace: String) -> Counter {
        registry.makeCounter(
            name: "tidemark_resync_divergences_total", labels: [("workspace", workspace)],
            help:
                "Devices a whole reconcile (the resync) found whose memberships the batches of changed devices had not brought to what the whole read says; each was corrected by it. Anything but 0 is a defect or a change the cursor passed over: see the log."
        )
    }

    /// Records that this replica handed the workspace over to one that owns fewer.
    public func handover(workspace: String) {
        handovers(workspace).increment()
    }

    /// Records how many replicas this one sees running its workspaces (itself included).
    public func replicas(_ count: Int) {
        registry.makeGauge(
            name: "tidemark_serve_replicas",
            help: "Replicas this one sees running its workspaces, itself included (presences renewed with each claim)."
        ).set(to: Double(count))
    }

    private func handovers(_ workspace: String) -> Counter {
        registry.makeCounter(
            name: "tidemark_workspace_handovers_total", labels: [("workspace", workspace)],
            help:
                "Times this replica handed the workspace over, between two reconciles, to a replica that owned fewer workspaces."
        )
    }

    /// Records one reconcile's result.
    public func record(workspace: String, _ result: ReconcileResult) {
        registry.makeDurationHistogram(
            name: "tidemark_reconcile_duration_seconds",
            labels: [("workspace", workspace), ("result", result.outcome.rawValue)], buckets: Self.durationBuckets,
            help: "How long a reconcile took, by workspace and result."
        ).record(.milliseconds(Int64(result.seconds * 1000)))
        reconcileTotal(workspace, result.outcome).increment()
        if result.changedDevices != nil { changeBatches(workspace).increment() }
        if let found = result.divergences, found > 0 { divergences(workspace).increment(by: Int64(found)) }
        changes(workspace, "subscribe").increment(by: Int64(result.subscribed))
        changes(workspace, "unsubscribe").increment(by: Int64(result.unsubscribed))
        changes(workspace, "group").increment(by: Int64(result.groupCalls))
        // The rest is the owner's view: a reconcile that ends after this replica lost the workspace
        // leaves it to the new owner. Readiness and the last success come from the status the
        // machine publishes after each reconcile (`status(workspace:_:)`), their one writer.
        guard owns(workspace) else { return }
        gauge("tidemark_changes_waiting", workspace, Self.waitingHelp).set(to: Double(result.changesWaiting))
        if let managed = result.managedMemberships {
            gauge("tidemark_managed_memberships", workspace, Self.managedHelp).set(to: Double(managed))
        }
        if let sweep = result.sweep {
            sweptSince.withLock { $0[workspace] = sweep.oldestReadAt }
            gauge("tidemark_drift_sweep_unread_registrations", workspace, Self.unreadHelp).set(
                to: Double(sweep.neverRead))
        }
        if let drift = result.drift {
            for (kind, label) in Self.driftKinds {
                registry.makeGauge(
                    name: "tidemark_drift_memberships", labels: [("workspace", workspace), ("kind", label)],
                    help: Self.driftHelp
                ).set(to: Double(drift[kind] ?? 0))
            }
        }
    }

    /// The drift counts a reconcile reports, and their `kind` labels.
    static let driftKinds: [(kind: String, label: String)] = [
        ("dropped", "dropped"), ("self_subscribed", "foreign"), ("opted_out", "opt_out"),
    ]

    /// Records how many device changes the inventory reported that no reconcile has started on yet
    /// (the owner's; nothing on a standby).
    public func inventoryChangesWaiting(workspace: String, _ count: Int) {
        guard owns(workspace) else { return }
        gauge("tidemark_inventory_changes_waiting", workspace, Self.inventoryWaitingHelp).set(to: Double(count))
    }

    /// Records that a source's changes could not be trusted and it is read in full.
    public func inventoryFullRead(workspace: String, source: String) {
        fullReads(workspace, source).increment()
    }

    private func fullReads(_ workspace: String, _ source: String) -> Counter {
        registry.makeCounter(
            name: "tidemark_inventory_full_reads_total", labels: [("workspace", workspace), ("source", source)],
            help:
                "Times a source's changes could not be trusted (a lost LISTEN connection, a cursor that went backwards, a truncated table, changes unreadable for a while) and the next reconcile read it in full because of it."
        )
    }

    /// Records that the workspace is suspended or resumed.
    public func suspended(workspace: String, _ suspended: Bool) {
        guard owns(workspace) else { return }
        gauge("tidemark_workspace_suspended", workspace, Self.suspendedHelp).set(to: suspended ? 1 : 0)
    }

    /// Records whether this replica (`replica`) owns the workspace: an owner exports
    /// `tidemark_workspace_owner{replica} 1` and the owner-only series from here on (its status,
    /// `status(workspace:_:)`, fills them); a replica that stops owning it removes them.
    public func leader(workspace: String, _ leader: Bool, replica: String, status: WorkspaceStatus? = nil) {
        gauge("tidemark_workspace_leader", workspace, Self.leaderHelp).set(to: leader ? 1 : 0)
        let changed = owned.withLock { leader ? $0.insert(workspace).inserted : $0.remove(workspace) != nil }
        guard leader else {
            if changed { withdraw(workspace: workspace, replica: replica) }
            return
        }
        registry.makeGauge(
            name: "tidemark_workspace_owner", labels: [("workspace", workspace), ("replica", replica)],
            help: Self.ownerHelp
        ).set(to: 1)
        gauge("tidemark_changes_waiting", workspace, Self.waitingHelp).set(to: 0)
        gauge("tidemark_held_changes", workspace, Self.heldCountHelp).set(to: 0)
        _ = gauge("tidemark_managed_memberships", workspace, Self.managedHelp)
        _ = gauge("tidemark_reconcile_in_progress_seconds", workspace, Self.inProgressHelp)
        _ = progressGauges(workspace)
        if let status { self.status(workspace: workspace, status) }
    }

    /// Declares a webhook's series for each event it is sent, so a scrape lists them before its first.
    public func declareNotifications(target: String, events: Set<NotifyTarget.Event> = Set(NotifyTarget.Event.allCases))
    {
        for event in NotifyTarget.Event.allCases where events.contains(event) {
            for outcome in [true, false] { _ = notifications(target, event.rawValue, outcome) }
        }
    }

    /// Records one delivery of `event` to `target`: delivered, or given up after its retries.
    public func notification(target: String, event: String, delivered: Bool) {
        notifications(target, event, delivered).increment()
    }

    private func notifications(_ target: String, _ event: String, _ delivered: Bool) -> Counter {
        registry.makeCounter(
            name: "tidemark_notifications_total",
            labels: [("target", target), ("event", event), ("outcome", delivered ? "delivered" : "failed")],
            help:
                "Webhook deliveries of serve.notify, by target (its name), event and outcome (delivered, or failed after every retry)."
        )
    }

    static let readyHelp =
        "1 when the workspace's last reconcile succeeded, else 0; exported by the replica that owns the workspace only."
    static let phaseHelp =
        "1 for the workspace's current phase (pending, reconciling, ready, degraded, failing, blocked, suspended), 0 for the others; exported by the replica that owns the workspace only."
    static let ownerHelp =
        "1, on the replica that owns the workspace, labelled with that replica (host/process); no series when no replica owns it."
    static let suspendedHelp =
        "1 while the workspace is suspended (nothing is reconciled); exported by the replica that owns the workspace only."
    static let leaderHelp = "1 on the replica that reconciles the workspace."
    static let waitingHelp = "Changes planned but not applied (on_change: plan, or a blocked plan)."
    static let heldCountHelp =
        "Topics and device groups a rail holds (their changes wait; everything else is applied); exported by the replica that owns the workspace only."
    static let heldHelp =
        "1 for each topic or device group a rail holds (kind: topic or group; name: its manifest name; at most 20 per workspace, tidemark_held_changes counts all); exported by the replica that owns the workspace only."
    static let inventoryWaitingHelp =
        "Device changes the inventory reported (rows past a source's cursor, notifications on its channel) that no reconcile has started on yet."
    static let managedHelp =
        "Memberships tidemark manages in the workspace after its last reconcile: topic members and device-group or audience members."
    static let quotaHelp = "The FCM write quota tidemark keeps to, in changes per second."
    static let lastSuccessHelp =
        "When the workspace's last successful reconcile ended, in seconds since 1970 (the owner's; absent before the first)."
    static let driftHelp =
        "Memberships found drifted at the last drift check: dropped (a declared device left a topic), foreign (a device subscribed itself to an authoritative topic), opt_out (a user's choice, respected)."

    private func gauge(_ name: String, _ workspace: String, _ help: String) -> Gauge {
        registry.makeGauge(name: name, labels: [("workspace", workspace)], help: help)
    }

    private func reconcileTotal(_ workspace: String, _ outcome: ReconcileResult.Outcome) -> Counter {
        registry.makeCounter(
            name: "tidemark_reconcile_total", labels: [("workspace", workspace), ("result", outcome.rawValue)],
            help: "Reconciles, by workspace and result (success, failure, blocked).")
    }

    private func changes(_ workspace: String, _ op: String) -> Counter {
        registry.makeCounter(
            name: "tidemark_changes_total", labels: [("workspace", workspace), ("op", op)],
            help: "Changes made in FCM: memberships subscribed and unsubscribed, and device-group calls.")
    }

    /// Counts one attempt of a request to FCM, as it ended.
    public func fcmAttempt(workspace: String, _ attempt: FCMAttempt) {
        fcmRequests(workspace, attempt.kind, attempt.outcome, attempt.code).increment()
    }

    private func fcmRequests(
        _ workspace: String, _ kind: FCMAttempt.Kind, _ outcome: FCMAttempt.Outcome, _ code: String
    ) -> Counter {
        registry.makeCounter(
            name: "tidemark_fcm_requests_total",
            labels: [
                ("workspace", workspace), ("kind", kind.rawValue), ("outcome", outcome.rawValue), ("code", code),
            ],
            help:
                "Attempts of requests to FCM as they ended, by kind (read: refresh and drift checks; write: changes), outcome (success; retried: failed and tried again; failed: not retried, such as an unregistered token's 404, or the retries gave up) and code (the status class 2xx, 4xx, 429, 5xx, or network when nothing answered)."
        )
    }

    /// Records that a reconcile of `workspace` started at `since` (nil: none runs now).
    public func reconciling(workspace: String, since: Date?) {
        inFlight.withLock { $0[workspace] = since }
        guard owns(workspace) else { return }
        for gauge in progressGauges(workspace) { gauge.set(to: 0) }
    }

    /// Records how far the reconcile in flight has got: the token changes it has sent of those
    /// planned, once it applies.
    public func progress(workspace: String, _ snapshot: ReconcileWatch.Snapshot) {
        guard owns(workspace), snapshot.step == "applying" else { return }
        let gauges = progressGauges(workspace)
        gauges[0].set(to: Double(snapshot.done))
        gauges[1].set(to: Double(snapshot.total))
    }

    private func progressGauges(_ workspace: String) -> [Gauge] {
        [
            gauge("tidemark_reconcile_changes_applied", workspace, Self.appliedHelp),
            gauge("tidemark_reconcile_changes_planned", workspace, Self.plannedHelp),
        ]
    }

    /// Sets `tidemark_reconcile_in_progress_seconds` of the workspaces this replica owns, as of now.
    private func updateInProgress() {
        let now = Date()
        let running = inFlight.withLock { $0 }
        let swept = sweptSince.withLock { $0 }
        for workspace in owned.withLock({ $0 }) {
            let seconds = running[workspace].map { max(0, now.timeIntervalSince($0)) } ?? 0
            gauge("tidemark_reconcile_in_progress_seconds", workspace, Self.inProgressHelp).set(to: seconds)
            if let oldest = swept[workspace] {
                gauge("tidemark_drift_sweep_oldest_read_seconds", workspace, Self.sweepHelp).set(
                    to: max(0, now.timeIntervalSince(oldest)))
            }
        }
    }

    static let sweepHelp =
        "Seconds since the oldest last read of a registration of the fleet (the drift sweep): drift in a registration is seen and healed only once it is read again, so this bounds how long drift can go unseen. Exported by the owner after a reconcile that read FCM."
    static let unreadHelp =
        "Registrations of the fleet the drift sweep has never read (their drift is unseen until it does); exported by the owner after a reconcile that read FCM."

    static let inProgressHelp =
        "Seconds the reconcile in flight has run, 0 when none runs; exported by the replica that owns the workspace only."
    static let appliedHelp =
        "Token changes the reconcile in flight has sent so far (0 before it applies, and between reconciles); exported by the replica that owns the workspace only."
    static let plannedHelp =
        "Token changes the reconcile in flight's apply planned (0 before it applies, and between reconciles); exported by the replica that owns the workspace only."
}
