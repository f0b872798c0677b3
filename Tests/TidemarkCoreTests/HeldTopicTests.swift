import Foundation
import Testing
import TidemarkBackendTesting
import TidemarkCore
import TidemarkEmulator
import TidemarkTesting

/// A rail that refuses one topic holds that topic only (`--skip-held`, and `serve`): the plan
/// beside it, applied now, plus the held topic's own plan applied later, is the whole plan.
@Suite struct HeldTopicTests {
    /// One random fleet before and after an edit: devices with labels, some that leave, rotate their
    /// token, change labels or arrive; topics on selectors, a device group and an audience.
    struct World {
        var before: String
        var after: String
        var topics: [(name: String, region: String, mode: String)]
        var group: (before: [String], after: [String])
        var audience: (before: [String], after: [String])

        init(seed: UInt64) {
            var rng = SeededGenerator(seed: seed)
            let regions = ["north", "south", "east"]
            let count = Int.random(in: 12...40, using: &rng)
            // The first six cover every region and tier, so the held topic loses members for sure.
            func region(_ i: Int) -> String { i < 6 ? regions[i % 3] : regions.randomElement(using: &rng)! }
            var rows: [(id: String, token: Int, region: String)] = (0..<count).map { ("d\($0)", $0, region($0)) }
            func csv(_ rows: [(id: String, token: Int, region: String)]) -> String {
                "device_id,token,region\n"
                    + rows.map { "\($0.id),\(Fixtures.token($0.token)),\($0.region)" }.joined(separator: "\n") + "\n"
            }
            before = csv(rows)
            topics = (0..<Int.random(in: 2...4, using: &rng)).map {
                ("t\($0)", regions.randomElement(using: &rng)!, Bool.random(using: &rng) ? "authoritative" : "additive")
            }
            let ids = rows.map(\.id)
            let groupBefore = Array(ids.shuffled(using: &rng).prefix(4))
            let audienceBefore = Array(ids.shuffled(using: &rng).prefix(6))
            // The edit: some leave, some rotate, some move, some arrive.
            var changed: [(id: String, token: Int, region: String)] = []
            for (index, row) in rows.enumerated() {
                let roll = Int.random(in: 0..<10, using: &rng)
                if index < 6 {
                    changed.append(roll < 3 ? (row.id, row.token + 1000, row.region) : row)
                } else if roll == 0 {
                    continue
                } else if roll < 3 {
                    changed.append((row.id, row.token + 1000, row.region))
                } else if roll < 5 {
                    changed.append((row.id, row.token, regions.randomElement(using: &rng)!))
                } else {
                    changed.append(row)
                }
            }
            for extra in 0..<Int.random(in: 0...5, using: &rng) {
                changed.append(("n\(extra)", 2000 + extra, regions.randomElement(using: &rng)!))
            }
            rows = changed
            after = csv(rows)
            let left = Set(rows.map(\.id))
            group = (groupBefore, Array(rows.map(\.id).shuffled(using: &rng).prefix(3)))
            audience = (
                audienceBefore.filter { left.contains($0) }, Array(rows.map(\.id).shuffled(using: &rng).prefix(5))
            )
        }

        /// The manifests: the held topic follows north before the edit and south after, under `rail`.
        func manifests(edited: Bool, rail: String) -> String {
            var text = "topics:\n"
            text += "  - name: held\n    mode: authoritative\n    max_unsubscribes: \(rail)\n"
            text += "    members: [{selector: {region: \(edited ? "south" : "north")}}]\n"
            for topic in topics {
                text += "  - name: \(topic.name)\n    mode: \(topic.mode)\n    allow_empty: true\n"
                text += "    members: [{selector: {region: \(topic.region)}}]\n"
            }
            let group = edited ? self.group.after : self.group.before
            let audience = edited ? self.audience.after : self.audience.before
            text +=
                "groups:\n  - notification_key_name: family\n    members: [{devices: [\(group.joined(separator: ", "))]}]\n"
            text += "audiences:\n  - name: fans\n    members: [{devices: [\(audience.joined(separator: ", "))]}]\n"
            return text
        }
    }

