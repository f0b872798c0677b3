import Foundation
import GRDB
import Testing
import TidemarkCore
import TidemarkTesting

@testable import TidemarkStore

@Suite struct SQLiteStateStoreTests {
    func temporaryPath(_ name: String = "state.db") -> String {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("tm-store-\(UUID().uuidString)")
        return dir.appendingPathComponent(".tidemark").appendingPathComponent(name).path
    }

    func cleanup(_ path: String) {
        try? FileManager.default.removeItem(
            atPath: ((path as NSString).deletingLastPathComponent as NSString).deletingLastPathComponent)
    }

    @Test(arguments: StateStoreConformance.Check.allCases)
    func conforms(_ check: StateStoreConformance.Check) async throws {
        let path = temporaryPath()
        defer { cleanup(path) }
        try await StateStoreConformance.run(check) { SQLiteStateStore(path: path, location: ".tidemark/state.db") }
    }

    /// What the suite checks of one store object holds for a second one opening the same file: the
    /// file is the state, and it is self-contained.
    @Test func aSecondStoreOnTheSameFileSeesEverything() async throws {
        let path = temporaryPath()
        defer { cleanup(path) }
        var state = StateStoreConformance.sample()
        var write = StateStoreConformance.writeAll(state)
        write.beginApply = ("apply-1", StateStoreConformance.plan([], state: state))
        try await SQLiteStateStore(path: path).save(&state, write, at: 1000)
        let reopened = SQLiteStateStore(path: path)
        let loaded = try #require(try await reopened.load())
        #expect(loaded.serial == 1 && loaded.topics == state.topics && loaded.groups == state.groups)
        #expect(try await reopened.unfinishedApply()?.id == "apply-1")
    }

    @Test func fileIsPrivateToItsUser() async throws {
        let path = temporaryPath()
        defer { cleanup(path) }
        var state = State(lineage: "l", serial: 0)
        try await SQLiteStateStore(path: path).save(&state, StateWrite(), at: 1)
        let mode = try FileManager.default.attributesOfItem(atPath: path)[.posixPermissions] as? Int
        #expect(mode == 0o600)
        let dirMode =
            try FileManager.default.attributesOfItem(atPath: (path as NSString).deletingLastPathComponent)[
                .posixPermissions] as? Int
        #expect(dirMode == 0o700)
    }

    @Test func readingAMissingFileCreatesNothing() async throws {
        let path = temporaryPath()
        defer { cleanup(path) }
        let store = SQLiteStateStore(path: path)
        #expect(try await store.load() == nil)
        #expect(try await store.unfinishedApply() == nil)
        #expect(try await store.applies(limit: 5).isEmpty)
        #expect(!FileManager.default.fileExists(atPath: path))
    }

    @Test func refusesForeignAndDamagedFilesWithoutTouchingThem() async throws {
        let path = temporaryPath()
        defer { cleanup(path) }
        try FileManager.default.createDirectory(
            atPath: (path as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
        let garbage = Data("this is not a database at all, just some text\n".utf8)
        try garbage.write(to: URL(fileURLWithPath: path))
        var state = State(lineage: "l", serial: 0)
        await #expect { try await SQLiteStateStore(path: path).save(&state, StateWrite(), at: 1) } throws: { error in
            let e = error as? StateStoreError
            return e?.code == .notSQLite && e!.description.contains("left untouched")
        }
        #expect(try Data(contentsOf: URL(fileURLWithPath: path)) == garbage)

        try FileManager.default.removeItem(atPath: path)
        let queue = try DatabaseQueue(path: path)
        try await queue.write { try $0.execute(sql: "CREATE TABLE people (name TEXT)") }
        await #expect { try await SQLiteStateStore(path: path).load() } throws: { error in
            (error as? StateStoreError)?.code == .foreign
        }

        try FileManager.default.removeItem(atPath: path)
        try await SQLiteStateStore(path: path).save(&state, StateWrite(), at: 1)
        let data = try Data(contentsOf: URL(fileURLWithPath: path))
        try data.prefix(1024).write(to: URL(fileURLWithPath: path))
        await #expect { try await SQLiteStateStore(path: path).load() } throws: { error in
            let e = error as? StateStoreError
            return e?.code == .damaged || e?.code == .notSQLite
        }

