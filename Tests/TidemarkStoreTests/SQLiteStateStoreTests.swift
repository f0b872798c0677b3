import Foundation
import GRDB
import Testing
import TidemarkCore
@testable import TidemarkStore

@Suite struct SQLiteStateStoreTests {
    func temporaryPath(_ name: String = "state.db") -> String {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("tm-store-\(UUID().uuidString)")
        return dir.appendingPathComponent(".tidemark").appendingPathComponent(name).path
    }

    func cleanup(_ path: String) {
        try? FileManager.default.removeItem(atPath: ((path as NSString).deletingLastPathComponent as NSString).deletingLastPathComponent)
    }

    @Test func roundTripsAndBumpsSerial() throws {
        let path = temporaryPath()
        defer { cleanup(path) }
        let store = try #require(try SQLiteStateStore.open(path: path, create: true))
        var state = try store.load()
        #expect(state.serial == 0 && !state.lineage.isEmpty)
        for i in 0..<5000 { state.tokens.intern("tok\(i):APA91b") }
        state.growToTable()
        state.seenAt[3] = 99
        state.dead = TokenSet([4])
        state.topics["news"] = TopicState(mode: .authoritative, protect: true, managed: TokenSet([1, 2, 3]),
            observed: TokenSet(0..<4000))
        state.groups["g"] = GroupState(key: "APA91bkey", protect: false, members: TokenSet([7, 8]))
        var write = SQLiteStateStore.Write()
        write.topics = ["news"]
        write.groups = ["g"]
        try store.save(&state, write)
        #expect(state.serial == 1)
        let loaded = try store.load()
        #expect(loaded.lineage == state.lineage && loaded.serial == 1)
        #expect(loaded.tokens.count == 5000 && loaded.tokens[4999] == "tok4999:APA91b")
        #expect(loaded.seenAt[3] == 99 && loaded.dead == TokenSet([4]))
        #expect(loaded.topics["news"] == state.topics["news"])
        #expect(loaded.groups["g"] == state.groups["g"])
        // Removing a topic from state deletes its row.
        state.topics["news"] = nil
        try store.save(&state, { var w = SQLiteStateStore.Write(); w.topics = ["news"]; return w }())
        #expect(try store.load().topics.isEmpty)
        #expect(try store.load().serial == 2)
    }

    @Test func fileIsPrivateToItsUser() throws {
        let path = temporaryPath()
        defer { cleanup(path) }
        _ = try SQLiteStateStore.open(path: path, create: true)
        let mode = try FileManager.default.attributesOfItem(atPath: path)[.posixPermissions] as? Int
        #expect(mode == 0o600)
        let dirMode = try FileManager.default.attributesOfItem(atPath: (path as NSString).deletingLastPathComponent)[.posixPermissions] as? Int
        #expect(dirMode == 0o700)
    }

    @Test func missingFileIsNilUnlessCreating() throws {
        let path = temporaryPath()
        defer { cleanup(path) }
        #expect(try SQLiteStateStore.open(path: path, create: false) == nil)
        #expect(!FileManager.default.fileExists(atPath: path))
    }

    @Test func refusesForeignAndDamagedFilesWithoutTouchingThem() throws {
        let path = temporaryPath()
        defer { cleanup(path) }
        try FileManager.default.createDirectory(atPath: (path as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
        let garbage = Data("this is not a database at all, just some text\n".utf8)
        try garbage.write(to: URL(fileURLWithPath: path))
        #expect { try SQLiteStateStore.open(path: path, create: true) } throws: { error in
            let e = error as? StateStoreError
            return e?.code == .notSQLite && e!.description.contains("left untouched")
        }
        #expect(try Data(contentsOf: URL(fileURLWithPath: path)) == garbage)

        try FileManager.default.removeItem(atPath: path)
        let queue = try DatabaseQueue(path: path)
        try queue.write { try $0.execute(sql: "CREATE TABLE people (name TEXT)") }
        #expect { try SQLiteStateStore.open(path: path, create: true) } throws: { error in
            (error as? StateStoreError)?.code == .foreign
        }

        try FileManager.default.removeItem(atPath: path)
        _ = try SQLiteStateStore.open(path: path, create: true)
        let data = try Data(contentsOf: URL(fileURLWithPath: path))
        try data.prefix(1024).write(to: URL(fileURLWithPath: path))
        #expect { _ = try SQLiteStateStore.open(path: path, create: true)?.load() } throws: { error in
            let e = error as? StateStoreError
            return e?.code == .damaged || e?.code == .notSQLite
        }