    /// A project of its own: a store, a backend and a clock; the inventory and manifests per run.
    static func project() throws -> (engine: FCMEngine, parts: (String, String) -> WorkflowParts) {
        let store = InMemoryStateStore()
        let (backend, engine) = try InMemoryBackend.make(project: "p", autoRegister: true)
        let clock = ManualClock()
        return (
            engine,
            { inventory, manifests in
                WorkflowParts(
                    manifests: Fixtures.manifests([
                        "inv.yaml": "inventory:\n  files: [devices.csv]\n", "devices.csv": inventory,
                        "topics.yaml": manifests,
                    ]), store: store, backend: backend, timing: clock.timing, output: SilentOutput(),
                    tidemarkVersion: "0.1.0")
            }
        )
    }

    struct Triple: Hashable {
        var kind: String
        var target: String
        var token: String
    }

    static func triples(_ plan: Plan) -> Set<Triple> {
        var all = Set<Triple>()
        for op in plan.operations where !op.kind.isStateOnly {
            for token in op.tokens { all.insert(Triple(kind: op.kind.rawValue, target: op.target, token: token)) }
        }
        return all
    }

    static func world(_ engine: FCMEngine) async -> [String: Set<String>] {
        var world = await engine.allSubscriptions(project: "p")
        for group in await engine.groups(project: "p") { world["group " + group.name] = Set(group.members) }
        return world
    }

    @Test(arguments: 0..<24)
    func theRestNowAndTheHeldTopicLaterIsTheWholePlan(seed: Int) async throws {
        let world = World(seed: UInt64(seed))
        let strict = "0"
        // One project applies the whole edit at once (the rail lifted); the other holds the topic.
        let whole = try Self.project()
        let held = try Self.project()
        for project in [whole, held] {
            let first = try await ApplyWorkflow(
                project.parts(world.before, world.manifests(edited: false, rail: strict))
            )
            .run(ApplyRequest())
            #expect(!first.hasUnexpectedFailures)
        }
        #expect(await Self.world(whole.engine) == Self.world(held.engine))

        let lifted = whole.parts(world.after, world.manifests(edited: true, rail: "none"))
        let wholePlan = try await PlanWorkflow(lifted).run(PlanRequest()).plan
        #expect(!wholePlan.diagnostics.hasErrors, "\(wholePlan.diagnostics)")
        _ = try await ApplyWorkflow(lifted).run(ApplyRequest())

        // Refused as a whole by default, naming what it would hold and what would go on beside it.
        let edited = held.parts(world.after, world.manifests(edited: true, rail: strict))
        let refused = try await PlanWorkflow(edited).run(PlanRequest()).plan
        #expect(refused.diagnostics.hasErrors)
        #expect(refused.held?.map(\.subject) == [Targets.Subject(.topic, "held")])
        #expect(refused.held?.first?.rail == "rail.max_unsubscribes")
        #expect(refused.held?.first?.at == "topics.yaml:2:11")
        var skipping = PlanRequest()
        skipping.skipHeld = true
        let beside = try await PlanWorkflow(edited).run(skipping).plan
        #expect(!beside.diagnostics.hasErrors, "\(beside.diagnostics)")
        #expect(beside.held?.map(\.subject) == [Targets.Subject(.topic, "held")])
        #expect(beside.operations.allSatisfy { $0.target != "held" })
        #expect(refused.beside?.operations == beside.operations.count)
        let heldBefore = await held.engine.subscribers(of: "held", project: "p")
        _ = try await ApplyWorkflow(edited).run(ApplyRequest(planning: skipping))
        #expect(
            await held.engine.subscribers(of: "held", project: "p") == heldBefore, "the held topic keeps every member")

        // Everything else is where the whole plan put it.
        var now = await Self.world(held.engine)
        var target = await Self.world(whole.engine)
        now["held"] = nil
        target["held"] = nil
        #expect(now == target)