        try Data().write(to: URL(fileURLWithPath: path))
        await #expect { try await SQLiteStateStore(path: path).load() } throws: { error in
            (error as? StateStoreError)?.code == .damaged
        }
    }

    /// State rows tidemark never writes (edited by hand, damaged, written by something else) are refused
    /// naming the file, the table and what to do; never read as 0, never a crash or a raw DecodingError.
    @Test(arguments: [
        ("UPDATE meta SET value = 'abc' WHERE key = 'serial'", "meta", "load"),
        ("DELETE FROM meta WHERE key = 'serial'", "meta", "load"),
        ("UPDATE tokens SET seen_at = 'yesterday' WHERE id = 1", "tokens", "load"),
        ("UPDATE tokens SET id = 70 WHERE id = 2", "tokens", "load"),
        ("UPDATE tokens SET token = x'41424344' WHERE id = 1", "tokens", "load"),
        ("UPDATE tokens SET dead = 'yes' WHERE id = 3", "tokens", "load"),
        ("UPDATE tokens SET token = (SELECT token FROM tokens WHERE id = 0) WHERE id = 4", "tokens", "load"),
        // A token that is none (edited by hand): named, not planned as a rotation of its device.
        ("UPDATE tokens SET token = 'not a token' WHERE id = 5", "tokens", "load"),
        ("UPDATE tokens SET token = 'abc' WHERE id = 6", "tokens", "load"),
        ("UPDATE topics SET mode = 'sometimes'", "topics", "load"),
        ("UPDATE topics SET managed = 'not a blob'", "topics", "load"),
        ("UPDATE groups SET protect = 'maybe'", "groups", "load"),
        ("INSERT INTO row_versions (key, serial) VALUES ('topic:x', 'soon')", "row_versions", "load"),
        ("INSERT INTO apply_operations VALUES ('apply-1', 'x', 1, 1, 0)", "apply_operations", "journal"),
        ("INSERT INTO apply_operations VALUES ('apply-1', 99, 1, 1, 0)", "apply_operations", "journal"),
        ("UPDATE applies SET started_at = 'noon'", "applies", "journal"),
        ("UPDATE applies SET plan = x'00ff'", "journal", "journal"),
        ("UPDATE applies SET status = 'paused'", "applies", "history"),
        ("UPDATE applies SET id = NULL", "applies", "history"),
    ])
    func rowsTidemarkDidNotWriteAreRefused(_ statement: String, _ table: String, _ reader: String) async throws {
        let path = temporaryPath()
        defer { cleanup(path) }
        var state = StateStoreConformance.sample(tokens: 10)
        let store = SQLiteStateStore(path: path, location: ".tidemark/state.db")
        var write = StateWrite()
        write.topics = ["news", "sports"]
        write.groups = ["family"]
        write.beginApply = (
            "apply-1",
            StateStoreConformance.plan(
                [PlannedOperation(kind: .subscribe, target: "news", tokens: [Fixtures.token(0)])], state: state)
        )
        try await store.save(&state, write, at: 1000)
        let queue = try DatabaseQueue(path: path)
        try await queue.write { try $0.execute(sql: statement) }
        try queue.close()
        let before = try Data(contentsOf: URL(fileURLWithPath: path))
        let fresh = SQLiteStateStore(path: path, location: ".tidemark/state.db")
        do {
            switch reader {
            case "load": _ = try await fresh.load()
            case "journal": _ = try await fresh.unfinishedApply()
            default: _ = try await fresh.applies(limit: 10)
            }
            Issue.record("\(statement): read as if tidemark had written it")
        } catch let error as StateStoreError {
            #expect(error.code == .damaged, "\(statement): \(error)")
            #expect(error.description.contains(".tidemark/state.db"))
            #expect(error.description.contains(table), "\(statement): \(error)")
            #expect(error.description.contains("restore it from a backup"))
            #expect(!error.description.contains("DecodingError") && !error.description.contains("Error Domain"))
        }
        #expect(try Data(contentsOf: URL(fileURLWithPath: path)) == before, "left untouched")
    }

    /// `state:` naming a directory or a FIFO says so (not "the file is empty", not a hang).
    @Test func aDirectoryOrAFIFOIsNoStateFile() async throws {
        let path = temporaryPath()
        defer { cleanup(path) }
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        await #expect { try await SQLiteStateStore(path: path).load() } throws: { error in
            (error as? StateStoreError)?.description.contains("is a directory") == true
        }
        try FileManager.default.removeItem(atPath: path)
        #expect(mkfifo(path, 0o600) == 0)
        await #expect { try await SQLiteStateStore(path: path).load() } throws: { error in
            (error as? StateStoreError)?.description.contains("not a regular file") == true
        }
    }

    /// The file alone holds every committed save: nothing lives only in the -wal file between commits,
    /// so a CI job that uploads state.db alone (after a kill, say) uploads all of it.
    @Test func theFileAloneHoldsEveryCommit() async throws {
        let path = temporaryPath()
        defer { cleanup(path) }
        let store = SQLiteStateStore(path: path)
        var state = StateStoreConformance.sample(tokens: 50)
        try await store.save(&state, StateStoreConformance.writeAll(state), at: 1)
        var write = StateWrite()
        write.beginApply = (
            "apply-1",
            StateStoreConformance.plan(
                [PlannedOperation(kind: .subscribe, target: "news", tokens: [Fixtures.token(0)])], state: state)
        )
        try await store.save(&state, write, at: 2)
        // Copy the main file only, while the store is still open (as after a SIGKILL).
        let copy = (path as NSString).deletingLastPathComponent + "/copied.db"
        try FileManager.default.copyItem(atPath: path, toPath: copy)
        let alone = SQLiteStateStore(path: copy)
        #expect(try await alone.load()?.serial == 2)
        #expect(try await alone.unfinishedApply()?.id == "apply-1")
    }

    /// The lock is flock(2): a second store object on the same file, in this process or another, is refused.
    @Test func secondLockFailsNamingTheHolder() async throws {
        let path = temporaryPath()
        defer { cleanup(path) }
        let holder = LockHolder(
            operation: "tidemark apply", user: "ci", host: "h", pid: getpid(),
            since: Date(timeIntervalSince1970: Date().timeIntervalSince1970.rounded(.down)))
        let first = try await SQLiteStateStore(path: path).lock(holder)
        await #expect { _ = try await SQLiteStateStore(path: path).lock(holder) } throws: { error in
            let text = "\(error)"
            return text.contains("locked by tidemark apply (pid \(getpid())") && text.contains(" since 20")
        }
        #expect(try await SQLiteStateStore(path: path).lockHolder() == holder)
        await first.release()
        #expect(try await SQLiteStateStore(path: path).lockHolder() == nil)
        _ = try await SQLiteStateStore(path: path).lock(holder)
    }

    @Test func beginDeletesTopicRowsThatBookkeepingDrops() async throws {
        let path = temporaryPath()
        defer { cleanup(path) }
        let store = SQLiteStateStore(path: path)
        var state = State(lineage: "l", serial: 0)
        state.intern("a:APA91b")
        // Managed once, no longer observed, no longer declared: nothing to do, and nothing to remember.
        state.setTopic("old", TopicState(managed: TokenSet([0])))
        try await store.save(
            &state,
            {
                var w = StateWrite()
                w.topics = ["old"]
                return w
            }(), at: 1)
        let plan = StateStoreConformance.plan([], state: state)
        let desired = DesiredState(topics: [], groups: [], knownTokens: TokenSet([0]))
        _ = try await ApplySession.begin(
            plan: plan, desired: desired, store: store, state: state,
            timing: ManualClock().timing)
        #expect(try await store.load()?.topics["old"] == nil)
    }
}

