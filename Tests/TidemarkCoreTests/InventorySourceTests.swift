import Foundation
import Testing
import TidemarkCore
import TidemarkTesting

/// Every inventory source through the one conformance suite.
@Suite struct InventorySourceTests {
    static func csv(_ devices: [FixtureDevice]) -> String {
        func quoted(_ value: String) -> String {
            value.contains(",") || value.contains("\"")
                ? "\"" + value.replacingOccurrences(of: "\"", with: "\"\"") + "\"" : value
        }
        return "device_id,token,platform,region\n"
            + devices.map { device in
                [device.id, device.token, device.labels["platform"] ?? "", device.labels["region"] ?? ""].map(quoted)
                    .joined(separator: ",")
            }.joined(separator: "\n") + "\n"
    }

    static func jsonl(_ devices: [FixtureDevice]) throws -> String {
        try devices.map { device in
            var object: [String: Any] = ["id": device.id, "token": device.token]
            if !device.labels.isEmpty { object["labels"] = device.labels }
            return String(
                decoding: try JSONSerialization.data(withJSONObject: object, options: .sortedKeys), as: UTF8.self)
        }.joined(separator: "\n") + "\n"
    }

    @Test(arguments: InventorySourceConformance.Check.allCases)
    func csvFiles(_ check: InventorySourceConformance.Check) async throws {
        try await InventorySourceConformance.run(check) { devices in
            FileInventorySource(
                path: "devices.csv", format: .csv, files: InMemoryFileSource(["devices.csv": Self.csv(devices)]))
        }
    }

    @Test(arguments: InventorySourceConformance.Check.allCases)
    func jsonLinesFiles(_ check: InventorySourceConformance.Check) async throws {
        try await InventorySourceConformance.run(check) { devices in
            FileInventorySource(
                path: "devices.jsonl", format: .jsonl,
                files: InMemoryFileSource(["devices.jsonl": try Self.jsonl(devices)]))
        }
    }

    @Test(arguments: InventorySourceConformance.Check.allCases)
    func inMemoryTwin(_ check: InventorySourceConformance.Check) async throws {
        try await InventorySourceConformance.run(check) { devices in InMemoryInventorySource(devices) }
    }

    /// The format comes from the manifests when the name does not say it; the suffix is only a default.
    @Test func formatFromConfigurationWinsOverTheSuffix() async throws {
        let devices = [FixtureDevice(id: "a", token: Fixtures.token(1), labels: ["region": "north"])]
        var table = TokenTable()
        let loaded = await Fixtures.manifests([
            "inv.yaml":
                "inventory:\n  files:\n    - {path: export.txt, format: csv}\n    - {path: more.data, format: jsonl}\n",
            "export.txt": Self.csv(devices),
            "more.data": try Self.jsonl([FixtureDevice(id: "b", token: Fixtures.token(2))]),
            "topics.yaml": "topics:\n  - name: north\n    members: [{selector: {region: north}}]\n",
        ]).load(into: &table)
        #expect(!loaded.diagnostics.hasErrors, "\(loaded.diagnostics)")
        #expect(loaded.inventory.count == 2)
        let unknown = await Fixtures.manifests([
            "inv.yaml": "inventory:\n  files: [export.txt, {path: x.csv, format: xml}]\n",
            "topics.yaml": "topics: []\n",
        ]).load(into: &table)
        let messages = unknown.diagnostics.map(\.description)
        #expect(
            messages.contains {
                $0.contains(
                    "inv.yaml:2:11: error: inventory file 'export.txt' must end in .csv or .jsonl (optionally .gz), or say its format"
                )
            }, "\(messages)")
        #expect(messages.contains { $0.contains("unknown inventory format 'xml'; use csv or jsonl") }, "\(messages)")
    }

    /// Sources beyond the manifests' own plug into the loader and into the manifests digest.
    @Test func extraSourcesJoinTheInventoryAndTheDigest() async throws {
        let files = InMemoryFileSource(["topics.yaml": "topics:\n  - name: all\n    members: [{devices: [x1]}]\n"])
        var table = TokenTable()
        let one = await ManifestLoader(
            files: files,
            extraSources: [InMemoryInventorySource([FixtureDevice(id: "x1", token: Fixtures.token(1))], name: "db")]
        )
        .load(into: &table)
        #expect(!one.diagnostics.hasErrors, "\(one.diagnostics)")
        #expect(one.desired.topics.first?.members.count == 1)
        let rotated = await ManifestLoader(
            files: files,
            extraSources: [InMemoryInventorySource([FixtureDevice(id: "x1", token: Fixtures.token(9))], name: "db")]
        )
        .load(into: &table)
        #expect(one.digest != rotated.digest, "a saved plan notices that a source's devices changed")
    }

    /// `files:` takes globs: every match is a source of its own, in name order; a glob that matches
    /// nothing is an error at its line, never an empty inventory.
    @Test func globsExpandToTheFilesTheyMatch() async throws {
        func csv(_ range: Range<Int>) -> String {
            "device_id,token\n" + range.map { "d\($0),\(Fixtures.token($0))" }.joined(separator: "\n") + "\n"
        }
        var files: [String: String] = [
            "inv.yaml": "inventory:\n  files: [exports/devices-*.csv, \"exports/extra/[ab].jsonl\"]\n",
            "topics.yaml": "topics:\n  - name: all\n    members: [{devices: [d0, d5, d10]}]\n",
            "exports/devices-1.csv": csv(0..<5),
            "exports/devices-2.csv": csv(5..<10),
            "exports/other.csv": csv(20..<25),
            "exports/extra/a.jsonl": #"{"id": "d10", "token": "\#(Fixtures.token(10))"}"# + "\n",
        ]
        var table = TokenTable()
        let loaded = await ManifestLoader(files: InMemoryFileSource(files)).load(into: &table)
        #expect(!loaded.diagnostics.hasErrors, "\(loaded.diagnostics)")
        #expect(loaded.inventory.count == 11, "devices-1, devices-2 and a.jsonl; not other.csv")
        files["inv.yaml"] = "inventory:\n  files:\n    - exports/missing-*.csv\n"
        let missing = await ManifestLoader(files: InMemoryFileSource(files)).load(into: &table)
        #expect(
            missing.diagnostics.contains {
                $0.location?.file == "inv.yaml" && $0.location?.line == 3 && $0.message.contains("matches no file")
            }, "\(missing.diagnostics)")
    }
}

