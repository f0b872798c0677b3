import Foundation
import Testing
import TidemarkBackendTesting
import TidemarkCore
import TidemarkEmulator
import TidemarkTesting

/// Planning a batch of changed devices from what a full plan left in memory (`WarmPlan`): the
/// operations are exactly the full plan's, round after round of label changes, token rotations,
/// devices leaving and joining, and after each batch is applied a full plan finds nothing to do.
@Suite struct ChangePlannerTests {
    /// A device as the inventory lists it.
    struct Device: Equatable {
        var token: Int
        var kind: String
        var lang: String
    }

    static let topics = """
        topics:
          - name: kind-a
            members: [{selector: {kind: a}}]
          - name: english
            mode: authoritative
            members: [{selector: {lang: en}}]
          - name: b-german-or-c
            members:
              - selector: {kind: b, lang: de}
              - selector: {kind: c}
          - name: vip
            members: [{devices: [d0, d1]}]
          - name: named-token
            members: [{tokens: ["\(Fixtures.token(7))"]}]
        """

    static func csv(_ devices: [String: Device]) -> String {
        "device_id,token,kind,lang\n"
            + devices.sorted { $0.key < $1.key }.map {
                "\($0.key),\(Fixtures.token($0.value.token)),\($0.value.kind),\($0.value.lang)"
            }.joined(separator: "\n") + "\n"
    }

    static func files(_ devices: [String: Device]) -> ManifestLoader {
        Fixtures.manifests([
            "inv.yaml": "inventory:\n  files: [devices.csv]\n", "devices.csv": csv(devices), "topics.yaml": topics,
        ])
    }

    /// The devices of a batch that are listed, read on their own.
    static func rows(_ devices: [String: Device]) async -> Inventory {
        await Fixtures.manifests(["inv.yaml": "inventory:\n  files: [rows.csv]\n", "rows.csv": csv(devices)]).read()
            .inventory
    }

    /// Each token change of a plan: kind, target and token.
    static func triples(_ plan: Plan) -> Set<String> {
        Set(plan.operations.flatMap { op in op.tokens.map { "\(op.kind.rawValue) \(op.target) \($0)" } })
    }

