import Foundation
import PostgresNIO
import Testing
import TidemarkCore
import TidemarkTesting

@testable import TidemarkStore

extension TestPostgres {
    /// Runs statements on the test server (set-up of app tables).
    static func execute(_ statements: [String]) async throws {
        guard let url else { throw InventorySourceError("no PostgreSQL server for the tests") }
        let connection = try await PostgresConnection.connect(
            configuration: try PostgresURL(url).configuration(), id: 9, logger: PostgresInventorySource.logger)
        do {
            for sql in statements {
                try await connection.query(PostgresQuery(unsafeSQL: sql), logger: PostgresInventorySource.logger)
                    .collect()
            }
            try await connection.close()
        } catch {
            try? await connection.close()
            throw error
        }
    }

    static func literal(_ value: String?) -> String {
        value.map { "'" + $0.replacingOccurrences(of: "'", with: "''") + "'" } ?? "NULL"
    }

    /// A fresh table of the devices, and a source reading it.
    static func table(_ devices: [FixtureDevice]) async throws -> (String, PostgresInventorySource) {
        let table = "inv_\(UUID().uuidString.prefix(8).lowercased())"
        var statements = ["CREATE TABLE \(table) (n int, device_id text, token text, platform text, region text)"]
        for (start, chunk) in stride(from: 0, to: devices.count, by: 200).map({
            ($0, devices[$0..<min($0 + 200, devices.count)])
        }) {
            let rows = chunk.enumerated().map { offset, device in
                "(\(start + offset), \(literal(device.id)), \(literal(device.token)), \(literal(device.labels["platform"])), \(literal(device.labels["region"])))"
            }
            statements.append("INSERT INTO \(table) VALUES \(rows.joined(separator: ","))")
        }
        try await execute(statements)
        var source = PostgresInventorySource(
            name: "app-db", url: url, query: "select device_id, token, platform, region from \(table) order by n;")
        source.pageSize = 7  // many pages even for small tables
        source.allowEmpty = true  // the suite's empty source is meant to be empty
        return (table, source)
    }
}