/// gzip inventories: `.csv.gz` and `.jsonl.gz`, concatenated members, and bounded inflation.
@Suite struct GzipInventoryTests {
    static func files(_ entries: [String: Data]) -> InMemoryFileSource {
        var files = InMemoryFileSource([:])
        files.files = entries
        return files
    }

    @Test(arguments: InventorySourceConformance.Check.allCases)
    func gzipCSV(_ check: InventorySourceConformance.Check) async throws {
        try await InventorySourceConformance.run(check) { devices in
            FileInventorySource(
                path: "devices.csv.gz", format: .csv,
                files: Self.files(["devices.csv.gz": Gzip.compress(Data(InventorySourceTests.csv(devices).utf8))]))
        }
    }

    @Test func formatComesFromTheNameBeforeGz() {
        #expect(InventoryFormat(suffixOf: "a.csv.gz") == .csv)
        #expect(InventoryFormat(suffixOf: "a.jsonl.gz") == .jsonl)
        #expect(InventoryFormat(suffixOf: "a.gz") == nil)
    }

    @Test func concatenatedMembersAreOneFile() throws {
        let text = Data("device_id,token\n".utf8)
        let more = Data("a,\(Fixtures.token(1))\n".utf8)
        let joined = Gzip.compress(text) + Gzip.compress(more)
        #expect(try Gzip.decompress(joined, atMost: 1 << 20) == text + more)
    }

    @Test func refusesTruncatedCorruptAndBombs() async throws {
        let data = Gzip.compress(Data(repeating: UInt8(ascii: "a"), count: 1 << 20))
        #expect(throws: GzipError.self) { try Gzip.decompress(data.prefix(data.count / 2), atMost: 1 << 30) }
        var corrupt = data
        corrupt[20] ^= 0xff
        #expect(throws: GzipError.self) { try Gzip.decompress(corrupt, atMost: 1 << 30) }
        // A small file that inflates past the limit is refused, naming the setting.
        let error = #expect(throws: GzipError.self) {
            try Gzip.decompress(data, atMost: 1000, setting: "inventory_bytes")
        }
        #expect(error?.description.contains("limits.inventory_bytes") == true)
        // Through the loader: one line at the file's place.
        var table = TokenTable()
        let loaded = await ManifestLoader(
            files: Self.files([
                "inv.yaml": Data("inventory:\n  files: [devices.csv.gz]\n".utf8),
                "devices.csv.gz": data.prefix(data.count / 2),
            ])
        ).load(into: &table)
        let messages = loaded.diagnostics.map(\.description)
        #expect(messages.contains { $0.contains("inv.yaml:2:11") && $0.contains("truncated") }, "\(messages)")
    }
}

