import Foundation
import Synchronization
import Testing
import TidemarkCore
import TidemarkRuntime
import TidemarkTesting

@testable import TidemarkServe

/// The PostgreSQL server of the tests (the test command starts one).
enum FollowPostgres {
    static let url = ProcessInfo.processInfo.environment["TIDEMARK_TEST_POSTGRES_URL"]
    static let enabled =
        url != nil || ProcessInfo.processInfo.environment["TIDEMARK_REQUIRE_POSTGRES"] != nil
        || ProcessInfo.processInfo.environment["CI"] != nil
}

/// `serve` following a PostgreSQL source's changes on a real server: an insert, an update that moves
/// a device between selectors and a hard delete each start a reconcile at once (the interval is an
/// hour), a dropped LISTEN connection and a cursor that went backwards fall back to a full read and say so.
@Suite(.enabled(if: FollowPostgres.enabled)) struct ChangeFollowingTests {
    static var url: String? { FollowPostgres.url }

    /// Runs SQL with psql, as a team would; returns what it printed.
    @discardableResult
    static func psql(_ sql: String) throws -> String {
        let url = try #require(Self.url, "no PostgreSQL server for the tests: run them with scripts/test.sh")
        let candidates =
            ["/usr/bin/psql"]
            + ((try? FileManager.default.contentsOfDirectory(atPath: "/usr/lib/postgresql")) ?? []).sorted().reversed()
            .map { "/usr/lib/postgresql/\($0)/bin/psql" }
        let psql = try #require(candidates.first { FileManager.default.isExecutableFile(atPath: $0) })
        let process = Process()
        process.executableURL = URL(fileURLWithPath: psql)
        process.arguments = [url, "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1"]
        let input = Pipe()
        let output = Pipe()
        process.standardInput = input
        process.standardOutput = output
        try process.run()
        input.fileHandleForWriting.write(Data(sql.utf8))
        try input.fileHandleForWriting.close()
        let printed = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        #expect(process.terminationStatus == 0, "psql failed on: \(sql)")
        return printed
    }

    static func insert(_ ids: [Int], platform: String, into table: String) -> String {
        let rows = ids.map { "('d\($0)', '\(Fixtures.token($0))', '\(platform)')" }.joined(separator: ", ")
        return "INSERT INTO \(table) (device_id, token, platform) VALUES \(rows);"
    }

    @Test func insertsUpdatesAndHardDeletesReachFCMInSecondsAndLostChangesAreReadInFull() async throws {
        let table = "serve_tokens_\(UUID().uuidString.prefix(8).lowercased())"
        let channel = "ch_\(table)"
        try Self.psql(
            """
            CREATE TABLE \(table) (device_id text primary key, token text not null, platform text not null,
              active boolean not null default true, updated_at timestamptz not null default clock_timestamp());
            CREATE FUNCTION \(table)_touch() RETURNS trigger LANGUAGE plpgsql AS $$
              BEGIN NEW.updated_at := clock_timestamp(); RETURN NEW; END $$;
            CREATE TRIGGER \(table)_touch BEFORE UPDATE ON \(table) FOR EACH ROW
              WHEN (OLD.updated_at = NEW.updated_at) EXECUTE FUNCTION \(table)_touch();
            \(Self.insert([0, 1], platform: "ios", into: table))
            """)
        let root = FileManager.default.temporaryDirectory.appendingPathComponent("tm-follow-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: root) }
        try FileManager.default.createDirectory(
            at: root.appendingPathComponent("manifests"), withIntermediateDirectories: true)
        try """
        project: tidemark-follow-test
        refresh: none
        inventory:
          - name: app-db
            postgres:
              url_env: APP_DATABASE_URL
              query: select device_id, token, platform from \(table) where active
              changes: {query: 'select device_id, updated_at from \(table)', cursor: updated_at}
              listen: \(channel)
            allow_empty: true
        """.write(to: root.appendingPathComponent("tidemark.yaml"), atomically: true, encoding: .utf8)
        try """
        topics:
          - name: ios-users
            members:
              - selector: {platform: ios}
        """.write(to: root.appendingPathComponent("manifests/topics.yaml"), atomically: true, encoding: .utf8)
        var given = RuntimeFlags()
        given.directory = root.path
        let flags = given
        let environment = ["APP_DATABASE_URL": try #require(Self.url)]
        let runtime = try Runtime.load(flags, environment: environment)
        try Self.psql(
            try runtime.changeTriggers(source: "app-db", table: table, idColumn: "device_id"))

        // The line serve starts with names the source, its cursor and its channel, in words.
        let following = Serve.followingLine(workspace: "default", FollowedSource.of(runtime))
        #expect(
            following.contains(
                "follows the changes of inventory source 'app-db' (rows past its cursor 'updated_at' every 1s, LISTEN '\(channel)')"
            ), "\(following)")
        #expect(!following.contains("GRDB"), "\(following)")

        let lines = Mutex<[String]>([])
        var settings = ServeSettings()
        // The whole reconcile (the resync) every 4 s; the changes in between are planned on their own.
        settings.interval = .seconds(4)
        let metrics = ServeMetrics()
        metrics.declare(workspace: "default", settings: settings, quota: 3000)
        var reconciler = Reconciler(
            runtime: try Runtime.load(flags, environment: environment), settings: settings,
            log: ServeLog(lines: { line in lines.withLock { $0.append(line) } }))
        reconciler.followsChanges = true
        let runner = WorkspaceRunner(
            status: Serve.initialStatus(runtime, settings: settings),
            reconciler: reconciler,
            ownership: .init(
                records: InMemoryStateStore(workspace: "default"), replica: "r1", poll: .milliseconds(100)),
            metrics: metrics, followed: FollowedSource.of(runtime),
            log: ServeLog(lines: { line in lines.withLock { $0.append(line) } }))
        let running = Task { try await runner.run() }
        defer { running.cancel() }

        func members() async throws -> Set<Int> {
            let tokens = (0..<6).map { Fixtures.token($0) }
            let statuses = try await runtime.withBackend(output: SilentOutput()) { try await $0.refresh(tokens) }
            return Set(
                statuses.enumerated().compactMap { index, status in
                    if case .active(let topics) = status, topics.contains("ios-users") { return index }
                    return nil
                })
        }
        func waitFor(_ expected: Set<Int>, _ what: String) async throws -> Double {
            let start = ContinuousClock.now
            while ContinuousClock.now - start < .seconds(30) {
                if try await members() == expected { return Timing.seconds(ContinuousClock.now - start) }
                try await Task.sleep(for: .milliseconds(50))
            }
            Issue.record("\(what): ios-users holds \(try await members().sorted()), not \(expected.sorted())")
            return 30
        }
        func logged(_ text: String) async throws {
            let start = ContinuousClock.now
            while ContinuousClock.now - start < .seconds(30) {
                if lines.withLock({ $0.contains { $0.contains(text) } }) { return }
                try await Task.sleep(for: .milliseconds(50))
            }
            Issue.record("never logged '\(text)': \(lines.withLock { $0 })")
        }

        _ = try await waitFor([0, 1], "the first reconcile")
        try await Task.sleep(for: .milliseconds(500))  // the follower's cursor and LISTEN are in place

        try Self.psql(Self.insert([2], platform: "ios", into: table))
        #expect(try await waitFor([0, 1, 2], "an insert") < 10)
        try Self.psql("UPDATE \(table) SET platform = 'android' WHERE device_id = 'd1';")
        #expect(try await waitFor([0, 2], "an update moving d1 out of the selector") < 10)
        try Self.psql("DELETE FROM \(table) WHERE device_id = 'd0';")
        #expect(try await waitFor([2], "a hard delete") < 10)
        try await logged("reconcile started by the inventory")
        // Batches of changed devices were planned on their own (how many a batch takes depends on how
        // the changes fell between reconciles: a whole one that was running takes those that came).
        try await logged("planned on their own")
        try await logged("resync matched the batches")

        // The LISTEN connection dropped: said, made again, and the source read in full.
        try Self.psql(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query ILIKE 'LISTEN%\(channel)%';")
        try await logged("the LISTEN '\(channel)' connection was lost")
        try await logged("LISTEN '\(channel)' again; reading it in full")
        // The cursor moved backwards: said, and read in full from the new end.
        try Self.psql("ALTER TABLE \(table) DISABLE TRIGGER USER; UPDATE \(table) SET updated_at = '2001-01-01';")
        try await logged("its cursor 'updated_at' went backwards")
        try Self.psql(
            "ALTER TABLE \(table) ENABLE TRIGGER USER; \(Self.insert([3], platform: "ios", into: table))")
        #expect(try await waitFor([2, 3], "an insert after the cursor went back") < 10)
        // The full read the backwards cursor asked for has run and ended: a change made before it would
        // be read by it, not found by a resync (under a loaded suite it started after the insert's batch).
        let readStart = ContinuousClock.now
        while ContinuousClock.now - readStart < .seconds(30) {
            let done = lines.withLock { lines -> Bool in
                guard let asked = lines.lastIndex(where: { $0.contains("read in full: its cursor") }) else {
                    return false
                }
                return lines[(asked + 1)...].contains { $0.contains("result=") }
            }
            if done { break }
            try await Task.sleep(for: .milliseconds(50))
        }
        #expect(
            !String(decoding: metrics.exposition(), as: UTF8.self).contains(
                #"tidemark_change_batches_total{workspace="default"} 0"#), "batches were planned")
        #expect(
            String(decoding: metrics.exposition(), as: UTF8.self).contains(
                #"tidemark_resync_divergences_total{workspace="default"} 0"#), "no divergence so far")

        // Try to make it lie: a change nobody announces (triggers off, the cursor column untouched) is
        // found by the next resync, said with the device, counted, and corrected.
        try Self.psql(
            "ALTER TABLE \(table) DISABLE TRIGGER USER; UPDATE \(table) SET platform = 'ios' WHERE device_id = 'd1'; ALTER TABLE \(table) ENABLE TRIGGER USER;"
        )
        #expect(try await waitFor([1, 2, 3], "a silent change, found by the resync") < 15)
        try await logged("(d1) had memberships the batches of changed devices had not brought")
        // The reconcile logs the divergence as it finds it and counts it when it ends: wait for that.
        var exposition = String(decoding: metrics.exposition(), as: UTF8.self)
        let countedStart = ContinuousClock.now
        while !exposition.contains(#"tidemark_resync_divergences_total{workspace="default"} 1"#),
            ContinuousClock.now - countedStart < .seconds(15)
        {
            try await Task.sleep(for: .milliseconds(50))
            exposition = String(decoding: metrics.exposition(), as: UTF8.self)
        }
        #expect(exposition.contains(#"tidemark_resync_divergences_total{workspace="default"} 1"#), "\(exposition)")
        #expect(exposition.contains(#"tidemark_inventory_full_reads_total{workspace="default",source="app-db"}"#))
        #expect(exposition.contains(#"tidemark_inventory_changes_waiting{workspace="default"} 0"#))
        #expect(runner.status.inventoryChangesWaiting == 0 && runner.status.settings["follows_changes"] == "app-db")

        // A rotated token and a soft delete (a row the source's query no longer selects) are planned
        // on their own too, as a full plan would: the old token leaves, the new one joins; the
        // inactive device leaves. The next resync finds nothing the batches missed.
        func count(_ text: String) -> Int { lines.withLock { $0.filter { $0.contains(text) }.count } }
        func nextResync(after seen: Int) async throws {
            let start = ContinuousClock.now
            while count("result=success") > 0, count("resync matched the batches") <= seen,
                ContinuousClock.now - start < .seconds(30)
            {
                try await Task.sleep(for: .milliseconds(50))
            }
            #expect(count("resync matched the batches") > seen, "\(lines.withLock { $0 })")
        }
        // Right after a resync, so that both changes come before the next one (4 s) reads everything.
        try await nextResync(after: count("resync matched the batches"))
        let resyncsBefore = count("resync matched the batches")
        try Self.psql("UPDATE \(table) SET token = '\(Fixtures.token(4))' WHERE device_id = 'd2';")
        #expect(try await waitFor([1, 3, 4], "a rotated token") < 10)
        try Self.psql("UPDATE \(table) SET active = false WHERE device_id = 'd3';")
        #expect(try await waitFor([1, 4], "a soft delete") < 10)
        try await logged("1 changed device planned on their own; applied 1 subscription, 1 unsubscription")
        try await logged("1 changed device planned on their own; applied 0 subscriptions, 1 unsubscription")
        try await nextResync(after: resyncsBefore)

        // A steady stream of changes (one every 5 ms for about 10 s, each its own commit) always has a
        // batch waiting; the resync (every 4 s) still comes when it is due, and matches.
        let stormResyncs = count("resync matched the batches")
        let stormStart = ContinuousClock.now
        try Self.psql(
            "DO $$ BEGIN FOR i IN 1..2000 LOOP UPDATE \(table) SET platform = platform WHERE device_id = 'd1'; COMMIT; PERFORM pg_sleep(0.005); END LOOP; END $$;"
        )
        let stormSeconds = Timing.seconds(ContinuousClock.now - stormStart)
        #expect(
            count("resync matched the batches") >= stormResyncs + 1,
            "no resync in \(stormSeconds) s of changes: \(lines.withLock { $0.suffix(30) })")
        #expect(
            String(decoding: metrics.exposition(), as: UTF8.self).contains(
                #"tidemark_resync_divergences_total{workspace="default"} 1"#), "only the silent change diverged")
        running.cancel()
        _ = try? await running.value
    }
}

/// How a change wakes the runner, without a database: at once after a success, not before the retry
/// after a failure.
@Suite struct ChangeWakeTests {
    @Test func aChangeStartsAReconcileAtOnceButWaitsForTheRetryAfterAFailure() async throws {
        let project = try ServeProject()
        defer { project.remove() }
        try project.writeDevices([0, 1])
        let flags = project.flags
        let reconciles = Mutex<[String]>([])
        var settings = ServeSettings()
        settings.interval = .seconds(3600)
        settings.retryInterval = .seconds(3600)
        let runner = WorkspaceRunner(
            status: Serve.initialStatus(try project.runtime(), settings: settings),
            reconciler: Reconciler(runtime: try Runtime.load(flags, environment: [:]), settings: settings),
            ownership: .init(records: InMemoryStateStore(workspace: "default"), replica: "r1", poll: .milliseconds(50)),
            metrics: ServeMetrics(), log: ServeLog(lines: { line in reconciles.withLock { $0.append(line) } }))
        let running = Task { try await runner.run() }
        defer { running.cancel() }
        func count() -> Int { reconciles.withLock { $0.count { $0.hasPrefix("reconcile workspace=") } } }
        func settle(_ expected: Int) async throws {
            let start = ContinuousClock.now
            while count() < expected, ContinuousClock.now - start < .seconds(30) {
                try await Task.sleep(for: .milliseconds(20))
            }
        }
        try await settle(1)
        #expect(count() == 1, "the first reconcile")
        try project.writeDevices([0, 1, 2])
        runner.wake(.devices(source: "app-db", ids: ["d2"]))
        try await settle(2)
        #expect(count() == 2 && runner.status.last?.subscribed == 1, "a change starts one at once")
        #expect(
            reconciles.withLock {
                $0.contains { $0.contains("reconcile started by the inventory: 1 device change in 'app-db'") }
            })

        // A manifest that does not parse: the next reconcile fails.
        try "topics: [".write(
            to: project.root.appendingPathComponent("manifests/topics.yaml"), atomically: true, encoding: .utf8)
        runner.wake(.fullRead(source: "app-db", why: "its table was truncated"))
        try await settle(3)
        #expect(count() == 3 && runner.status.last?.outcome == .failure)
        runner.wake(.devices(source: "app-db", ids: ["d3", "d4", "d5", "d6", "d7"]))
        try await Task.sleep(for: .milliseconds(800))
        #expect(count() == 3, "the retry wait (an hour) holds: no reconcile per change while failing")
        #expect(runner.status.inventoryChangesWaiting == 5, "the changes wait for the retry, counted")
        running.cancel()
        _ = try? await running.value
    }
}

/// What a reconcile takes of the changes that woke it.
@Suite struct PendingChangesTests {
    @Test func aDeviceChangedTwiceIsOneChangeAndABurstIsTakenInBatches() {
        var pending = PendingChanges()
        pending.add(.devices(source: "app-db", ids: ["d1", "d2", "d3"]))
        pending.add(.devices(source: "app-db", ids: ["d3", "d4", "d5"]))
        #expect(pending.deviceCount == 5, "d3 changed twice before a reconcile took it: one change")

        let first = pending.take(upTo: 3)
        #expect(first.batch?.source == "app-db" && first.batch?.ids == ["d1", "d2", "d3"])
        #expect(pending.deviceCount == 2, "the rest wait for the next batch")
        let second = pending.take(upTo: 3)
        #expect(second.batch?.ids == ["d4", "d5"] && pending.isEmpty)

        // Anything but one source's devices is taken whole (the whole reconcile reads it all).
        pending.add(.devices(source: "app-db", ids: ["d1", "d2", "d3", "d4"]))
        pending.add(.fullRead(source: "app-db", why: "its LISTEN connection was lost"))
        let whole = pending.take(upTo: 2)
        #expect(whole.deviceCount == 4 && whole.fullReads.count == 1 && pending.isEmpty)
        pending.add(.devices(source: "app-db", ids: ["d1", "d2", "d3"]))
        pending.add(.devices(source: "other-db", ids: ["e1"]))
        #expect(pending.take(upTo: 2).deviceCount == 4 && pending.isEmpty, "two sources: no batch")
        pending.add(.devices(source: "app-db", ids: ["d1", "d2", "d3"]))
        #expect(pending.take(upTo: 0).deviceCount == 3 && pending.isEmpty, "no limit: everything")
    }
}