@Suite(.enabled(if: TestPostgres.enabled)) struct PostgresInventorySourceTests {
    @Test(arguments: InventorySourceConformance.Check.allCases)
    func conforms(_ check: InventorySourceConformance.Check) async throws {
        try await InventorySourceConformance.run(check) { devices in try await TestPostgres.table(devices).1 }
    }

    /// A realistic token table: users, platforms, app versions, inactive rows, a last_seen time, a null token.
    @Test func readsARealisticTokenTable() async throws {
        let table = "fcm_tokens_\(UUID().uuidString.prefix(8).lowercased())"
        var rows: [String] = []
        for i in 0..<300 {
            let seen = i % 10 == 0 ? "now() - interval '400 days'" : "now() - interval '\(i % 30) days'"
            rows.append(
                "(\(i), 'u\(i / 3)', \(TestPostgres.literal(Fixtures.token(i, prefix: "pg"))), '\(i % 2 == 0 ? "ios" : "android")', '4.\(i % 4)', \(i % 7 != 6), \(seen))"
            )
        }
        try await TestPostgres.execute([
            "CREATE TABLE \(table) (id bigint primary key, user_id text, token text, platform text, app_version text, active boolean, last_seen timestamptz)",
            "INSERT INTO \(table) VALUES \(rows.joined(separator: ","))",
            "INSERT INTO \(table) VALUES (1000, 'u-null', NULL, 'ios', '4.0', true, now())",
        ])
        let exclusion = ExclusionFilter(
            ExclusionRule(maxAge: 270 * 86_400, text: "270d"), now: Int64(Date().timeIntervalSince1970))
        let source = PostgresInventorySource(
            name: "app-db", url: TestPostgres.url,
            query:
                "select 'd' || id as device_id, token, user_id, platform, app_version, last_seen from \(table) where active order by id",
            labels: ["platform", "user_id"], exclusion: exclusion)
        var builder = InventoryBuilder()
        let snapshot = try await source.load(into: &builder)
        let inventory = builder.inventory
        // 300 rows, 42 inactive (i % 7 == 6), 30 seen 400 days ago (of which 4 are also inactive), one null token.
        let active = (0..<300).filter { $0 % 7 != 6 }
        let kept = active.filter { $0 % 10 != 0 }
        #expect(inventory.count == kept.count)
        #expect(snapshot.rows == kept.count && snapshot.excluded == active.count - kept.count)
        #expect(inventory.labelKeys.sorted() == ["platform", "user_id"], "labels: only the list; last_seen is not one")
        let first = try #require(inventory.index(ofDevice: "d1"))
        #expect(inventory.label("user_id", ofDevice: first) == "u0")
        #expect(inventory.label("platform", ofDevice: first) == "android")
        let messages = builder.diagnostics.map(\.description)
        #expect(messages.count == 1, "\(messages)")
        #expect(messages.first?.contains("inventory source 'app-db' row") == true)
        #expect(messages.first?.contains("token of device 'd1000' is null") == true, "\(messages)")
    }

    @Test func failuresAreOneLineNamingTheSource() async throws {
        let (table, good) = try await TestPostgres.table(InventorySourceConformance.devices(0..<3))
        func failure(_ source: PostgresInventorySource) async -> String {
            var builder = InventoryBuilder()
            do {
                _ = try await source.load(into: &builder)
                return "no error"
            } catch {
                return "\(error)"
            }
        }
        var source = good
        source.query = "select device_id, tokn from \(table)"
        #expect(await failure(source).contains("column \"tokn\" does not exist"))
        source.query = "select device_id as id_, token from \(table)"
        let missing = await failure(source)
        #expect(missing.contains("no 'device_id' column") && missing.contains("returns id_, token"), "\(missing)")
        source.query = "select device_id, token from \(table)"
        source.labels = ["platform"]
        #expect(await failure(source).contains("'labels' names the column 'platform', which the query does not return"))
        // A statement that writes is refused by the read-only transaction (and DECLARE takes one statement).
        source.query = "delete from \(table) returning device_id, token"
        let write = await failure(source)
        #expect(write.contains("PostgreSQL said"), "\(write)")
        source.query = "select device_id, token from \(table); drop table \(table)"
        #expect(await failure(source).contains("PostgreSQL said"))
        var builder = InventoryBuilder()
        _ = try await good.load(into: &builder)
        #expect(builder.inventory.count == 3, "the table is still there")
        // A bytea label is bytes, not text: refused naming the column and the conversion, never read
        // as whatever its bytes spell.
        let bytesTable = "tm_bytea_\(UUID().uuidString.prefix(8).lowercased())"
        try await TestPostgres.execute([
            "CREATE TABLE \(bytesTable) (device_id text, token text, platform bytea)",
            "INSERT INTO \(bytesTable) VALUES ('d1', '\(Fixtures.token(1))', 'ios'::bytea)",
        ])
        let bytea = PostgresInventorySource(
            name: "app-db", url: TestPostgres.url, query: "select device_id, token, platform from \(bytesTable)")
        var byteaBuilder = InventoryBuilder()
        _ = try? await bytea.load(into: &byteaBuilder)
        let byteaMessages = byteaBuilder.diagnostics.map(\.description).joined(separator: "\n")
        #expect(
            byteaMessages.contains("'platform' is bytea") && byteaMessages.contains("convert_from"), "\(byteaMessages)")
        #expect(byteaBuilder.inventory.count == 0)
        try await TestPostgres.execute(["DROP TABLE \(bytesTable)"])

        // No URL in the environment, a bad URL, an unreachable server: the password never appears.
        source.labels = nil
        source.query = "select device_id, token from \(table) where false"
        source.allowEmpty = false
        #expect(await failure(source).contains("the query returned no rows"))
        let unset = PostgresInventorySource(name: "x", url: nil, urlEnv: "APP_DATABASE_URL", query: "select 1")
        #expect(await failure(unset).contains("APP_DATABASE_URL is not set"))
        let unreachable = PostgresInventorySource(
            name: "x", url: "postgres://app:s3cret@127.0.0.1:1/app?sslmode=disable", urlEnv: "APP_DATABASE_URL",
            query: "select 1")
        let refused = await failure(unreachable)
        #expect(
            refused.contains("cannot connect to postgres://app@127.0.0.1:1/app") && !refused.contains("s3cret"),
            "\(refused)")
    }
}