        try Data().write(to: URL(fileURLWithPath: path))
        #expect { try SQLiteStateStore.open(path: path, create: true) } throws: { error in
            (error as? StateStoreError)?.code == .damaged
        }
    }

    @Test func secondLockFailsNamingTheHolder() throws {
        let path = temporaryPath()
        defer { cleanup(path) }
        try FileManager.default.createDirectory(atPath: (path as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
        var first: StateLock? = try StateLock.acquire(statePath: path, operation: "tidemark apply")
        _ = first
        #expect { try StateLock.acquire(statePath: path, operation: "tidemark apply") } throws: { error in
            let text = "\(error)"
            return text.contains("locked by tidemark apply (pid \(getpid())") && text.contains(" since 20")
        }
        first = nil
        _ = try StateLock.acquire(statePath: path, operation: "tidemark apply")
    }

    @Test func journalKnowsWhatWasDone() async throws {
        let path = temporaryPath()
        defer { cleanup(path) }
        let store = try #require(try SQLiteStateStore.open(path: path, create: true))
        var state = try store.load()
        for token in ["a:APA91b", "b:APA91b", "c:APA91b"] { state.tokens.intern(token) }
        let desired = DesiredState(topics: [DesiredTopic(name: "t", members: TokenSet([0, 1, 2]))], groups: [],
            knownTokens: TokenSet([0, 1, 2]))
        let ops = [
            PlannedOperation(kind: .subscribe, target: "t", tokens: ["a:APA91b"]),
            PlannedOperation(kind: .subscribe, target: "t", tokens: ["b:APA91b", "c:APA91b"]),
        ]
        let plan = Plan(tidemarkVersion: "t", createdAt: Date(), lineage: state.lineage, serial: state.serial,
            manifestsDigest: "d", backend: BackendIdentity(kind: "embedded", project: "p"), refreshed: false,
            operations: ops, topics: [], groups: [], diagnostics: [], observations: Observations())
        let session = try ApplySession.begin(plan: plan, desired: desired, store: store, state: state)
        try await session.completed(index: 1, operation: ops[1], outcomes: [.ok, .ok], groupKey: nil)
        let unfinished = try #require(try store.unfinishedApply())
        #expect(unfinished.done == [1])
        #expect(unfinished.plan.operations == ops)
        let reloaded = try store.load()
        #expect(reloaded.topics["t"]?.managed.count == 2)
        try await session.finish()
        #expect(try store.unfinishedApply() == nil)
    }

    @Test func beginDeletesTopicRowsThatBookkeepingDrops() throws {
        let path = temporaryPath()
        defer { cleanup(path) }
        let store = try #require(try SQLiteStateStore.open(path: path, create: true))
        var state = try store.load()
        state.tokens.intern("a:APA91b")
        state.growToTable()
        // Managed once, no longer observed, no longer declared: nothing to do, and nothing to remember.
        state.topics["old"] = TopicState(managed: TokenSet([0]))
        try store.save(&state, { var w = SQLiteStateStore.Write(); w.topics = ["old"]; return w }())
        let plan = Plan(tidemarkVersion: "t", createdAt: Date(), lineage: state.lineage, serial: state.serial,
            manifestsDigest: "d", backend: BackendIdentity(kind: "embedded", project: "p"), refreshed: false,
            operations: [], topics: [], groups: [], diagnostics: [], observations: Observations())
        let desired = DesiredState(topics: [], groups: [], knownTokens: TokenSet([0]))
        _ = try ApplySession.begin(plan: plan, desired: desired, store: store, state: state)
        #expect(try store.load().topics["old"] == nil)
    }
}