/// The in-memory twin passes the same suite, so unit tests that use it test what SQLite does.
@Suite struct InMemoryStateStoreTests {
    @Test(arguments: StateStoreConformance.Check.allCases)
    func conforms(_ check: StateStoreConformance.Check) async throws {
        try await StateStoreConformance.run(check) { InMemoryStateStore() }
    }
}

@Suite struct SQLiteStateFormatTests {
    /// A file written before audiences (format 1, no audience columns) loads with every group a device
    /// group, and its first write brings it to format 2 without losing a row; a tidemark that reads only
    /// format 1 would then refuse it rather than drop the audiences.
    @Test func aFormatOneFileIsBroughtUpToFormatTwo() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("tm-format-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: dir) }
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        let path = dir.appendingPathComponent("state.db").path
        var state = StateStoreConformance.sample()
        state.keepGroups { name, _ in name == "family" }
        state.setGroup("family", GroupState(key: "APA91bkey", members: TokenSet([7, 8])))
        try await SQLiteStateStore(path: path).save(&state, StateStoreConformance.writeAll(state), at: 1000)
        do {
            let queue = try DatabaseQueue(path: path)
            try await queue.write { db in
                for column in ["audience", "exported", "exported_at"] {
                    try db.execute(sql: "ALTER TABLE groups DROP COLUMN \(column)")
                }
                try db.execute(sql: "UPDATE meta SET value = '1' WHERE key = 'format_version'")
            }
            try queue.close()
        }
        let store = SQLiteStateStore(path: path)
        var loaded = try #require(try await store.load())
        #expect(loaded.groups == state.groups)
        var family = try #require(loaded.groups["family"])
        family.audience = true
        family.exported = TokenSet([7, 8, 9])
        family.exportedAt = 77
        loaded.setGroup("family", family)
        var write = StateWrite()
        write.groups = ["family"]
        try await store.save(&loaded, write, at: 2000)
        let again = try #require(try await SQLiteStateStore(path: path).load())
        #expect(again.groups == loaded.groups)
        let version = try await DatabaseQueue(path: path).read { db in
            try String.fetchOne(db, sql: "SELECT value FROM meta WHERE key = 'format_version'")
        }
        #expect(version == "2")
    }

