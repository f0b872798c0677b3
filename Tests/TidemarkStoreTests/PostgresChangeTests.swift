import Foundation
import PostgresNIO
import Synchronization
import Testing
import TidemarkCore
import TidemarkTesting

@testable import TidemarkStore

/// Following a PostgreSQL source's changes: the rows changed since a cursor, read back through the
/// source's own query, and the triggers `tidemark inventory triggers` prints, installed with psql.
@Suite(.enabled(if: TestPostgres.enabled)) struct PostgresChangeTests {
    static func table(_ prefix: String) -> String { "\(prefix)_\(UUID().uuidString.prefix(8).lowercased())" }

    /// The devices of `ids` as the source's query returns them now: id → platform.
    static func read(_ source: PostgresInventorySource, _ ids: [String]) async throws -> [String: String] {
        var builder = InventoryBuilder()
        _ = try await source.load(devices: ids, into: &builder)
        #expect(builder.diagnostics.isEmpty, "\(builder.diagnostics)")
        let inventory = builder.inventory
        var devices: [String: String] = [:]
        for index in 0..<inventory.count {
            devices[inventory.deviceIDs[index]] = inventory.label("platform", ofDevice: index) ?? ""
        }
        return devices
    }

    @Test func insertsUpdatesAndSoftDeletesAreFollowedByATimestampCursor() async throws {
        let table = Self.table("tokens")
        try await TestPostgres.execute([
            "CREATE TABLE \(table) (device_id text primary key, token text, platform text, active boolean default true, updated_at timestamptz not null default clock_timestamp())",
            "INSERT INTO \(table) (device_id, token, platform) VALUES ('d1', '\(Fixtures.token(1))', 'ios'), ('d2', '\(Fixtures.token(2))', 'ios'), ('d3', '\(Fixtures.token(3))', 'android')",
        ])
        let source = PostgresInventorySource(
            name: "app-db", url: TestPostgres.url,
            query: "select device_id, token, platform from \(table) where active order by device_id;")
        let changes = PostgresSourceSettings.Changes(
            query: "select device_id, active, updated_at from \(table)", cursor: "updated_at")
        let start = try #require(try await source.currentCursor(changes))
        let none = try await source.changedDevices(changes, after: start, limit: 100)
        #expect(none.ids.isEmpty && none.cursor == start)

        try await TestPostgres.execute([
            "INSERT INTO \(table) (device_id, token, platform) VALUES ('d4', '\(Fixtures.token(4))', 'android')",
            "UPDATE \(table) SET platform = 'android', updated_at = clock_timestamp() WHERE device_id = 'd1'",
            "UPDATE \(table) SET active = false, updated_at = clock_timestamp() WHERE device_id = 'd2'",
        ])
        let changed = try await source.changedDevices(changes, after: start, limit: 100)
        #expect(changed.ids == ["d4", "d1", "d2"], "in the cursor's order, the inactive row included")
        let devices = try await Self.read(source, changed.ids)
        #expect(devices == ["d4": "android", "d1": "android"], "d2 left: the source's query no longer returns it")
        let after = try await source.changedDevices(changes, after: changed.cursor, limit: 100)
        #expect(after.ids.isEmpty && after.cursor == changed.cursor, "nothing is read twice")

        // In batches: the cursor after the second change starts the next batch.
        let first = try await source.changedDevices(changes, after: start, limit: 2)
        #expect(first.ids == ["d4", "d1"])
        let second = try await source.changedDevices(changes, after: first.cursor, limit: 2)
        #expect(second.ids == ["d2"] && second.cursor == changed.cursor)
        #expect(try await Self.read(source, []).isEmpty)
    }

    /// A sequence as the cursor (the value bound untyped, compared as a bigint), and a query that names
    /// its device column `id`.
    @Test func aSequenceCursorAndAnIdColumn() async throws {
        let table = Self.table("devices")
        try await TestPostgres.execute([
            "CREATE SEQUENCE \(table)_version",
            "CREATE TABLE \(table) (id text primary key, token text, platform text, version bigint not null default nextval('\(table)_version'))",
            "INSERT INTO \(table) (id, token, platform) VALUES \((1...12).map { "('d\($0)', '\(Fixtures.token($0))', 'ios')" }.joined(separator: ", "))",
        ])
        let source = PostgresInventorySource(
            name: "app-db", url: TestPostgres.url, query: "select id, token, platform from \(table)")
        let changes = PostgresSourceSettings.Changes(query: "select id, version from \(table)", cursor: "version")
        let start = try await source.currentCursor(changes)
        #expect(start == "12")
        try await TestPostgres.execute([
            "UPDATE \(table) SET platform = 'web', version = nextval('\(table)_version') WHERE id IN ('d9', 'd10')",
            "DELETE FROM \(table) WHERE id = 'd3'",
        ])
        let changed = try await source.changedDevices(changes, after: start, limit: 100)
        #expect(
            Set(changed.ids) == ["d9", "d10"] && changed.cursor == "14", "a hard delete leaves no row: LISTEN sees it")
        #expect(try await Self.read(source, changed.ids + ["d3"]) == ["d9": "web", "d10": "web"])
        let all = try await source.changedDevices(changes, after: nil, limit: 1000)
        #expect(all.ids.count == 11 && all.cursor == "14", "from the start: every row")
    }

    @Test func aBrokenChangesQueryFailsNamingTheSetting() async throws {
        let table = Self.table("tokens")
        try await TestPostgres.execute(["CREATE TABLE \(table) (device_id text, token text, updated_at timestamptz)"])
        try await TestPostgres.execute(["INSERT INTO \(table) VALUES ('d1', 't', NULL)"])
        let source = PostgresInventorySource(
            name: "app-db", url: TestPostgres.url, query: "select device_id, token from \(table)")
        await #expect(throws: InventorySourceError.self) {
            _ = try await source.changedDevices(
                .init(query: "select token, updated_at from \(table)", cursor: "updated_at"), after: nil, limit: 10)
        }
        do {
            _ = try await source.changedDevices(
                .init(query: "select device_id, updated_at from \(table)", cursor: "updated_at"), after: nil, limit: 10)
            Issue.record("a null cursor was accepted")
        } catch {
            #expect("\(error)".contains("cursor column 'updated_at' is null"), "\(error)")
        }
        do {
            _ = try await source.changedDevices(
                .init(query: "select device_id, changed from \(table)", cursor: "changed"), after: nil, limit: 10)
            Issue.record("a missing column was accepted")
        } catch {
            #expect("\(error)".contains("the changes query failed on postgres://"), "\(error)")
        }
    }

    /// psql, as a team installs the script.
    static var psql: String? {
        let candidates =
            ["/usr/bin/psql"]
            + ((try? FileManager.default.contentsOfDirectory(atPath: "/usr/lib/postgresql")) ?? []).sorted().reversed()
            .map { "/usr/lib/postgresql/\($0)/bin/psql" }
        return candidates.first { FileManager.default.isExecutableFile(atPath: $0) }
    }

    @Test func theTriggersNotifyInsertsUpdatesHardDeletesAndTruncates() async throws {
        let table = Self.table("tokens")
        let channel = "tidemark_\(table)"
        try await TestPostgres.execute([
            "CREATE TABLE \(table) (device_id text primary key, token text, platform text)",
            "INSERT INTO \(table) VALUES ('d1', 't1', 'ios'), ('d2', 't2', 'ios'), ('d3', 't3', 'ios')",
        ])
        let script = try PostgresChangeTriggers.sql(
            source: "app-db", channel: channel, table: "public.\(table)", idColumn: "device_id")
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("\(table).sql")
        try script.write(to: file, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(at: file) }
        let url = try #require(TestPostgres.url)
        let psql = try #require(Self.psql, "psql is installed with the PostgreSQL server")
        for _ in 0..<2 {  // installed twice: the second run replaces the first
            let process = Process()
            process.executableURL = URL(fileURLWithPath: psql)
            // The server's URL as the test command gave it (psql knows no 'timeout' parameter).
            let plain = try #require(ProcessInfo.processInfo.environment["TIDEMARK_TEST_POSTGRES_URL"])
            process.arguments = [plain, "-q", "-v", "ON_ERROR_STOP=1", "-f", file.path]
            try process.run()
            process.waitUntilExit()
            #expect(process.terminationStatus == 0)
        }

        let connection = try await PostgresConnection.connect(
            configuration: try PostgresURL(url).configuration(), id: 11, logger: PostgresInventorySource.logger)
        let payloads = Payloads()
        let (ready, readySignal) = AsyncStream<Void>.makeStream()
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                try await connection.listen(on: channel) { notifications in
                    readySignal.yield()
                    for try await notification in notifications {
                        let count = payloads.add(notification.payload)
                        if count == 6 { return }
                    }
                }
            }
            for await _ in ready { break }
            try await TestPostgres.execute([
                "INSERT INTO \(table) VALUES ('d4', 't4', 'android')",
                "UPDATE \(table) SET platform = 'android' WHERE device_id = 'd1'",
                "UPDATE \(table) SET device_id = 'd2x' WHERE device_id = 'd2'",
                "DELETE FROM \(table) WHERE device_id = 'd3'",
                "TRUNCATE \(table)",
            ])
            try await group.next()
            group.cancelAll()
        }
        try await connection.close()
        #expect(payloads.all == ["d4", "d1", "d2x", "d2", "d3", ""])
    }

    @Test func theTriggerScriptRefusesNamesItCannotWrite() throws {
        #expect(throws: PostgresChangeTriggers.Problem.self) {
            try PostgresChangeTriggers.sql(source: "a", channel: "ok", table: "t; drop table x", idColumn: "id")
        }
        #expect(throws: PostgresChangeTriggers.Problem.self) {
            try PostgresChangeTriggers.sql(source: "a", channel: "ok", table: "a.b.c", idColumn: "id")
        }
        #expect(throws: PostgresChangeTriggers.Problem.self) {
            try PostgresChangeTriggers.sql(source: "a", channel: "Bad-Channel", table: "t", idColumn: "id")
        }
        #expect(throws: PostgresChangeTriggers.Problem.self) {
            try PostgresChangeTriggers.sql(source: "a", channel: "ok", table: "t", idColumn: "device id")
        }
    }
}

/// The payloads a listener received, in order.
final class Payloads: Sendable {
    private let received = Mutex<[String]>([])

    /// Adds one; returns how many there are now.
    func add(_ payload: String) -> Int {
        received.withLock {
            $0.append(payload)
            return $0.count
        }
    }

    var all: [String] { received.withLock { $0 } }
}
