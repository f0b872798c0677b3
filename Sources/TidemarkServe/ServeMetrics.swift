import Foundation
import Prometheus
import TidemarkCore

/// `serve`'s metrics, in Prometheus's text format on `/metrics`.
///
/// Made on swift-prometheus's collector registry (the Prometheus backend of swift-metrics), one
/// registry per `serve`, never the process-wide default: each family carries its HELP text, which
/// `promtool check metrics` asks for and an on-call engineer reads. Labels are the workspace and a
/// few fixed words; no token, device id or user id is ever a label.
public final class ServeMetrics: Sendable {
    /// The registry the families live in.
    public let registry = PrometheusCollectorRegistry()

    /// A registry with every family declared, so a scrape before the first reconcile already lists them.
    public init() {}

    /// The exposition, as `/metrics` answers it.
    public func exposition() -> [UInt8] {
        var buffer: [UInt8] = []
        buffer.reserveCapacity(8192)
        registry.emit(into: &buffer)
        return buffer
    }

    static let durationBuckets: [Duration] = [
        .milliseconds(100), .milliseconds(250), .milliseconds(500), .seconds(1), .seconds(2), .seconds(5),
        .seconds(10), .seconds(30), .seconds(60), .seconds(120), .seconds(300), .seconds(600), .seconds(1800),
    ]

    /// Declares a workspace's series with their starting values (0, or not ready).
    public func declare(workspace: String, settings: ServeSettings, quota: Double) {
        for outcome in ReconcileResult.Outcome.allCases {
            _ = reconcileTotal(workspace, outcome)
        }
        for op in ["subscribe", "unsubscribe", "group"] { _ = changes(workspace, op) }
        for kind in ["read", "write"] { _ = fcmRequests(workspace, kind, "sent") }
        gauge("tidemark_workspace_ready", workspace, Self.readyHelp).set(to: 0)
        gauge("tidemark_workspace_suspended", workspace, Self.suspendedHelp).set(to: settings.suspend ? 1 : 0)
        gauge("tidemark_workspace_leader", workspace, Self.leaderHelp).set(to: 0)
        gauge("tidemark_changes_waiting", workspace, Self.waitingHelp).set(to: 0)
        gauge("tidemark_inventory_changes_waiting", workspace, Self.inventoryWaitingHelp).set(to: 0)
        gauge("tidemark_fcm_quota_per_second", workspace, Self.quotaHelp).set(to: quota)
        _ = gauge("tidemark_last_success_timestamp_seconds", workspace, Self.lastSuccessHelp)
        _ = gauge("tidemark_managed_memberships", workspace, Self.managedHelp)
        _ = handovers(workspace)
        _ = changeBatches(workspace)
        _ = divergences(workspace)
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
        gauge("tidemark_workspace_ready", workspace, Self.readyHelp).set(to: result.outcome == .success ? 1 : 0)
        if result.outcome == .success {
            gauge("tidemark_last_success_timestamp_seconds", workspace, Self.lastSuccessHelp).set(
                to: result.finishedAt.timeIntervalSince1970)
        }
        changes(workspace, "subscribe").increment(by: Int64(result.subscribed))
        changes(workspace, "unsubscribe").increment(by: Int64(result.unsubscribed))
        changes(workspace, "group").increment(by: Int64(result.groupCalls))
        fcmRequests(workspace, "write", "sent").increment(by: Int64(result.writeRequests))
        fcmRequests(workspace, "read", "sent").increment(by: Int64(result.readRequests))
        gauge("tidemark_changes_waiting", workspace, Self.waitingHelp).set(to: Double(result.changesWaiting))
        if let managed = result.managedMemberships {
            gauge("tidemark_managed_memberships", workspace, Self.managedHelp).set(to: Double(managed))
        }
        if let drift = result.drift {
            for (kind, label) in [("dropped", "dropped"), ("self_subscribed", "foreign"), ("opted_out", "opt_out")] {
                registry.makeGauge(
                    name: "tidemark_drift_memberships", labels: [("workspace", workspace), ("kind", label)],
                    help: Self.driftHelp
                ).set(to: Double(drift[kind] ?? 0))
            }
        }
    }

    /// Records how many device changes the inventory reported that no reconcile has started on yet.
    public func inventoryChangesWaiting(workspace: String, _ count: Int) {
        gauge("tidemark_inventory_changes_waiting", workspace, Self.inventoryWaitingHelp).set(to: Double(count))
    }

    /// Records that a source's changes could not be trusted and it is read in full.
    public func inventoryFullRead(workspace: String, source: String) {
        registry.makeCounter(
            name: "tidemark_inventory_full_reads_total", labels: [("workspace", workspace), ("source", source)],
            help:
                "Times a source's changes could not be trusted (a lost LISTEN connection, a cursor that went backwards, a truncated table, changes unreadable for a while) and the next reconcile read it in full because of it."
        ).increment()
    }

    /// Records that the workspace is suspended or resumed.
    public func suspended(workspace: String, _ suspended: Bool) {
        gauge("tidemark_workspace_suspended", workspace, Self.suspendedHelp).set(to: suspended ? 1 : 0)
    }

    /// Records whether this replica owns the workspace.
    public func leader(workspace: String, _ leader: Bool) {
        gauge("tidemark_workspace_leader", workspace, Self.leaderHelp).set(to: leader ? 1 : 0)
    }

    /// Declares a webhook's series, so a scrape lists them before its first event.
    public func declareNotifications(target: String) {
        for outcome in [true, false] { _ = notifications(target, "blocked", outcome) }
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

    static let readyHelp = "1 when the workspace's last reconcile succeeded, else 0."
    static let suspendedHelp = "1 while the workspace is suspended (nothing is reconciled)."
    static let leaderHelp = "1 on the replica that reconciles the workspace."
    static let waitingHelp = "Changes planned but not applied (on_change: plan, or a blocked plan)."
    static let inventoryWaitingHelp =
        "Device changes the inventory reported (rows past a source's cursor, notifications on its channel) that no reconcile has started on yet."
    static let managedHelp =
        "Memberships tidemark manages in the workspace after its last reconcile: topic members and device-group or audience members."
    static let quotaHelp = "The FCM write quota tidemark keeps to, in changes per second."
    static let lastSuccessHelp = "When the workspace's last successful reconcile ended, in seconds since 1970."
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

    private func fcmRequests(_ workspace: String, _ kind: String, _ outcome: String) -> Counter {
        registry.makeCounter(
            name: "tidemark_fcm_requests_total",
            labels: [("workspace", workspace), ("kind", kind), ("outcome", outcome)],
            help: "Requests sent to FCM, by kind (read: the plans' refresh; write: changes).")
    }
}
