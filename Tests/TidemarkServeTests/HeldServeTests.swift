import Foundation
import Testing
import TidemarkCore

@testable import TidemarkServe

/// What `serve` says of a held topic: one `blocked` event per held topic (sent once per renotify),
/// `tidemark_held` and its count, bounded.
@Suite struct HeldServeTests {
    static func result(held: [HeldChange]?) -> ReconcileResult {
        var result = ReconcileResult(
            outcome: .success, startedAt: Date(timeIntervalSince1970: 1_800_000_000), seconds: 1)
        result.held = held
        return result
    }

    static func hold(_ name: String, kind: Targets.Kind = .topic) -> HeldChange {
        HeldChange(
            subject: Targets.Subject(kind, name), rail: "rail.max_unsubscribes",
            message: "this plan would unsubscribe 9 devices from topic '\(name)'", at: "topics.yaml:2:11")
    }

    @Test func eachHeldTopicIsOneBlockedEventSentOncePerRenotify() throws {
        let result = Self.result(held: [Self.hold("storms"), Self.hold("family room/2", kind: .group)])
        let events = ServeEvent.events(of: result, workspace: "prod", replica: "r1", troubled: false)
        let blocked = events.filter { $0.event == .blocked }
        #expect(blocked.map(\.dedupeKey) == ["prod/blocked/topic:storms", "prod/blocked/group:family%20room%2F2"])
        #expect(blocked.allSatisfy { $0.reason == "rail.max_unsubscribes" })
        #expect(blocked[0].summary.contains("topic 'storms' is held by rail.max_unsubscribes (topics.yaml:2:11)"))
        #expect(blocked[0].summary.contains("everything else is applied"))
        var ledger = NotifyLedger()
        let target = NotifyTarget(
            name: "ops", location: SourceLocation(file: "tidemark.yaml", line: 1, column: 1),
            url: "http://127.0.0.1:1/hook", secretEnv: "S")
        let now = Date(timeIntervalSince1970: 1_800_000_000)
        #expect(ledger.due(events, targets: [target], now: now).count == 2)
        // The next reconcile holds the same topics: nothing is sent again before the renotify.
        #expect(ledger.due(events, targets: [target], now: now.addingTimeInterval(60)).isEmpty)
        #expect(ledger.troubled)
        // A batch of changed devices beside the held topics is no recovery.
        let beside = ServeEvent.events(of: result, workspace: "prod", replica: "r1", troubled: true)
        #expect(!beside.contains { $0.event == .recovered })
        // Released: the workspace is told it recovered.
        let released = ServeEvent.events(of: Self.result(held: []), workspace: "prod", replica: "r1", troubled: true)
        #expect(released.map(\.event) == [.recovered])
    }

    @Test func theHeldGaugesFollowTheStatusAndAreBounded() throws {
        let metrics = ServeMetrics()
        metrics.declare(workspace: "prod", settings: ServeSettings(), quota: 3000)
        metrics.leader(workspace: "prod", true, replica: "r1")
        var status = WorkspaceStatus(
            phase: .ready, ready: true, workspace: "prod", state: "s", manifests: "m", backend: "b", settings: [:],
            suspended: false, replica: "r1")
        status.held = (0..<25).map { Self.hold(String(format: "t%02d", $0)) }
        metrics.status(workspace: "prod", status)
        var text = String(decoding: metrics.exposition(), as: UTF8.self)
        #expect(text.contains(#"tidemark_held_changes{workspace="prod"} 25"#))
        #expect(text.contains(#"tidemark_held{workspace="prod",kind="topic",name="t00"} 1"#))
        #expect(text.components(separatedBy: "\ntidemark_held{").count - 1 == ServeMetrics.heldSeriesLimit)
        status.held = [Self.hold("t24")]
        metrics.status(workspace: "prod", status)
        text = String(decoding: metrics.exposition(), as: UTF8.self)
        #expect(text.contains(#"tidemark_held_changes{workspace="prod"} 1"#))
        #expect(!text.contains(#"name="t00""#), "a released topic's series goes")
        #expect(text.contains(#"tidemark_held{workspace="prod",kind="topic",name="t24"} 1"#))
        // A replica that stops owning the workspace exports none of it.
        metrics.leader(workspace: "prod", false, replica: "r1")
        text = String(decoding: metrics.exposition(), as: UTF8.self)
        #expect(!text.contains("tidemark_held"))
    }
}
