import Foundation
import Testing
import TidemarkCore
import TidemarkTesting

/// `state prune`: what state forgets, and what it must keep.
@Suite struct PruneTests {
    static func state() -> State {
        var state = State(lineage: "lineage", serial: 3)
        for i in 0..<10 { state.intern(Fixtures.token(i)) }
        for i in 0..<10 { state.setSeen(UInt32(i), at: 1_000) }
        for i in 3..<10 { state.setLeft(UInt32(i), at: 2_000) }
        state.setLeft(5, at: 99_000)  // left recently
        state.setDead(TokenSet([0, 3]))
        state.setTopic("news", TopicState(managed: TokenSet([1, 4]), observed: TokenSet([1, 4, 6, 7])))
        state.setGroup("family", GroupState(key: "k", members: TokenSet([2, 8]), exported: TokenSet([2, 8, 9])))
        state.setDeviceID(9, "d9")
        return state
    }

    @Test func selectsDeadAndDepartedTokensUnseenForTheRetention() {
        let state = Self.state()
        let selection = state.prunable(declared: TokenSet([0, 1, 2]), now: 100_000, retention: 10_000)
        // 0 is dead but still declared; 3 is dead; 4 holds a managed membership; 5 left recently;
        // 8 is in a group; 6, 7 and 9 left and hold nothing tidemark manages.
        #expect(selection.dead == [3])
        #expect(selection.departed == [6, 7, 9])
        #expect(state.prunable(declared: TokenSet(), now: 100_000, retention: 200_000).isEmpty, "all seen too recently")
    }

    @Test func removingRenumbersAndRemapsEverySet() {
        let state = Self.state()
        let selection = state.prunable(declared: TokenSet([0, 1, 2]), now: 100_000, retention: 10_000)
        let pruned = state.removing(selection)
        #expect(pruned.tokens.count == 6)
        let names = { (set: TokenSet) in set.map { pruned.tokens[$0] } }
        #expect(names(pruned.topics["news"]!.managed) == [Fixtures.token(1), Fixtures.token(4)])
        #expect(names(pruned.topics["news"]!.observed) == [Fixtures.token(1), Fixtures.token(4)])
        #expect(names(pruned.groups["family"]!.members) == [Fixtures.token(2), Fixtures.token(8)])
        // What `groups export` read is remapped too; a forgotten token leaves it.
        #expect(names(pruned.groups["family"]!.exported!) == [Fixtures.token(2), Fixtures.token(8)])
        #expect(names(pruned.dead) == [Fixtures.token(0)])
        #expect(pruned.leftAt[Int(pruned.tokens.id(Fixtures.token(5))!)] == 99_000)
        #expect(pruned.deviceIDs.count == 6 && pruned.lineage == "lineage" && pruned.serial == 3)
    }

    @Test func theWorkflowSavesRefusesAndDryRuns() async throws {
        let store = InMemoryStateStore()
        var state = Self.state()
        state.claim(backend: Fixtures.backend)
        var write = StateWrite()
        write.topics = ["news"]
        write.groups = ["family"]
        try await store.save(&state, write, at: 1_000)
        let manifests = Fixtures.manifests([
            "inv.yaml":
                "inventory:\n  devices:\n"
                + [0, 1, 2].map { "    - {id: d\($0), token: '\(Fixtures.token($0))'}\n" }.joined(),
            "topics.yaml": "topics:\n  - name: news\n    members: [{devices: [d1]}]\n",
        ])
        let clock = ManualClock(epoch: Date(timeIntervalSince1970: 100_000))
        let workflow = PruneWorkflow(manifests: manifests, store: store, timing: clock.timing)
        let dry = try await workflow.run(retention: 10_000, dryRun: true)
        #expect(dry.selection.dead == [3] && dry.selection.departed == [6, 7, 9] && dry.serial == nil)
        #expect(try await store.load()?.tokens.count == 10, "a dry run writes nothing")
        let done = try await workflow.run(retention: 10_000)
        #expect(done.serial == 2 && done.tokensBefore == 10)
        #expect(try await store.load()?.tokens.count == 6)
        #expect(try await workflow.run(retention: 10_000).selection.isEmpty, "a second prune finds nothing")
        // Manifests that do not load would make every token look undeclared: refused.
        let broken = PruneWorkflow(
            manifests: Fixtures.manifests(["topics.yaml": "topics:\n  - name: [x\n"]), store: store,
            timing: clock.timing)
        await #expect(throws: WorkflowError.self) { try await broken.run(retention: 0) }
        #expect(try await store.load()?.tokens.count == 6)
    }
}
