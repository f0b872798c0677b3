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