    /// A file whose `serve` records were written before replicas recorded their presence keeps its
    /// owner and status, and takes presences from its next write on.
    @Test func serveRecordsWrittenBeforePresencesAreKept() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("tm-format-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: dir) }
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        let path = dir.appendingPathComponent("state.db").path
        let queue = try DatabaseQueue(path: path)
        try await queue.write { db in
            try db.execute(
                sql: """
                    PRAGMA application_id = \(SQLiteStateStore.applicationID);
                    CREATE TABLE tidemark_serve (workspace TEXT PRIMARY KEY, owner TEXT,
                        owner_expires INTEGER NOT NULL DEFAULT 0, owner_fence INTEGER NOT NULL DEFAULT 0,
                        suspended INTEGER NOT NULL DEFAULT 0, suspended_by TEXT, reconcile_at INTEGER NOT NULL DEFAULT 0,
                        reconcile_by TEXT, status BLOB, status_at INTEGER NOT NULL DEFAULT 0);
                    INSERT INTO tidemark_serve (workspace, owner, owner_expires, owner_fence, status)
                        VALUES ('default', 'replica-a', 99999999999999, 4, x'7B7D');
                    """)
        }
        try queue.close()
        let store = SQLiteStateStore(path: path)
        let old = try await store.serveRecord()
        #expect(
            old.owner == "replica-a" && old.ownerFence == 4 && old.status == Data("{}".utf8) && old.replicas.isEmpty)
        let standby = try await store.claimOwnership("replica-b", for: .seconds(3600), take: true)
        #expect(standby.owner == "replica-a" && standby.liveReplicas(at: Date()) == ["replica-b"])
        #expect(try await SQLiteStateStore(path: path).serveRecord().replicas.keys.sorted() == ["replica-b"])
    }
}

