import Foundation
import Testing
import TidemarkCore
import TidemarkTesting

@testable import TidemarkStore

/// PgBouncer in transaction pooling in front of the test server (`scripts/pgbouncer.sh`), named by
/// TIDEMARK_TEST_PGBOUNCER_URL: how managed PostgreSQL is often reached. Each transaction may run on
/// another server connection, so nothing of tidemark's may rest on session state. Skipped on a
/// developer's machine without it; in CI (TIDEMARK_REQUIRE_PGBOUNCER) it fails instead.
enum TestPgBouncer {
    static let url = ProcessInfo.processInfo.environment["TIDEMARK_TEST_PGBOUNCER_URL"]
    static let required = ProcessInfo.processInfo.environment["TIDEMARK_REQUIRE_PGBOUNCER"] != nil
    static var enabled: Bool { url != nil || required }

    static func store(
        _ workspace: String = "bouncer-\(UUID().uuidString.prefix(8))", database: String? = nil
    )
        throws -> PostgresStateStore
    {
        guard let url else {
            throw StateStoreError(
                .io, path: "TIDEMARK_TEST_PGBOUNCER_URL",
                "no PgBouncer for the tests: run them with scripts/test.sh, which starts one")
        }
        var components = URLComponents(string: url)!
        if let database { components.path = "/\(database)" }
        // Reads and writes may take as long as a process starved by blocking CLI tests needs.
        components.queryItems = (components.queryItems ?? []) + [URLQueryItem(name: "timeout", value: "600")]
        // Leases long enough that a starved heartbeat cannot let one lapse mid-test.
        return PostgresStateStore(
            url: try PostgresURL(components.string!), workspace: workspace, leaseDuration: .seconds(600))
    }
}

@Suite(.enabled(if: TestPgBouncer.enabled)) struct PgBouncerStateStoreTests {
    @Test(arguments: StateStoreConformance.Check.allCases)
    func conformsThroughTransactionPooling(_ check: StateStoreConformance.Check) async throws {
        let store = try TestPgBouncer.store()
        try await StateStoreConformance.run(check) { store }
        await store.close()
    }

    /// A database that has never seen tidemark is created and migrated through the bouncer, by
    /// several runners at once (the migration's lock is scoped to its transaction).
    @Test func aNewDatabaseIsMigratedThroughIt() async throws {
        let direct = try TestPostgres.store()
        let database = "bouncer_\(UUID().uuidString.prefix(8).lowercased())"
        try await direct.execute("CREATE DATABASE \(database)")
        await direct.close()
        try await withThrowingTaskGroup(of: Int?.self) { group in
            for runner in 0..<4 {
                group.addTask {
                    let store = try TestPgBouncer.store("runner-\(runner)", database: database)
                    var state = StateStoreConformance.sample(tokens: 50)
                    try await store.save(&state, StateStoreConformance.writeAll(state), at: 1)
                    let loaded = try await store.load()
                    await store.close()
                    return loaded?.serial
                }
            }
            for try await serial in group { #expect(serial == 1) }
        }
    }

    /// Leases and fencing hold through the bouncer: one runner at a time, and a runner whose lease
    /// was broken cannot write, though its next statement may run on any server connection.
    @Test func leasesAndFencingHoldThroughIt() async throws {
        let name = "bouncer-fence-\(UUID().uuidString.prefix(8))"
        let runner = try TestPgBouncer.store(name)
        let other = try TestPgBouncer.store(name)
        var state = StateStoreConformance.sample(tokens: 10)
        let lease = try await runner.lock(StateStoreConformance.holder)
        await #expect { _ = try await other.lock(StateStoreConformance.holder) } throws: {
            ($0 as? StateStoreError)?.code == .locked
        }
        try await runner.save(&state, StateStoreConformance.writeAll(state), at: 1)
        let current = try #require(try await other.lease())
        _ = try await other.forceUnlock(
            String(current.id.prefix(8)),
            by: LockHolder(
                operation: "tidemark state force-unlock", user: "oncall", host: "laptop", pid: 1, since: Date()))
        await #expect { try await runner.save(&state, StateWrite(), at: 2) } throws: {
            ($0 as? StateStoreError)?.code == .leaseLost
        }
        #expect(try await other.load()?.serial == 1, "the fenced runner wrote nothing")
        await lease.release()
        await runner.close()
        await other.close()
    }

    /// Twelve concurrent savers on separate workspaces through a pool of eight: every
    /// save commits whole (journal and memberships together), none is lost or mixed up.
    @Test func concurrentWorkspacesThroughASmallPool() async throws {
        let prefix = "bouncer-many-\(UUID().uuidString.prefix(8))"
        try await withThrowingTaskGroup(of: Void.self) { group in
            for i in 0..<12 {
                group.addTask {
                    let store = try TestPgBouncer.store("\(prefix)-\(i)")
                    var state = StateStoreConformance.sample(tokens: 30)
                    state.setTopic("own-\(i)", TopicState(managed: TokenSet([UInt32(i)])))
                    for step in 0..<5 {
                        var write = StateStoreConformance.writeAll(state)
                        if step > 0 { write = StateWrite() }
                        try await store.save(&state, write, at: Int64(step))
                    }
                    let loaded = try #require(try await store.load())
                    #expect(loaded.serial == 5 && loaded.topics["own-\(i)"]?.managed == TokenSet([UInt32(i)]))
                    await store.close()
                }
            }
            try await group.waitForAll()
        }
    }
}
