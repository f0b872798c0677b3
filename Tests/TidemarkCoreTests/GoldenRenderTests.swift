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

    static let inventory = inventory(second: false)

    /// Twelve devices; in the second, d5's token rotated and two Android devices (d8, d10) left.
    static func inventory(second: Bool) -> String {
        "device_id,token,team,platform\n"
            + (0..<12).filter { !second || ($0 != 8 && $0 != 10) }.map {
                "d\($0),\(Fixtures.token(second && $0 == 5 ? 105 : $0)),t\($0 % 3),\($0 % 2 == 0 ? "android" : "ios")"
            }.joined(separator: "\n") + "\n"
    }

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
          - name: android-all
            members: [{selector: {platform: android}}]
          - name: ios-not-t0
            members: [{selector: {platform: ios, team: {not: t0}}}]
        groups:
          - notification_key_name: family-42
            members: [{devices: [d2, d3]}]
          - notification_key_name: family-7
            members: [{devices: [d6, d7]}]
        """

    /// The manifests again: a topic gains members, an authoritative one loses some, a protected one
    /// loses one, a new topic; an additive topic loses a third of its members to departed devices; a
    /// group changes and another is deleted; and d5's token rotated.
    static let second = """
        topics:
          - name: scores-team-zero
            members: [{selector: {team: [t0, t2]}}]
          - name: weather-north-sea
            mode: authoritative
            members: [{selector: {team: t0}}]
          - name: ops-canary
            protect: true
            members: [{devices: [d0]}]
          - name: android-all
            members: [{selector: {platform: android}}]
          - name: ios-not-t0
            members: [{selector: {platform: ios, team: {not: t0}}}]
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
                    "devices.csv": inventory(second: topics == second), "topics.yaml": topics,
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

    /// "Destructive" means members lost where a reviewer must look (an authoritative or protected
    /// topic, an additive one losing past its share, a deleted group), never a rotation; every topic
    /// shows its size before and after; departed and rotated tokens name their device.
    @Test func destructiveMeansLossNotRotation() async throws {
        let (plan, inventory, _, _) = try await Self.plan()
        let flagged = PlanRenderer.flagged(plan)
        #expect(flagged.map(\.name) == ["android-all", "ops-canary", "weather-north-sea", "family-7"], "\(flagged)")
        #expect(flagged[0].reasons == ["33% of its 6 subscribers, over the 10% that calls for review"])
        #expect(flagged[1].reasons.contains("protected topic"))
        let rotatedOnly = try #require(plan.topics.first { $0.topic == "ios-not-t0" })
        #expect(rotatedOnly.unsubscribe == 1 && rotatedOnly.rotated == 1 && rotatedOnly.destructiveReasons.isEmpty)
        #expect(PlanRenderer.size(rotatedOnly) == "4 → 4 (±0%)")
        let text = PlanRenderer(tokensPerSection: 20, deviceName: inventory.deviceNamer).render(plan)
        #expect(text.contains("device d8, left the inventory") && text.contains("device d5, its old token"))
        // Selectors are said as the manifests write them.
        let at = SourceLocation(file: "topics.yaml", line: 1, column: 1)
        let negated = MemberRef.selector(
            [
                LabelRequirement(key: "team", op: .notEquals("t0"), location: at),
                LabelRequirement(key: "locale", op: .notInSet(["en-GB", "en-IE"]), location: at),
            ], at)
        #expect(negated.cause == "selector {team: {not: t0}, locale: {not: [en-GB, en-IE]}}")
        #expect(text.contains("Symbols: + new (no known member before), ~ changes, - leaves the manifests"))
        let summary = try #require(plan.summarized().summary)
        #expect(summary.rotatedDevices == 1 && summary.departedDevices == 2 && summary.destructive == flagged)
        #expect(
            summary.unsubscribes == plan.unsubscribeCount && summary.rotatedUnsubscribes == rotatedUnsubscribes(plan))
        // A plan whose only change is a rotation has no destructive section.
        var rotation = plan
        rotation.topics = [rotatedOnly]
        rotation.groups = []
        rotation.operations = plan.operations.filter { $0.target == "ios-not-t0" }
        #expect(!PlanRenderer().render(rotation).contains("Destructive"))
        #expect(!MarkdownPlanRenderer().render(rotation).joined().contains("Destructive"))
    }

    func rotatedUnsubscribes(_ plan: Plan) -> Int {
        let old = Set((plan.rotations ?? []).map(\.from))
        return plan.operations.filter { $0.kind == .unsubscribe }.reduce(0) {
            $0 + $1.tokens.count { old.contains($0) }
        }
    }

    @Test func planRenderings() async throws {
        let (plan, inventory, _, _) = try await Self.plan()
        Golden.check(PlanRenderer(deviceName: inventory.deviceNamer).render(plan), "plan.txt", in: Self.directory)
        let parts = MarkdownPlanRenderer(fullPlanHint: "`plan.json`", deviceName: inventory.deviceNamer).render(plan)
        Golden.check(parts.joined(separator: "\n<!-- part -->\n"), "plan.md", in: Self.directory)
        let json = String(decoding: try Plan.encoder().encode(plan.summarized()), as: UTF8.self) + "\n"
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