/// A command that prints devices: the same suite, and one clear line when it fails.
@Suite struct CommandInventorySourceTests {
    static func source(
        _ text: String, format: InventoryFormat = .jsonl, timeout: Double = 30
    ) throws
        -> CommandInventorySource
    {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("tm-exec-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        try Data(text.utf8).write(to: directory.appendingPathComponent("devices.out"))
        var source = CommandInventorySource(
            name: "devices",
            runner: ProcessRunner(command: ["cat", "devices.out"], directory: directory.path, timeout: timeout),
            format: format)
        source.allowEmpty = true  // the suite's empty source is meant to be empty
        return source
    }

    @Test(arguments: InventorySourceConformance.Check.allCases)
    func conforms(_ check: InventorySourceConformance.Check) async throws {
        try await InventorySourceConformance.run(check) { devices in
            let lines = devices.map { device in
                var object: [String: Any] = ["id": device.id, "token": device.token]
                if !device.labels.isEmpty { object["labels"] = device.labels }
                return String(
                    decoding: try! JSONSerialization.data(withJSONObject: object, options: .sortedKeys), as: UTF8.self)
            }
            return try Self.source(lines.map { $0 + "\n" }.joined())
        }
    }

    static func failure(_ source: CommandInventorySource) async -> (String, [String]) {
        var builder = InventoryBuilder()
        do {
            _ = try await source.load(into: &builder)
            return ("", builder.diagnostics.map(\.description))
        } catch {
            return ("\(error)", builder.diagnostics.map(\.description))
        }
    }

    @Test func failsTimesOutOrPrintsABadRowInOneLine() async throws {
        let failing = CommandInventorySource(
            name: "firestore",
            runner: ProcessRunner(
                command: ["sh", "-c", "echo 'PERMISSION_DENIED: Missing or insufficient permissions.' >&2; exit 7"],
                timeout: 30), format: .jsonl)
        let (failed, _) = await Self.failure(failing)
        #expect(failed.contains("exited with status 7") && failed.contains("PERMISSION_DENIED"), "\(failed)")
        let slow = CommandInventorySource(
            name: "slow", runner: ProcessRunner(command: ["sleep", "120"], timeout: 0.5), format: .jsonl)
        let clock = ContinuousClock()
        let started = clock.now
        let (stopped, _) = await Self.failure(slow)
        #expect(stopped.contains("did not finish within 0.5s"), "\(stopped)")
        // Stopped long before it would end (the bound is loose: other tests keep the task pool busy).
        #expect(clock.now - started < .seconds(60), "SIGTERM stops it")
        let missing = CommandInventorySource(
            name: "gone", runner: ProcessRunner(command: ["no-such-program-tidemark"], timeout: 5), format: .jsonl)
        #expect(await Self.failure(missing).0.contains("status 127"))
        let (_, bad) = await Self.failure(
            try Self.source("{\"id\": \"a\", \"token\": \"\(Fixtures.token(1))\"}\nnot json\n"))
        #expect(
            bad.count == 1 && bad[0].hasPrefix("inventory source 'devices' row 2: error: line is not a JSON object"),
            "\(bad)")
        let (_, csv) = await Self.failure(
            try Self.source("device_id,token\na,\(Fixtures.token(1)),extra\n", format: .csv))
        #expect(csv.count == 1 && csv[0].contains("row 1: error: row has 3 fields"), "\(csv)")
    }

    /// A command that prints nothing is refused unless the source allows it: a broken export must not
    /// look like every device leaving.
    @Test func anEmptyOutputIsRefusedUnlessAllowed() async throws {
        var source = try Self.source("")
        source.allowEmpty = false
        let (empty, _) = await Self.failure(source)
        #expect(empty.contains("printed no devices") && empty.contains("allow_empty: true"), "\(empty)")
        var header = try Self.source("device_id,token\n", format: .csv)
        header.allowEmpty = false
        #expect(await Self.failure(header).0.contains("printed no devices"))
    }

    /// stdin reaches the program (the on_dead hook feeds tokens this way).
    @Test func feedsStdin() async throws {
        let result = try await ProcessRunner(command: ["wc", "-l"], timeout: 10).run(stdin: Data("a\nb\nc\n".utf8))
        #expect(result.status == 0)
        #expect(String(decoding: result.stdout, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines) == "3")
    }

    /// A program that exits while a process it started keeps its stdout open (a daemon, a background
    /// job): the exit ends the read within seconds, with everything the program printed, instead of
    /// waiting for the leftover process (or the timeout).
    @Test func aProgramsExitEndsTheReadWhenAGrandchildHoldsThePipe() async throws {
        // The leftover process lives ten minutes; the read ends long before (a starved test process may
        // resume late, so the bound is loose; without the fix it is the leftover's ten minutes).
        let clock = ContinuousClock()
        let started = clock.now
        let result = try await ProcessRunner(
            command: ["sh", "-c", "echo first; (sleep 600; echo late) & echo \"left $!\""], timeout: 1000
        ).run()
        #expect(clock.now - started < .seconds(300))
        #expect(result.status == 0)
        let lines = String(decoding: result.stdout, as: UTF8.self).split(separator: "\n")
        #expect(lines.first == "first" && lines.count == 2 && lines[1].hasPrefix("left "), "\(lines)")
        if let pid = Int32(lines.last?.dropFirst(5) ?? "") { kill(pid, SIGKILL) }
        // Output larger than a pipe's buffer, written before the exit, is all read.
        let big = try await ProcessRunner(
            command: ["sh", "-c", "head -c 3000000 /dev/zero | tr '\\0' 'a'; (sleep 600) & echo $! >&2"],
            timeout: 1000
        ).run()
        #expect(big.stdout.count == 3_000_000)
        if let pid = Int32(big.stderr) { kill(pid, SIGKILL) }
    }
}
