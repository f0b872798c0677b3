import Foundation
import Testing
import TidemarkCore

@testable import TidemarkServe

/// `/metrics` means the same whichever replica is scraped: a workspace's health is exported by its
/// owner only, every counter is there at 0 from the start, and the build and the process are
/// described as Prometheus's conventions name them.
@Suite struct ServeMetricsTests {
    static func status(_ phase: WorkspacePhase, ready: Bool = false, lastSuccess: Date? = nil) -> WorkspaceStatus {
        var status = WorkspaceStatus(
            phase: phase, ready: ready, workspace: "prod", state: "state.db", manifests: "manifests",
            backend: "fcm (project p)", settings: [:], suspended: phase == .suspended, replica: "vm/1")
        status.lastSuccessAt = lastSuccess
        return status
    }

    /// The exposition's sample lines (no HELP or TYPE).
    static func samples(_ metrics: ServeMetrics) -> [String] {
        String(decoding: metrics.exposition(), as: UTF8.self).split(separator: "\n").map(String.init)
            .filter { !$0.hasPrefix("#") }
    }

    static func lines(_ metrics: ServeMetrics, _ family: String) -> [String] {
        samples(metrics).filter { $0.hasPrefix(family + "{") || $0.hasPrefix(family + " ") }
    }

    static func declared(sources: [String] = []) -> ServeMetrics {
        let metrics = ServeMetrics(version: "0.1.0", commit: "abc1234")
        metrics.declare(
            workspace: "prod", settings: ServeSettings(), quota: 3000, backend: "fcm", project: "p", sources: sources)
        return metrics
    }

