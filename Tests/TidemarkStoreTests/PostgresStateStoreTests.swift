import Foundation
import Synchronization
import Testing
import TidemarkCore
import TidemarkTesting

@testable import TidemarkStore

/// The real server the test command starts (`scripts/postgres.sh`), named by TIDEMARK_TEST_POSTGRES_URL.
/// Without it these tests are skipped on a developer's machine, and fail in CI (`CI` set): they never
/// silently pass there.
enum TestPostgres {
    /// With a timeout a process starved by blocking CLI tests cannot pass (the store's own default is
    /// 30 s, which a test process whose cooperative pool is blocked for a while can exceed).
    static let url = ProcessInfo.processInfo.environment["TIDEMARK_TEST_POSTGRES_URL"].map {
        $0 + ($0.contains("?") ? "&" : "?") + "timeout=600"
    }
    static let required =
        ProcessInfo.processInfo.environment["TIDEMARK_REQUIRE_POSTGRES"] != nil
        || ProcessInfo.processInfo.environment["CI"] != nil
    static var enabled: Bool { url != nil || required }

    static func store(
        _ workspace: String = "test-\(UUID().uuidString.prefix(8))", lease: Duration = .seconds(600)
    )
        throws -> PostgresStateStore
    {
        guard let url else {
            throw StateStoreError(
                .io, path: "TIDEMARK_TEST_POSTGRES_URL",
                "no PostgreSQL server for the tests: run them with scripts/test.sh, which starts one")
        }
        return PostgresStateStore(url: try PostgresURL(url), workspace: workspace, leaseDuration: lease)
    }

    /// A new, empty database on the test server, named `prefix_` and eight random characters: the
    /// URL of a store in it.
    static func freshDatabase(_ prefix: String) async throws -> PostgresURL {
        let url = try #require(Self.url)
        let admin = PostgresStateStore(url: try PostgresURL(url))
        let database = "\(prefix)_\(UUID().uuidString.prefix(8).lowercased())"
        try await admin.execute("CREATE DATABASE \(database)")
        await admin.close()
        var components = URLComponents(string: url)!
        components.path = "/\(database)"
        return try PostgresURL(components.string!)
    }
}

