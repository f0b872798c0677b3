import Testing
import TidemarkCore
import TidemarkTesting

/// State's token registry keeps its per-token columns as long as its table, whatever adds tokens.
@Suite struct TokenRegistryTests {
    @Test func interningGivesANewTokenARowInEveryColumn() {
        var registry = TokenRegistry()
        let a = registry.intern("a:APA91b")
        registry.setSeen(a, at: 10)
        registry.setDeviceID(a, "phone")
        registry.setLeft(a, at: 20)
        #expect(registry.intern("a:APA91b") == a, "a known token keeps its id and its row")
        let b = registry.intern("b:APA91b")
        #expect(b == 1 && registry.count == 2)
        #expect(registry.seenAt == [10, 0] && registry.deviceIDs == ["phone", ""] && registry.leftAt == [20, 0])
        #expect(registry.deviceID(of: a) == "phone" && registry.deviceID(of: b) == nil)
    }

    @Test func resolvingManifestsIntoStateGrowsItsColumns() async {
        var state = State(lineage: "l", serial: 0)
        state.intern("known:APA91b")
        state.setSeen(0, at: 5)
        let files = InMemoryFileSource([
            "topics.yaml": "topics:\n  - name: news\n    members: [{tokens: ['new-1:APA91b', 'new-2:APA91b']}]\n"
        ])
        let loaded = await state.interning { await ManifestLoader(files: files).load(into: &$0) }
        #expect(!loaded.diagnostics.hasErrors)
        #expect(state.tokens.count == 3)
        #expect(state.seenAt == [5, 0, 0] && state.deviceIDs.count == 3 && state.leftAt.count == 3)
    }

    @Test func aStoredRegistryIsCheckedAndItsShortColumnsFilled() throws {
        let registry = try TokenRegistry(tokens: ["a", "b", "c"], seenAt: [1, 2, 3])
        #expect(registry.deviceIDs == ["", "", ""] && registry.leftAt == [0, 0, 0])
        #expect(registry.id("c") == 2 && registry.token(1) == "b")
        #expect(throws: TokenRegistry.RepeatedToken.self) { try TokenRegistry(tokens: ["a", "b", "a"]) }
        do {
            _ = try TokenRegistry(tokens: ["a", "b", "a"])
        } catch {
            #expect(error.id == 2 && error.earlier == 0)
        }
    }

    @Test func stateChangesOnlyThroughItsOperations() {
        var state = State(lineage: "l", serial: 0)
        let ids = ["x", "y", "z"].map { state.intern($0) }
        state.setTopic("news", TopicState(managed: TokenSet(ids), observed: TokenSet(ids)))
        #expect(state.markDead(TokenSet([ids[1]])) == ["news"])
        #expect(state.topics["news"]?.observed == TokenSet([ids[0], ids[2]]) && state.dead == TokenSet([ids[1]]))
        state.saved(serial: 4, versionKeys: ["topic:news"])
        #expect(state.serial == 4 && state.versions == ["topic:news": 4])
        state.saved(serial: 9, versionKeys: ["topic:news"], restored: true)
        #expect(state.serial == 9 && state.versions == ["topic:news": 4], "a restore brings its own versions")
        state.claim(backend: BackendIdentity(kind: .emulator, project: "p"), lineage: "other")
        #expect(state.lineage == "l" && state.backend?.project == "p", "a state keeps the lineage it has")
    }
}
