import Foundation
import Testing
import TidemarkBackendTesting
import TidemarkCore
import TidemarkEmulator
import TidemarkTesting

/// The text, markdown and JSON renderings of one plan and one drift report, byte for byte.
/// Re-record with `TIDEMARK_RECORD_GOLDEN=1 swift test --filter GoldenRenderTests` and review the diff.
@Suite struct GoldenRenderTests {
    static let directory = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("Golden")

    static let inventory =
        "device_id,token,team,platform\n"
        + (0..<12).map {
            "d\($0),\(Fixtures.token($0)),t\($0 % 3),\($0 % 2 == 0 ? "android" : "ios")"
        }.joined(separator: "\n") + "\n"

    static let first = """
        topics:
          - name: scores-team-zero
            members: [{selector: {team: t0}}]
          - name: weather-north-sea
            mode: authoritative
            members: [{selector: {team: [t0, t1]}}]
          - name: ops-canary
            protect: true
            members: [{devices: [d0, d1]}]
        groups:
          - notification_key_name: family-42
            members: [{devices: [d2, d3]}]
        """

    static let second = """
        topics:
          - name: scores-team-zero
            members: [{selector: {team: [t0, t2]}}]
          - name: weather-north-sea
            mode: authoritative
            members: [{selector: {team: t0}}]
          - name: ops-canary
            protect: true
            members: [{devices: [d0, d1]}]
          - name: news-ios
            members: [{selector: {platform: ios}}]
        groups:
          - notification_key_name: family-42
            members: [{devices: [d2, d4]}]
        """

    /// A second plan after a first apply: additions, authoritative removals, a new topic, group steps.
    static func plan() async throws -> (Plan, Inventory, WorkflowParts, FCMEngine) {
        let store = InMemoryStateStore()
        let (backend, engine) = try InMemoryBackend.make(project: "tidemark-demo", autoRegister: true)
        let clock = ManualClock()
        func parts(_ topics: String) -> WorkflowParts {
            WorkflowParts(
                manifests: Fixtures.manifests([
                    "inv.yaml": "inventory:\n  files: [devices.csv]\n",
                    "devices.csv": inventory, "topics.yaml": topics,
                ]), store: store, backend: backend, timing: clock.timing,
                // One operation at a time: each step is its own save (the journal commits steps that
                // finish together as one), so the serial in the renderings is the same on every run.
                tidemarkVersion: "0.1.0", parallelism: 1)
        }
        _ = try await ApplyWorkflow(parts(first)).run(ApplyRequest())
        // A device subscribed itself to the authoritative topic: drift the plan corrects.
        _ = try await engine.batchAdd(
            project: "tidemark-demo", topic: "weather-north-sea", tokens: [Fixtures.token(11)])
        let outcome = try await PlanWorkflow(parts(second)).run(PlanRequest())
        return (outcome.plan, outcome.loaded.inventory, parts(second), engine)
    }

    @Test func planRenderings() async throws {
        let (plan, inventory, _, _) = try await Self.plan()
        Golden.check(PlanRenderer(deviceName: inventory.deviceNamer).render(plan), "plan.txt", in: Self.directory)
        let parts = MarkdownPlanRenderer(fullPlanHint: "`plan.json`", deviceName: inventory.deviceNamer).render(plan)
        Golden.check(parts.joined(separator: "\n<!-- part -->\n"), "plan.md", in: Self.directory)
        let json = String(decoding: try Plan.encoder().encode(plan), as: UTF8.self) + "\n"
        Golden.check(json, "plan.json", in: Self.directory)
    }

    @Test func driftRenderings() async throws {
        let (_, _, parts, engine) = try await Self.plan()
        _ = try await engine.batchRemove(
            project: "tidemark-demo", topic: "scores-team-zero", tokens: [Fixtures.token(3)])
        let report = try await DriftWorkflow(parts).run()
        let renderer = DriftRenderer()
        Golden.check(renderer.text(report), "drift.txt", in: Self.directory)
        Golden.check(renderer.markdown(report).joined(separator: "\n<!-- part -->\n"), "drift.md", in: Self.directory)
        Golden.check(renderer.ndjson(report), "drift.ndjson", in: Self.directory)
    }
}