@Suite(.enabled(if: TestPostgres.enabled)) struct PostgresStateStoreTests {
    @Test(arguments: StateStoreConformance.Check.allCases)
    func conforms(_ check: StateStoreConformance.Check) async throws {
        let store = try TestPostgres.store()
        try await StateStoreConformance.run(check) { store }
        await store.close()
    }

    /// Workspaces are separate states in one database: their own lineage, serial, journal and lease.
    @Test func workspacesAreIndependent() async throws {
        let name = "ws-\(UUID().uuidString.prefix(8))"
        let made = Mutex<[PostgresStateStore]>([])
        try await StateStoreConformance.workspacesAreIndependent(named: { name + "-" + $0 }) { workspace in
            let store = try TestPostgres.store(name + "-" + workspace)
            made.withLock { $0.append(store) }
            return store
        }
        for store in made.withLock({ $0 }) { await store.close() }
    }

    /// Two workspaces of one database written in one transaction (`state mv` within it): both land, or
    /// neither does when one of them may not be written (another run holds its lease).
    @Test func twoWorkspacesOfOneDatabaseAreWrittenTogetherOrNotAtAll() async throws {
        let name = "together-\(UUID().uuidString.prefix(8))"
        let a = try TestPostgres.store(name + "-a", lease: .seconds(3600))
        let b = try TestPostgres.store(name + "-b", lease: .seconds(3600))
        let otherRunner = try TestPostgres.store(name + "-b", lease: .seconds(3600))
        var first = StateStoreConformance.sample(tokens: 10)
        try await a.save(&first, StateStoreConformance.writeAll(first), at: 1)
        var second = StateStoreConformance.sample(tokens: 10, lineage: "b-lineage")
        try await b.save(&second, StateStoreConformance.writeAll(second), at: 1)
        let topic = try #require(first.topics.keys.sorted().first)
        // Moved: gone from a, in b, one transaction.
        var (from, to) = (first, second)
        _ = to.receive(StateAddress(.topic, topic), from: from)
        _ = from.release(StateAddress(.topic, topic))
        var writeFrom = StateWrite()
        writeFrom.includeTopicsAndGroups(before: first, after: from)
        var writeTo = StateWrite()
        writeTo.includeTopicsAndGroups(before: second, after: to)
        writeTo.allTokens = true
        let serials = try await a.saveTogether(&from, writeFrom, with: b, &to, writeTo, at: 2)
        #expect(serials == (first.serial + 1, second.serial + 1))
        #expect(try await a.load()?.topics[topic] == nil)
        #expect(try await b.load()?.topics[topic] != nil)
        // Another run holds b's lease: nothing is written in either workspace.
        let lease = try await otherRunner.lock(StateStoreConformance.holder)
        var again = from
        again.setTopic("extra", TopicState())
        var writeExtra = StateWrite()
        writeExtra.topics = ["extra"]
        var other = to
        await #expect(throws: StateStoreError.self) {
            _ = try await a.saveTogether(&again, writeExtra, with: b, &other, StateWrite(), at: 3)
        }
        let unchanged = try #require(try await a.load())
        #expect(unchanged.topics["extra"] == nil && unchanged.serial == from.serial)
        await lease.release()
        // Not one database (or a SQLite file): refused as unsupported, nothing written.
        let path = NSTemporaryDirectory() + "/together-\(UUID().uuidString).db"
        let file = SQLiteStateStore(path: path, location: path)
        await #expect {
            _ = try await a.saveTogether(&again, writeExtra, with: file, &other, StateWrite(), at: 4)
        } throws: {
            ($0 as? StateStoreError)?.code == .unsupported
        }
        for store in [a, b, otherRunner] { await store.close() }
    }

    /// Fencing: once a lease is broken (or expires), its holder can no longer write, even though it
    /// still believes it holds the lock.
    @Test func aBrokenLeaseCannotWrite() async throws {
        let name = "fence-\(UUID().uuidString.prefix(8))"
        // A lease that cannot expire during the test: a suite that starves this process of its
        // heartbeat (blocking CLI tests fill the cooperative pool) must not make it lapse.
        let runner = try TestPostgres.store(name, lease: .seconds(3600))
        let operator_ = try TestPostgres.store(name, lease: .seconds(3600))
        var state = StateStoreConformance.sample(tokens: 10)
        let lease = try await runner.lock(StateStoreConformance.holder)
        try await runner.save(&state, StateStoreConformance.writeAll(state), at: 1)
        // Another process cannot write or lock while the lease lives.
        var copy = state
        await #expect { try await operator_.save(&copy, StateWrite(), at: 2) } throws: {
            ($0 as? StateStoreError)?.code == .locked
        }
        let current = try #require(try await operator_.lease())
        let broken = try await operator_.forceUnlock(
            String(current.id.prefix(8)),
            by: LockHolder(
                operation: "tidemark state force-unlock", user: "oncall", host: "laptop", pid: 1, since: Date()))
        #expect(broken == StateStoreConformance.holder)
        await #expect { try await runner.save(&state, StateWrite(), at: 3) } throws: { error in
            let e = error as? StateStoreError
            return e?.code == .leaseLost && e!.description.contains("no longer holds the lease")
        }
        #expect(try await runner.load()?.serial == 1, "nothing was written")
        // The operator may now take the lease and write.
        let second = try await operator_.lock(StateStoreConformance.holder)
        try await operator_.save(&copy, StateWrite(), at: 4)
        await second.release()
        await lease.release()
        await runner.close()
        await operator_.close()
    }

    /// A lease that is not renewed expires; its holder may not write afterwards. (The expiry is moved
    /// into the past on the server rather than waited for, so a loaded machine cannot make it flaky.)
    @Test func anExpiredLeaseCannotWrite() async throws {
        let store = try TestPostgres.store()
        var state = StateStoreConformance.sample(tokens: 10)
        let lease = try await store.lock(StateStoreConformance.holder)
        try await store.save(&state, StateStoreConformance.writeAll(state), at: 1)
        try await store.execute(
            "UPDATE tidemark_leases SET expires_at = expires_at - 3600000 WHERE workspace = '\(store.workspace)'")
        await #expect { try await store.save(&state, StateWrite(), at: 2) } throws: {
            ($0 as? StateStoreError)?.description.contains("expired") == true
        }
        #expect(try await store.lockHolder() == nil)
        #expect(try await store.load()?.serial == 1, "nothing was written")
        await store.close()
    }

    @Test func urlsAreParsedAsLibpqDoesAndNeverShowThePassword() throws {
        let url = try PostgresURL(
            "postgresql://ci:s3cr%40t@db.example:6432/tidemark?sslmode=verify-full&sslrootcert=/etc/ca.pem",
            environment: [:])
        #expect(url.user == "ci" && url.password == "s3cr@t" && url.host == "db.example" && url.port == 6432)
        #expect(url.database == "tidemark" && url.sslMode == .verifyFull && url.sslRootCert == "/etc/ca.pem")
        #expect(!url.display.contains("s3cr"))
        let fromEnvironment = try PostgresURL("postgres://ci@db", environment: ["PGPASSWORD": "pw"])
        #expect(fromEnvironment.password == "pw" && fromEnvironment.port == 5432 && fromEnvironment.database == "ci")
        #expect(throws: StateStoreError.self) { try PostgresURL("postgres://db/x?sslmode=sometimes", environment: [:]) }
        do {
            _ = try PostgresURL("postgres://u:hunter2@/x", environment: [:])
        } catch {
            #expect(!"\(error)".contains("hunter2"))
        }
    }

    /// An unreachable server is one line naming the store, never a hang or a dump.
    @Test func anUnreachableServerIsOneLine() async throws {
        let store = PostgresStateStore(
            url: try PostgresURL("postgres://tidemark:pw@127.0.0.1:1/x?sslmode=disable", environment: [:]))
        do {
            _ = try await store.load()
            Issue.record("loaded from a server that does not exist")
        } catch let error as StateStoreError {
            #expect(error.description.contains("postgres://tidemark@127.0.0.1:1/x"))
            #expect(!error.description.contains("pw") && !error.description.contains("PSQLError"))
        }
    }

    /// Reading serve's records (`tidemark status`, `suspend` before it writes) from a database without
    /// tidemark's tables finds none and creates none: a wrong URL leaves the database as it was.
    @Test func readingRecordsCreatesNoTables() async throws {
        let bare = PostgresStateStore(url: try await TestPostgres.freshDatabase("bare"))
        let record = try await bare.serveRecord()
        #expect(record.owner == nil && record.status == nil && record.replicas.isEmpty)
        #expect(try await bare.serveRecords().isEmpty)
        #expect(try await bare.currentSchema() == nil, "no tidemark_schema table: no migration ran")
        _ = try await bare.load()  // a command that works on the state creates it
        #expect(try await bare.currentSchema() == PostgresStateStore.schemaVersion)
        await bare.close()
    }

    /// A database written by a newer tidemark is refused with the version it needs.
    @Test func aNewerSchemaIsRefused() async throws {
        let store = try TestPostgres.store()
        _ = try await store.load()  // creates the schema
        await store.close()
        let newer = PostgresStateStore(url: try await TestPostgres.freshDatabase("newer"))
        try await newer.execute("CREATE TABLE tidemark_schema (version INTEGER NOT NULL)")
        try await newer.execute("INSERT INTO tidemark_schema VALUES (99)")
        await #expect { try await newer.load() } throws: { error in
            let e = error as? StateStoreError
            return e?.code == .newerFormat && e!.description.contains("schema version 99")
        }
        await newer.close()
    }
}