/// Workspaces share one SQLite file: each with its own tables, lineage, serial, journal and lock.
@Suite struct SQLiteWorkspaceTests {
    func directory() throws -> URL {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("tm-ws-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        return dir
    }

    @Test(arguments: StateStoreConformance.Check.allCases)
    func aWorkspaceConforms(_ check: StateStoreConformance.Check) async throws {
        let dir = try directory()
        defer { try? FileManager.default.removeItem(at: dir) }
        let path = dir.appendingPathComponent("state.db").path
        // The default workspace has state of its own in the same file, which the checks must not see.
        var other = StateStoreConformance.sample(tokens: 30, lineage: "the-default-lineage")
        try await SQLiteStateStore(path: path).save(&other, StateStoreConformance.writeAll(other), at: 1)
        try await StateStoreConformance.run(check) { SQLiteStateStore(path: path, workspace: "staging-eu") }
        let untouched = try #require(try await SQLiteStateStore(path: path).load())
        #expect(untouched.lineage == "the-default-lineage" && untouched.serial == 1)
    }

    @Test func workspacesAreIndependentInOneFile() async throws {
        let dir = try directory()
        defer { try? FileManager.default.removeItem(at: dir) }
        let path = dir.appendingPathComponent("state.db").path
        try await StateStoreConformance.workspacesAreIndependent { SQLiteStateStore(path: path, workspace: $0) }
        // Workspace names differ by case; SQLite's table names do not, so the names are escaped.
        var upper = StateStoreConformance.sample(tokens: 20, lineage: "upper-case")
        try await SQLiteStateStore(path: path, workspace: "Dev").save(&upper, StateWrite(), at: 9)
        #expect(try await SQLiteStateStore(path: path, workspace: "dev").load()?.lineage != "upper-case")
        #expect(try await SQLiteStateStore(path: path, workspace: "Dev").load()?.lineage == "upper-case")
        #expect(try await SQLiteStateStore(path: path).load() == nil, "nor does the default workspace see them")
        let files = try FileManager.default.contentsOfDirectory(atPath: dir.path).filter { $0.hasSuffix(".db") }
        #expect(files == ["state.db"], "one file holds every workspace: \(files)")
    }

    /// A workspace an older tidemark kept in a file of its own (state.prod.db) is moved into the state
    /// file on first use, journal included (an interrupted apply still resumes), and the old file is
    /// renamed so that it is read only once.
    @Test func anOlderWorkspaceFileIsMovedIn() async throws {
        let dir = try directory()
        defer { try? FileManager.default.removeItem(at: dir) }
        let path = dir.appendingPathComponent("state.db").path
        let legacyPath = dir.appendingPathComponent("state.prod.db").path
        var state = StateStoreConformance.sample(tokens: 40)
        var write = StateStoreConformance.writeAll(state)
        write.beginApply = ("apply-7", StateStoreConformance.plan([], state: state))
        try await SQLiteStateStore(path: legacyPath).save(&state, write, at: 1000)
        var defaultState = StateStoreConformance.sample(tokens: 10, lineage: "default-lineage")
        try await SQLiteStateStore(path: path).save(&defaultState, StateWrite(), at: 1)

        let store = SQLiteStateStore(path: path, workspace: "prod", legacyPath: legacyPath)
        let loaded = try #require(try await store.load())
        #expect(loaded.lineage == state.lineage && loaded.serial == state.serial)
        #expect(loaded.topics == state.topics && loaded.groups == state.groups && loaded.tokens.count == 40)
        #expect(try await store.unfinishedApply()?.id == "apply-7", "the journal came along")
        #expect(!FileManager.default.fileExists(atPath: legacyPath))
        #expect(FileManager.default.fileExists(atPath: legacyPath + ".moved"))
        #expect(try await SQLiteStateStore(path: path).load()?.lineage == "default-lineage")
        // Later runs read the state file alone.
        let again = SQLiteStateStore(path: path, workspace: "prod", legacyPath: legacyPath)
        #expect(try await again.load()?.serial == state.serial)
    }
}