    @Test(arguments: [1, 2, 3, 4, 5, 6] as [UInt64])
    func batchesPlanWhatAFullPlanWouldAndLeaveNothingToDo(seed: UInt64) async throws {
        var generator = SeededGenerator(seed: seed)
        let store = InMemoryStateStore()
        let (backend, _) = try InMemoryBackend.make(project: "p", autoRegister: true)
        let clock = ManualClock()
        func parts(_ devices: [String: Device]) -> WorkflowParts {
            WorkflowParts(
                manifests: Self.files(devices), store: store, backend: backend, timing: clock.timing,
                output: SilentOutput(), tidemarkVersion: "0.1.0")
        }
        let kinds = ["a", "b", "c"]
        let langs = ["en", "de"]
        var devices: [String: Device] = [:]
        for i in 0..<40 {
            devices["d\(i)"] = Device(
                token: i, kind: kinds.randomElement(using: &generator)!, lang: langs.randomElement(using: &generator)!)
        }
        _ = try await ApplyWorkflow(parts(devices)).run(ApplyRequest())
        let (state, loaded) = try await parts(devices).loadStateAndManifests()
        var warm = WarmPlan(
            loaded: loaded, state: state, files: Self.files(devices).files, tokenFileBytes: InputLimits().tokenFileBytes
        )
        var nextToken = 1000
        var nextDevice = 100
        var batches = 0
        var operations = 0
        for round in 0..<12 {
            // One to six devices change: labels, a new token, leaving, joining (never d0 or d1 here).
            var changed = Set<String>()
            for _ in 0..<Int.random(in: 1...6, using: &generator) {
                let candidates = devices.keys.filter { $0 != "d0" && $0 != "d1" }.sorted()
                switch Int.random(in: 0..<5, using: &generator) {
                case 0:
                    let id = "d\(nextDevice)"
                    nextDevice += 1
                    devices[id] = Device(
                        token: nextToken, kind: kinds.randomElement(using: &generator)!,
                        lang: langs.randomElement(using: &generator)!)
                    nextToken += 1
                    changed.insert(id)
                case 1:
                    let id = candidates.randomElement(using: &generator)!
                    devices[id] = nil
                    changed.insert(id)
                case 2:
                    let id = candidates.randomElement(using: &generator)!
                    devices[id]!.token = nextToken
                    nextToken += 1
                    changed.insert(id)
                default:
                    let id = candidates.randomElement(using: &generator)!
                    devices[id]!.kind = kinds.randomElement(using: &generator)!
                    devices[id]!.lang = langs.randomElement(using: &generator)!
                    changed.insert(id)
                }
            }
            if round == 5 {
                // A device takes over the token of a device that left in the same batch.
                let leaving = devices.keys.filter { $0 != "d0" && $0 != "d1" && !changed.contains($0) }.sorted()[0]
                let token = devices[leaving]!.token
                devices[leaving] = nil
                devices["d\(nextDevice)"] = Device(token: token, kind: "a", lang: "en")
                changed.formUnion([leaving, "d\(nextDevice)"])
                nextDevice += 1
            }
            let rows = await Self.rows(devices.filter { changed.contains($0.key) })
            let change = try warm.planChanges(
                devices: changed.sorted(), rows: rows, planner: parts(devices).planner(), backend: backend.identity,
                now: clock.timing.wallClock())
            let full = try await PlanWorkflow(parts(devices)).run(PlanRequest(refresh: false)).plan
            #expect(
                Self.triples(change.plan) == Self.triples(full),
                "round \(round): batch \(Self.triples(change.plan).sorted()) against full \(Self.triples(full).sorted())"
            )
            #expect(!change.plan.diagnostics.hasErrors && !full.diagnostics.hasErrors)
            #expect(
                Set((change.plan.rotations ?? []).map(\.device)) == Set((full.rotations ?? []).map(\.device)),
                "round \(round): the same rotations")
            let applied = try await ApplyWorkflow(parts(devices)).applyChanges(change)
            warm.commit(change, state: applied.state)
            let after = try await PlanWorkflow(parts(devices)).run(PlanRequest(refresh: false)).plan
            #expect(!after.hasChanges, "round \(round): a full plan after the batch: \(Self.triples(after).sorted())")
            let stored = try #require(try await store.load())
            #expect(stored.topics == warm.state.topics, "round \(round): state in memory is the stored state")
            batches += 1
            operations += Self.triples(full).count
        }
        #expect(batches == 12 && operations > 12, "the rounds changed memberships: \(operations)")
    }

    @Test func whatABatchCannotPlanAloneIsPlannedInFull() async throws {
        let store = InMemoryStateStore()
        let (backend, _) = try InMemoryBackend.make(project: "p", autoRegister: true)
        let clock = ManualClock()
        var devices: [String: Device] = [:]
        for i in 0..<6 { devices["d\(i)"] = Device(token: i, kind: i < 2 ? "c" : "a", lang: "en") }
        devices["d6"] = Device(token: 6, kind: "c", lang: "de")
        devices["d7"] = Device(token: 8, kind: "b", lang: "de")
        let parts = WorkflowParts(
            manifests: Self.files(devices), store: store, backend: backend, timing: clock.timing,
            output: SilentOutput(), tidemarkVersion: "0.1.0")
        let (_, first) = try await parts.loadStateAndManifests()
        #expect(!first.diagnostics.hasErrors, "\(first.diagnostics)")
        _ = try await ApplyWorkflow(parts).run(ApplyRequest())
        let (state, loaded) = try await parts.loadStateAndManifests()
        let warm = WarmPlan(
            loaded: loaded, state: state, files: Self.files(devices).files, tokenFileBytes: InputLimits().tokenFileBytes
        )
        func reason(_ changed: [String: Device?]) async -> String? {
            let rows = await Self.rows(changed.compactMapValues { $0 })
            do {
                _ = try warm.planChanges(
                    devices: Array(changed.keys), rows: rows, planner: parts.planner(), backend: backend.identity,
                    now: clock.timing.wallClock())
                return nil
            } catch {
                return error.description
            }
        }
        #expect(await reason(["d0": Device(token: 0, kind: "a", lang: "en")])?.contains("named by id") == true)
        #expect(
            await reason(["d3": Device(token: 4, kind: "a", lang: "en")]) == "device 'd3' has the token device 'd4' has"
        )
        #expect(await reason(["d3": Device(token: 3, kind: "b", lang: "de")]) == nil)
        // Every device of an additive topic leaving: the topic would have no members, an error in full.
        var empty: [String: Device?] = [:]
        for i in 2..<6 { empty["d\(i)"] = .some(Device(token: i, kind: "c", lang: "de")) }
        #expect(await reason(empty) == "topic 'kind-a' would have no members")
        // The last device a selector matches moving out of it: that selector's error is a full plan's.
        #expect(
            await reason(["d7": Device(token: 8, kind: "a", lang: "de")])
                == "the selector of topic 'b-german-or-c' (member entry 1) would match no device")
        // Another run writes state after the batch was planned: the batch is refused, nothing sent.
        var moved = devices
        moved["d3"] = Device(token: 3, kind: "b", lang: "de")
        let change = try warm.planChanges(
            devices: ["d3"], rows: await Self.rows(["d3": moved["d3"]!]), planner: parts.planner(),
            backend: backend.identity, now: clock.timing.wallClock())
        #expect(change.plan.hasChanges)
        var other = devices
        other["d5"] = Device(token: 5, kind: "c", lang: "en")
        let otherParts = WorkflowParts(
            manifests: Self.files(other), store: store, backend: backend, timing: clock.timing,
            output: SilentOutput(), tidemarkVersion: "0.1.0")
        _ = try await ApplyWorkflow(otherParts).run(ApplyRequest())
        let requestsBefore = backend.requestCount()
        await #expect(throws: ChangeApplyError.self) { try await ApplyWorkflow(otherParts).applyChanges(change) }
        #expect(backend.requestCount() == requestsBefore, "nothing was sent")
        // Devices leaving one batch at a time count against max_shrink since the last full read.
        let guarded = WarmPlan(
            loaded: loaded, state: state, files: Self.files(devices).files,
            tokenFileBytes: InputLimits().tokenFileBytes,
            shrinkGuard: {
                var g = ShrinkGuard()
                g.minimum = 0
                return g
            }())
        let rows = await Self.rows([:])
        #expect(
            throws: PlanInFull(
                "1 device left since the inventory was last read in full (of 8), past max_shrink")
        ) {
            try guarded.planChanges(
                devices: ["d2"], rows: rows, planner: parts.planner(), backend: backend.identity,
                now: clock.timing.wallClock())
        }
    }
}