/// Sources that run SQL or a command are declared in tidemark.yaml, and only there.
@Suite struct ConfiguredSourceTests {
    @Test func decodesPostgresAndExecSources() throws {
        let (settings, diagnostics) = ProjectSettings.decode(
            """
            inventory:
              - name: app-db
                postgres:
                  url_env: APP_DATABASE_URL
                  query: select device_id, token, platform from fcm_tokens where active
                  labels: [platform]
                on_dead: "update fcm_tokens set active = false where token = $1"
                exclude_if: {last_seen_older_than: 270d}
              - exec:
                  command: [python3, examples/firestore/run_query.py]
                  format: jsonl
                  timeout: 2m
                  interval: 30s
                on_dead: {exec: [python3, examples/firestore/mark_dead.py]}
            """, file: "tidemark.yaml")
        #expect(diagnostics.isEmpty, "\(diagnostics)")
        #expect(settings.inventory.count == 2)
        let db = try #require(settings.inventory.first)
        #expect(db.name == "app-db")
        #expect(
            db.settings(as: PostgresSourceSettings.self)
                == PostgresSourceSettings(
                    urlEnv: "APP_DATABASE_URL", query: "select device_id, token, platform from fcm_tokens where active",
                    labels: ["platform"]))
        #expect(db.onDead == .sql("update fcm_tokens set active = false where token = $1"))
        #expect(db.exclusion == ExclusionRule(maxAge: 270 * 86_400, text: "270d"))
        #expect(db.location.description == "tidemark.yaml:2:5")
        let exec = settings.inventory[1]
        #expect(exec.name == "exec run_query.py")
        #expect(
            exec.settings(as: ExecSourceSettings.self)
                == ExecSourceSettings(
                    command: ["python3", "examples/firestore/run_query.py"], format: .jsonl, timeout: 120,
                    interval: .seconds(30)))
        #expect(exec.onDead == .exec(["python3", "examples/firestore/mark_dead.py"]))
    }

    @Test(arguments: [
        ("inventory:\n  - postgres: {url_env: 'postgres://u:p@h/db', query: x}\n", "not the URL itself"),
        ("inventory:\n  - postgres: {query: x}\n", "needs 'url_env'"),
        ("inventory:\n  - exec: {command: python3 x.py}\n", "tidemark runs no shell"),
        ("inventory:\n  - exec: {command: [x], timeout: soon}\n", "'exec.timeout' must be a duration"),
        ("inventory:\n  - exec: {command: [x], interval: often}\n", "'exec.interval' must be a duration"),
        ("inventory:\n  - exec: {command: [x]}\n    on_dead: update t set a = 1\n", "must use $1"),
        (
            "inventory:\n  - exec: {command: [x]}\n    on_dead: update t set a = 1 where t = $1\n",
            "needs a 'postgres' source"
        ),
        ("inventory:\n  - name: a\n", "needs 'postgres' or 'exec'"),
        (
            "inventory:\n  - {name: a, exec: {command: [x]}}\n  - {name: a, exec: {command: [y]}}\n",
            "two inventory sources are named 'a'"
        ),
        (
            "inventory:\n  - exec: {command: [x]}\n    exclude_if: {last_seen_older_than: 9 months}\n",
            "duration such as 270d"
        ),
        ("inventory:\n  - exec: {command: [x]}\n    querry: y\n", "unknown key 'querry'"),
        ("inventory:\n  - postgres: {url_env: X, query: q, resync: 1h}\n", "add 'changes' or 'listen'"),
        (
            "inventory:\n  - postgres: {url_env: X, query: q, listen: Tidemark-Devices}\n",
            "'postgres.listen' must be a channel"
        ),
        (
            "inventory:\n  - postgres: {url_env: X, query: q, listen: d, resync: often}\n",
            "'postgres.resync' must be a duration"
        ),
        ("inventory:\n  - postgres: {url_env: X, query: q, changes: {query: c}}\n", "needs 'query' (the changed rows"),
        (
            "inventory:\n  - postgres: {url_env: X, query: q, changes: {query: c, cursor: 'updated at'}}\n",
            "'postgres.changes.cursor' must name one column"
        ),
        ("inventory:\n  - postgres: {url_env: X, query: q, changes: {query: c, cursr: u}}\n", "did you mean 'cursor'"),
    ])
    func refusesWhatIsWrong(_ text: String, _ expected: String) {
        let (_, diagnostics) = ProjectSettings.decode(text, file: "tidemark.yaml")
        let messages = diagnostics.map(\.description)
        #expect(messages.contains { $0.hasPrefix("tidemark.yaml:") && $0.contains(expected) }, "\(messages)")
    }

    /// A source that follows its changes: the changes query and its cursor, the channel, and how often
    /// it is read in full (an hour unless said).
    @Test func decodesHowASourceFollowsItsChanges() throws {
        let (settings, diagnostics) = ProjectSettings.decode(
            """
            inventory:
              - name: app-db
                postgres:
                  url_env: APP_DATABASE_URL
                  query: select device_id, token, platform from fcm_tokens where active
                  changes:
                    query: select device_id, updated_at from fcm_tokens
                    cursor: updated_at
                  listen: tidemark_devices
                  resync: 30m
              - name: listening
                postgres: {url_env: APP_DATABASE_URL, query: 'select device_id, token from t', listen: t_changes}
              - name: whole
                postgres: {url_env: APP_DATABASE_URL, query: 'select device_id, token from t'}
            """, file: "tidemark.yaml")
        #expect(diagnostics.isEmpty, "\(diagnostics)")
        let first = try #require(settings.inventory.first?.settings(as: PostgresSourceSettings.self))
        #expect(
            first.changes
                == PostgresSourceSettings.Changes(
                    query: "select device_id, updated_at from fcm_tokens", cursor: "updated_at"))
        #expect(first.listen == "tidemark_devices" && first.resync == 1800 && first.followsChanges)
        let listening = try #require(settings.inventory[1].settings(as: PostgresSourceSettings.self))
        #expect(listening.changes == nil && listening.listen == "t_changes" && listening.resync == 3600)
        let whole = try #require(settings.inventory[2].settings(as: PostgresSourceSettings.self))
        #expect(!whole.followsChanges && whole.resync == nil)
    }

    /// A pull request that edits manifests cannot make CI run SQL or a command.
    @Test(arguments: [
        "postgres: {url_env: X, query: 'select 1'}", "exec: {command: [sh, -c, id]}", "on_dead: 'drop table x'",
    ])
    func manifestsCannotDeclareThem(_ entry: String) async {
        var table = TokenTable()
        let loaded = await Fixtures.manifests([
            "inv.yaml": "inventory:\n  \(entry)\n", "topics.yaml": "topics: []\n",
        ]).load(into: &table)
        let messages = loaded.diagnostics.map(\.description)
        #expect(
            messages.contains {
                $0.hasPrefix("inv.yaml:2:3: error:") && $0.contains("honoured only from tidemark.yaml")
            },
            "\(messages)")
    }

    @Test func readsTimesAsDatabasesWriteThem() {
        #expect(ExclusionRule.time("1970-01-02") == 86_400)
        #expect(ExclusionRule.time("2026-05-01T10:00:00Z") == 1_777_629_600)
        #expect(ExclusionRule.time("2026-05-01 12:00:00.123+02") == 1_777_629_600)
        #expect(ExclusionRule.time("2026-05-01T12:30:00+02:30") == 1_777_629_600)
        #expect(ExclusionRule.time("1777629600") == 1_777_629_600)
        #expect(ExclusionRule.time("1777629600000") == 1_777_629_600)
        #expect(ExclusionRule.time("yesterday") == nil)
        #expect(ExclusionRule.time("2026-13-01") == nil)
        let rule = ExclusionRule(maxAge: 270 * 86_400, text: "270d")
        let now: Int64 = 1_777_629_600
        #expect(rule.excludes("2025-01-01", now: now) == true)
        #expect(rule.excludes("2026-04-01", now: now) == false)
        #expect(rule.excludes("", now: now) == false, "never seen is not stale")
        #expect(rule.excludes("soon", now: now) == nil)
    }

    /// Rows without quotes are read from the bytes where they lie (a faster path); they must come out
    /// exactly as when every field is quoted (the general reader): devices, tokens, labels, places and
    /// every message, over ids and labels in other scripts, bytes that are not UTF-8, tokens of bad
    /// shape, repeated ids and tokens, short rows, blank lines and CRLF endings.
    @Test(arguments: [UInt64(1), 2, 3, 4])
    func rowsWithoutQuotesReadAsQuotedRowsDo(seed: UInt64) {
        var random = SeededGenerator(seed: seed)
        func pick<T>(_ choices: [T]) -> T { choices[Int(random.next() % UInt64(choices.count))] }
        let ids: [[UInt8]] = (0..<40).map { Array("d\($0)".utf8) } + [Array("dév-1".utf8), [0x64, 0xFF, 0x31], []]
        let tokens: [[UInt8]] =
            (0..<40).map { Array(Fixtures.token($0).utf8) } + [
                Array("abc".utf8), Array("bad token:APA91bxx".utf8), [], Array("t1:APA91b\u{00e9}".utf8),
                Array("ABCDEFGHIJKLMNOPQRSTUV".utf8),
            ]
        let values: [[UInt8]] = [
            Array("ios".utf8), Array("android".utf8), [], Array("größe".utf8), [0xC3], Array("x".utf8),
        ]
        var rows: [[[UInt8]]] = []
        for _ in 0..<300 {
            switch random.next() % 20 {
            case 0: rows.append([])  // a blank line
            case 1: rows.append([pick(ids), pick(tokens)])  // too few fields
            default: rows.append([pick(ids), pick(tokens), pick(values), pick(values)])
            }
        }
        let newline: [UInt8] = random.next() % 2 == 0 ? [0x0A] : [0x0D, 0x0A]
        func file(quoted: Bool) -> Data {
            var bytes = Array("device_id,token,platform,region".utf8) + newline
            for row in rows {
                let fields = row.map { quoted ? [0x22] + $0 + [0x22] : $0 }
                bytes += Array(fields.joined(separator: [0x2C])) + newline
            }
            return Data(bytes)
        }
        func load(_ data: Data) -> InventoryBuilder {
            var builder = InventoryBuilder()
            FileInventorySource.loadCSV(data, file: "devices.csv", into: &builder)
            return builder
        }
        let plain = load(file(quoted: false))
        let general = load(file(quoted: true))
        #expect(plain.inventory.count > 0)
        #expect(plain.inventory.deviceIDs == general.inventory.deviceIDs)
        #expect(plain.inventory.tokens == general.inventory.tokens)
        #expect(plain.inventory.labelKeys == general.inventory.labelKeys)
        for device in 0..<plain.inventory.count {
            #expect(plain.inventory.location(ofDevice: device) == general.inventory.location(ofDevice: device))
            for key in plain.inventory.labelKeys {
                #expect(
                    plain.inventory.label(key, ofDevice: device) == general.inventory.label(key, ofDevice: device))
            }
            #expect(plain.inventory.index(ofToken: plain.inventory.tokens[device]) == device)
            #expect(plain.inventory.index(ofDevice: plain.inventory.deviceIDs[device]) == device)
        }
        for key in plain.inventory.labelKeys {
            #expect(plain.inventory.values(ofLabel: key) == general.inventory.values(ofLabel: key))
        }
        #expect(plain.diagnostics.map(\.description) == general.diagnostics.map(\.description))
        #expect(!plain.diagnostics.isEmpty)
    }

    /// exclude_if over a file's rows (an exec source's output is read the same way).
    @Test func exclusionLeavesStaleRowsOutAndCountsThem() {
        var builder = InventoryBuilder()
        let csv =
            "device_id,token,platform,last_seen\na,\(Fixtures.token(1)),ios,2026-04-30\nb,\(Fixtures.token(2)),ios,2024-01-01\nc,\(Fixtures.token(3)),ios,later\n"
        FileInventorySource.loadCSV(
            Data(csv.utf8), file: "x.csv", into: &builder,
            exclusion: ExclusionFilter(ExclusionRule(maxAge: 270 * 86_400, text: "270d"), now: 1_777_629_600))
        #expect(builder.inventory.deviceIDs == ["a"])
        #expect(builder.excluded == 1)
        #expect(builder.inventory.labelKeys == ["platform"])
        #expect(
            builder.diagnostics.map(\.description) == [
                "x.csv:4:1: error: last_seen 'later' of device 'c' is not a time; exclude_if reads dates such as 2026-05-01, 2026-05-01T10:00:00Z or epoch seconds or milliseconds."
            ])
    }
}