        // Later the rail passes: the held topic's own plan is all that is left, and the two make the whole.
        let released = held.parts(world.after, world.manifests(edited: true, rail: "none"))
        let later = try await PlanWorkflow(released).run(PlanRequest()).plan
        #expect(later.held == nil && !later.diagnostics.hasErrors)
        #expect(later.operations.allSatisfy { $0.target == "held" }, "\(later.operations.map(\.target))")
        #expect(Self.triples(beside).isDisjoint(with: Self.triples(later)))
        #expect(Self.triples(beside).union(Self.triples(later)) == Self.triples(wholePlan))
        _ = try await ApplyWorkflow(released).run(ApplyRequest())
        #expect(await Self.world(held.engine) == Self.world(whole.engine))
        let after = try await PlanWorkflow(released).run(PlanRequest()).plan
        #expect(!after.hasChanges)
    }

    /// A rail about the whole workspace (the global max_unsubscribes) holds nothing: the whole plan
    /// is refused, and so is what would remain beside a held topic when it still crosses it.
    @Test func aGlobalRailHoldsTheWorkspace() async throws {
        let world = World(seed: 7)
        let project = try Self.project()
        _ = try await ApplyWorkflow(project.parts(world.before, world.manifests(edited: false, rail: "none")))
            .run(ApplyRequest())
        let edited = project.parts(world.after, world.manifests(edited: true, rail: "none"))
        var request = PlanRequest(maxUnsubscribes: try UnsubscribeLimit(parsing: "0"))
        request.skipHeld = true
        let plan = try await PlanWorkflow(edited).run(request).plan
        #expect(plan.diagnostics.hasErrors && plan.held == nil)
        await #expect(throws: WorkflowError.self) {
            _ = try await ApplyWorkflow(edited).run(ApplyRequest(planning: request))
        }
    }

    /// `serve`'s default rail: a topic with no rail of its own loses at most 10% of its members (and
    /// always 10 devices) on its own; `max_unsubscribes: none` on the topic says more may go.
    @Test func serveHoldsATopicPastItsDefaultShare() async throws {
        let devices = (0..<40).map { "d\($0),\(Fixtures.token($0)),\($0 < 30 ? "north" : "south")" }
        let inventory = "device_id,token,region\n" + devices.joined(separator: "\n") + "\n"
        func manifests(_ region: String, rail: String? = nil) -> String {
            "topics:\n  - name: big\n    mode: authoritative\n"
                + (rail.map { "    max_unsubscribes: \($0)\n" } ?? "")
                + "    members: [{selector: {region: \(region)}}]\n"
                + "  - name: all\n    members: [{selector: {region: north}}, {selector: {region: south}}]\n"
        }
        let project = try Self.project()
        _ = try await ApplyWorkflow(project.parts(inventory, manifests("north"))).run(ApplyRequest())
        var unattended = PlanRequest()
        unattended.skipHeld = true
        unattended.topicRail = .serveDefault
        // 30 of 30 would go: held, naming serve's rail and the way out.
        let held = try await PlanWorkflow(project.parts(inventory, manifests("south"))).run(unattended).plan
        let hold = try #require(held.held?.first)
        #expect(hold.subject == Targets.Subject(.topic, "big") && hold.rail == "rail.unattended")
        #expect(hold.message.contains("30 devices from topic 'big'"), "\(hold.message)")
        #expect(hold.message.contains("'max_unsubscribes: none' in tidemark.yaml"))
        // The CLI has no default rail: a person reviews the plan.
        let person = try await PlanWorkflow(project.parts(inventory, manifests("south"))).run(PlanRequest()).plan
        #expect(!person.diagnostics.hasErrors && person.held == nil)
        // Said out loud on the topic: no rail.
        let none = try await PlanWorkflow(project.parts(inventory, manifests("south", rail: "none"))).run(unattended)
            .plan
        #expect(none.held == nil && !none.diagnostics.hasErrors)
        // A few devices leaving (churn) stay within the minimum.
        let churn = "device_id,token,region\n" + devices.dropFirst(5).joined(separator: "\n") + "\n"
        let small = try await PlanWorkflow(project.parts(churn, manifests("north"))).run(unattended).plan
        #expect(small.held == nil && small.unsubscribeCount > 0)
    }
}
