import Foundation
import Testing
import TidemarkCore
import TidemarkTesting

@testable import TidemarkServe

/// `tidemark status --format json` is a typed value: its JSON is kept in a golden file, and it reads
/// back as what was written, the published status as the `WorkspaceStatus` of `/status`.
struct StatusReportTests {
    static let epoch = Date(timeIntervalSince1970: 1_800_000_000)

    @Test func theJSONOfStatusIsTypedAndKeptInAGoldenFile() throws {
        var result = ReconcileResult(outcome: .success, startedAt: Self.epoch, seconds: 2)
        result.subscribed = 3
        var status = WorkspaceStatus(
            phase: .ready, ready: true, workspace: "prod", state: "postgres://tidemark:***@db/tidemark",
            manifests: "manifests", backend: "fcm (project acme)", settings: ["interval": "5m", "drift": "heal"],
            suspended: false, last: result, lastSuccessAt: result.finishedAt, replica: "pod-a/1#0a1b2c3d")
        status.nextRunAt = Self.epoch.addingTimeInterval(300)
        var owned = ServeRecord(workspace: "prod")
        owned.owner = "pod-a/1#0a1b2c3d"
        owned.ownerExpires = Self.epoch.addingTimeInterval(30)
        owned.replicas = [
            "pod-a/1#0a1b2c3d": Self.epoch.addingTimeInterval(30),
            "pod-b/1#4e5f6071": Self.epoch.addingTimeInterval(30),
        ]
        owned.reconcileRequestedAt = Self.epoch.addingTimeInterval(-60)
        owned.status = try WorkspaceStatus.encoder.encode(status)
        owned.statusAt = Self.epoch
        var idle = ServeRecord(workspace: "staging")
        idle.suspended = true
        idle.suspendedBy = "ana@laptop at 2027-01-15T08:00:00Z"
        let now = Self.epoch.addingTimeInterval(5)
        let report = StatusReport(workspaces: [
            .init(record: owned, state: "postgres://tidemark:***@db/tidemark", now: now),
            .init(record: idle, state: ".tidemark/state.db", now: now),
        ])
        #expect(report.workspaces[0].status == status && report.workspaces[1].status == nil)
        #expect(report.workspaces[0].replicas == ["pod-a/1#0a1b2c3d", "pod-b/1#4e5f6071"])
        let json = try report.json()
        #expect(try WorkspaceStatus.decoder.decode(StatusReport.self, from: Data(json.utf8)) == report)
        let object = try JSONSerialization.jsonObject(with: Data(json.utf8)) as? [String: Any]
        let second = (object?["workspaces"] as? [[String: Any]])?.last
        #expect(second?["owner"] is NSNull && second?["status"] is NSNull, "none is said, not left out")
        Golden.check(
            json + "\n", "status.json",
            in: URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("Golden"))
    }
}