    @Test func aStandbyExportsNoneOfTheOwnersSeriesAndTheOwnerExportsItsPhase() {
        let standby = Self.declared()
        for family in [
            "tidemark_workspace_ready", "tidemark_workspace_phase", "tidemark_last_success_timestamp_seconds",
            "tidemark_workspace_owner", "tidemark_changes_waiting", "tidemark_managed_memberships",
            "tidemark_workspace_suspended",
        ] {
            #expect(Self.lines(standby, family).isEmpty, "a standby exports \(family)")
        }
        #expect(
            Self.lines(standby, "tidemark_workspace_leader") == [#"tidemark_workspace_leader{workspace="prod"} 0.0"#])
        #expect(
            Self.lines(standby, "tidemark_workspace_info") == [
                #"tidemark_workspace_info{workspace="prod",backend="fcm",project="p"} 1.0"#
            ])
        // A reconcile that ends on a replica that no longer owns the workspace counts, and says no more.
        var result = ReconcileResult(outcome: .success, startedAt: Date(timeIntervalSince1970: 100), seconds: 2)
        result.subscribed = 3
        standby.record(workspace: "prod", result)
        #expect(Self.lines(standby, "tidemark_workspace_ready").isEmpty)
        #expect(Self.samples(standby).contains(#"tidemark_changes_total{workspace="prod",op="subscribe"} 3"#))

        let owner = Self.declared()
        owner.leader(workspace: "prod", true, replica: "vm/1#a", status: Self.status(.pending))
        #expect(
            Self.lines(owner, "tidemark_workspace_owner") == [
                #"tidemark_workspace_owner{workspace="prod",replica="vm/1#a"} 1.0"#
            ])
        #expect(Self.lines(owner, "tidemark_workspace_ready") == [#"tidemark_workspace_ready{workspace="prod"} 0.0"#])
        let phases = Self.lines(owner, "tidemark_workspace_phase")
        #expect(
            phases.count == 7
                && phases.filter { $0.hasSuffix(" 1.0") } == [
                    #"tidemark_workspace_phase{workspace="prod",phase="pending"} 1.0"#
                ])
        #expect(Self.lines(owner, "tidemark_last_success_timestamp_seconds").isEmpty, "no success yet")
        owner.suspended(workspace: "prod", true)
        #expect(
            Self.lines(owner, "tidemark_workspace_suspended") == [
                #"tidemark_workspace_suspended{workspace="prod"} 1.0"#
            ])
        standby.suspended(workspace: "prod", true)
        #expect(Self.lines(standby, "tidemark_workspace_suspended").isEmpty, "only the owner reads the requests")

        owner.status(
            workspace: "prod", Self.status(.ready, ready: true, lastSuccess: Date(timeIntervalSince1970: 1_700_000_000))
        )
        #expect(
            Self.lines(owner, "tidemark_workspace_phase").filter { $0.hasSuffix(" 1.0") } == [
                #"tidemark_workspace_phase{workspace="prod",phase="ready"} 1.0"#
            ])
        #expect(Self.lines(owner, "tidemark_workspace_ready") == [#"tidemark_workspace_ready{workspace="prod"} 1.0"#])
        #expect(
            Self.lines(owner, "tidemark_last_success_timestamp_seconds") == [
                #"tidemark_last_success_timestamp_seconds{workspace="prod"} 1700000000.0"#
            ])

        // Handed over: every owner-only series goes at once.
        owner.leader(workspace: "prod", false, replica: "vm/1#a")
        for family in [
            "tidemark_workspace_ready", "tidemark_workspace_phase", "tidemark_last_success_timestamp_seconds",
            "tidemark_workspace_owner", "tidemark_changes_waiting", "tidemark_managed_memberships",
            "tidemark_workspace_suspended", "tidemark_reconcile_in_progress_seconds",
            "tidemark_reconcile_changes_applied", "tidemark_reconcile_changes_planned",
        ] {
            #expect(Self.lines(owner, family).isEmpty, "a replica that lost the workspace exports \(family)")
        }
        #expect(Self.lines(owner, "tidemark_workspace_leader") == [#"tidemark_workspace_leader{workspace="prod"} 0.0"#])
        owner.status(workspace: "prod", Self.status(.failing))
        #expect(Self.lines(owner, "tidemark_workspace_phase").isEmpty, "a standby's status exports nothing")
    }

    @Test func everyCounterIsThereAtZeroAndTheBuildAndProcessAreDescribed() throws {
        let metrics = Self.declared(sources: ["app-db"])
        metrics.declareNotifications(target: "oncall", events: [.blocked, .applyFailed])
        let samples = Self.samples(metrics)
        for line in [
            #"tidemark_inventory_full_reads_total{workspace="prod",source="app-db"} 0"#,
            #"tidemark_notifications_total{target="oncall",event="blocked",outcome="failed"} 0"#,
            #"tidemark_notifications_total{target="oncall",event="apply_failed",outcome="delivered"} 0"#,
            #"tidemark_reconcile_total{workspace="prod",result="blocked"} 0"#,
            #"tidemark_resync_divergences_total{workspace="prod"} 0"#,
            #"tidemark_build_info{version="0.1.0",commit="abc1234"} 1.0"#,
        ] {
            #expect(samples.contains(line), "missing \(line)")
        }
        #expect(!samples.contains { $0.contains(#"event="recovered""#) }, "a target is declared for its events only")
        let process = Dictionary(
            samples.filter { $0.hasPrefix("process_") }.map {
                let parts = $0.split(separator: " ")
                return (String(parts[0]), Double(parts[1]) ?? -1)
            }, uniquingKeysWith: { first, _ in first })
        #expect(
            Set(process.keys) == [
                "process_cpu_seconds_total", "process_resident_memory_bytes", "process_virtual_memory_bytes",
                "process_start_time_seconds", "process_open_fds", "process_max_fds",
            ])
        #expect((process["process_resident_memory_bytes"] ?? 0) > 1_000_000)
        #expect((process["process_open_fds"] ?? 0) >= 3)
        let started = process["process_start_time_seconds"] ?? 0
        #expect(started > Date().timeIntervalSince1970 - 86_400 * 30 && started <= Date().timeIntervalSince1970 + 1)
    }

    @Test func fcmAttemptsAreCountedByOutcomeAndCodeAndAReconcileInFlightShowsItsProgress() {
        let metrics = Self.declared()
        let zero = Self.lines(metrics, "tidemark_fcm_requests_total")
        #expect(zero.count == 18 && zero.allSatisfy { $0.hasSuffix(" 0") }, "every kind, outcome and code at 0")
        metrics.fcmAttempt(
            workspace: "prod", FCMAttempt(kind: .read, outcome: .retried, code: "5xx", cause: "HTTP 503", elapsed: 1))
        metrics.fcmAttempt(
            workspace: "prod", FCMAttempt(kind: .read, outcome: .retried, code: "5xx", cause: "HTTP 503", elapsed: 2))
        metrics.fcmAttempt(
            workspace: "prod", FCMAttempt(kind: .write, outcome: .success, code: "2xx", cause: "HTTP 200", elapsed: 0))
        let samples = Self.samples(metrics)
        #expect(
            samples.contains(
                #"tidemark_fcm_requests_total{workspace="prod",kind="read",outcome="retried",code="5xx"} 2"#))
        #expect(
            samples.contains(
                #"tidemark_fcm_requests_total{workspace="prod",kind="write",outcome="success",code="2xx"} 1"#))

        // The owner's reconcile in flight: its seconds so far, at each scrape, and what it has applied.
        #expect(Self.lines(metrics, "tidemark_reconcile_in_progress_seconds").isEmpty, "a standby's")
        metrics.leader(workspace: "prod", true, replica: "vm/1#a", status: Self.status(.pending))
        #expect(
            Self.lines(metrics, "tidemark_reconcile_in_progress_seconds") == [
                #"tidemark_reconcile_in_progress_seconds{workspace="prod"} 0.0"#
            ])
        metrics.reconciling(workspace: "prod", since: Date().addingTimeInterval(-90))
        var snapshot = ReconcileWatch.Snapshot(started: .zero)
        snapshot.step = "applying"
        snapshot.done = 1200
        snapshot.total = 5000
        metrics.progress(workspace: "prod", snapshot)
        let seconds = Self.lines(metrics, "tidemark_reconcile_in_progress_seconds").first?.split(separator: " ").last
        #expect(seconds.flatMap { Double($0) }.map { $0 >= 90 && $0 < 100 } == true)
        #expect(
            Self.lines(metrics, "tidemark_reconcile_changes_applied") == [
                #"tidemark_reconcile_changes_applied{workspace="prod"} 1200.0"#
            ])
        #expect(
            Self.lines(metrics, "tidemark_reconcile_changes_planned") == [
                #"tidemark_reconcile_changes_planned{workspace="prod"} 5000.0"#
            ])
        metrics.reconciling(workspace: "prod", since: nil)
        #expect(
            Self.lines(metrics, "tidemark_reconcile_in_progress_seconds") == [
                #"tidemark_reconcile_in_progress_seconds{workspace="prod"} 0.0"#
            ])
        #expect(
            Self.lines(metrics, "tidemark_reconcile_changes_applied") == [
                #"tidemark_reconcile_changes_applied{workspace="prod"} 0.0"#
            ])
    }

    @Test func theDriftSweepsCoverageIsTheOwnersAgeOfItsOldestRead() {
        let metrics = Self.declared()
        metrics.leader(workspace: "prod", true, replica: "vm/1#a", status: Self.status(.pending))
        let now = Int64(Date().timeIntervalSince1970)
        let coverage = RefreshCoverage(
            mode: .sample, fleet: 1000, read: 100, sampled: 100, budget: 100, neverRead: 450,
            oldestUnread: now - 3600, at: now)
        var result = ReconcileResult(outcome: .success, startedAt: Date(), seconds: 1)
        result.sweep = ReconcileResult.Sweep(coverage)
        #expect(result.sweep?.reconcilesToComplete == 5 && result.sweep?.neverRead == 450)
        metrics.record(workspace: "prod", result)
        let age = Self.lines(metrics, "tidemark_drift_sweep_oldest_read_seconds").first?.split(separator: " ").last
        #expect(age.flatMap { Double($0) }.map { $0 >= 3600 && $0 < 3700 } == true, "\(String(describing: age))")
        #expect(
            Self.lines(metrics, "tidemark_drift_sweep_unread_registrations") == [
                #"tidemark_drift_sweep_unread_registrations{workspace="prod"} 450.0"#
            ])
        // A whole read leaves nothing unread, and its oldest read is now.
        let whole = ReconcileResult.Sweep(RefreshCoverage(mode: .all, fleet: 1000, read: 1000, neverRead: 0, at: now))
        #expect(whole.neverRead == 0 && whole.reconcilesToComplete == nil)
        #expect(whole.oldestReadAt == Date(timeIntervalSince1970: TimeInterval(now)))
        metrics.leader(workspace: "prod", false, replica: "vm/1#a")
        #expect(Self.lines(metrics, "tidemark_drift_sweep_oldest_read_seconds").isEmpty, "the owner's only")
    }

    @Test func aCommandWithSpacesAndParenthesesIsReadRight() {
        let fields = ProcessMetrics.statFields("42 (tide (mark) x) S 1 42 42 0 -1 4194560 9 0 0 0 150 50 0 0 20 0")
        #expect(fields?.first == "S" && fields?[11] == "150" && fields?[12] == "50")
        #expect(ProcessMetrics(proc: "/nonexistent").exposition().isEmpty, "no /proc: no family rather than zeros")
    }
}
