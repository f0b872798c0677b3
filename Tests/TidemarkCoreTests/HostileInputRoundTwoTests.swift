import Foundation
import Testing
import TidemarkTesting

@testable import TidemarkCore

/// The second hostile-input campaign's cases for the parsers: what was wrongly accepted is refused
/// with its file, line and value; what was wrongly refused (CRLF, a byte order mark) is read.
@Suite struct HostileInputRoundTwoTests {
    static let token = "aaaaaaaaaaa:APA91bAAAA"
    static let other = "bbbbbbbbbbb:APA91bBBBB"

    func load(_ files: [String: String]) async -> LoadedManifests {
        var table = TokenTable()
        return await ManifestLoader(files: InMemoryFileSource(files)).load(into: &table)
    }

    func errors(_ files: [String: String]) async -> [Diagnostic] {
        await load(files).diagnostics.filter { $0.severity == .error }
    }

    func expectError(
        _ files: [String: String], at file: String, line: Int, _ parts: [String],
        sourceLocation: Testing.SourceLocation = #_sourceLocation
    ) async {
        let found = await errors(files)
        let match = found.first { d in
            d.location?.file == file && d.location?.line == line && parts.allSatisfy { d.message.contains($0) }
        }
        #expect(
            match != nil,
            "expected \(parts) at \(file):\(line); got:\n\(found.map(\.description).joined(separator: "\n"))",
            sourceLocation: sourceLocation)
    }

    static let inline = """
        inventory:
          devices:
            - id: d1
              token: "\(token)"

        """

    // MARK: - YAML values that are not strings

    @Test func nullTaggedAndSpecialNumbersAreNotNames() async {
        let cases: [(String, [String])] = [
            ("name: null", ["must be a string, not an empty value"]),
            ("name: ~", ["must be a string, not an empty value"]),
            ("name: !!int 5", ["carries the YAML tag 'tag:yaml.org,2002:int'"]),
            ("name: !custom weather", ["carries the YAML tag '!custom'"]),
            ("name: .nan", ["'.nan'", "special number"]),
            ("name: -.inf", ["'-.inf'", "special number"]),
        ]
        for (line, parts) in cases {
            await expectError(
                ["t.yaml": Self.inline + "topics:\n  - \(line)\n    members: [{devices: [d1]}]\n"], at: "t.yaml",
                line: 6, parts)
        }
        // Quoted, or written plainly as text, they are names like any other.
        for name in ["'null'", "\".nan\"", "!!str tagged-as-text", "'2024'", "2024"] {
            let found = await errors(
                ["t.yaml": Self.inline + "topics:\n  - name: \(name)\n    members: [{devices: [d1]}]\n"])
            #expect(found.isEmpty, "\(name): \(found)")
        }
    }

    @Test func aDeviceIdYAMLReadsAsANumberMustBeQuoted() async {
        let files = [
            "inv.yaml": "inventory:\n  devices:\n    - id: 00123\n      token: \"\(Self.token)\"\n"
        ]
        await expectError(files, at: "inv.yaml", line: 3, ["'id' '00123' is a number to YAML", "quote it"])
        let found = await errors(files)
        #expect(found.count == 1, "one error, not a second 'needs both' one: \(found)")
        #expect(
            await errors(["inv.yaml": "inventory:\n  devices:\n    - id: '00123'\n      token: \"\(Self.token)\"\n"])
                .isEmpty)
    }

    @Test func groupNamesAreBoundedAndOnOneLine() async {
        let long = String(repeating: "g", count: 10_000)
        await expectError(
            ["g.yaml": Self.inline + "groups:\n  - notification_key_name: \(long)\n    members: [{devices: [d1]}]\n"],
            at: "g.yaml", line: 6, ["10000 bytes long", "at most 256"])
        await expectError(
            ["g.yaml": Self.inline + "groups:\n  - notification_key_name: \"a\\nb\"\n    members: [{devices: [d1]}]\n"],
            at: "g.yaml", line: 6, ["'a\\nb' has a control character"])
    }

    @Test func anAudienceNeedsMembers() async {
        await expectError(
            ["a.yaml": Self.inline + "audiences:\n  - name: empty-audience\n"], at: "a.yaml", line: 6,
            ["audience 'empty-audience' has no members"])
        await expectError(
            ["a.yaml": Self.inline + "audiences:\n  - name: empty-audience\n    members: []\n"], at: "a.yaml", line: 6,
            ["has no members"])
    }

    @Test func projectAndSenderIdAreChecked() {
        for (text, part) in [
            ("project: \"a\\nb-project\"", "'a\\nb-project'"), ("project: ../../etc", "'../../etc'"),
            ("sender_id: 12ab", "'12ab'"),
        ] {
            let (_, found) = ProjectSettings.decode(text + "\n", file: "tidemark.yaml")
            #expect(found.contains { $0.message.contains(part) && $0.location?.line == 1 }, "\(text): \(found)")
        }
        for text in ["project: my-project-1", "project: example.com:my-project", "sender_id: \"123456789012\""] {
            let (_, found) = ProjectSettings.decode(text + "\n", file: "tidemark.yaml")
            #expect(found.isEmpty, "\(text): \(found)")
        }
    }

    // MARK: - Line endings and byte order marks

    @Test func aTokenFileWithCRLFLineEndingsIsRead() async {
        let files = [
            "inv.yaml": Self.inline,
            "t.yaml": "topics:\n  - name: testers\n    members: [{file: testers.txt}]\n",
            "testers.txt": "\u{FEFF}# testers\r\n\(Self.token)\r\n\r\n  \(Self.other) \r\n",
        ]
        let loaded = await load(files)
        #expect(loaded.diagnostics.filter { $0.severity == .error }.isEmpty, "\(loaded.diagnostics)")
        #expect(loaded.desired.topics.first?.members.count == 2)
        // A bad line is still named by its number.
        await expectError(
            files.merging(["testers.txt": "\(Self.token)\r\nnot-a-token\r\n"]) { $1 }, at: "testers.txt", line: 2,
            ["not a registration token"])
    }

    @Test func fmtReadsCRLFAndWritesLF() {
        let crlf = "topics:\r\n  - name: a\r\n    members: [{devices: [d1]}]\r\n"
        guard case .formatted(let out) = ManifestFormatter().format(crlf, file: "t.yaml") else {
            Issue.record("CRLF manifest not formatted")
            return
        }
        #expect(!out.contains("\r"))
        guard case .formatted(let again) = ManifestFormatter().format(out, file: "t.yaml") else { return }
        #expect(again == out)
    }

    @Test func aCSVWithAByteOrderMarkIsRead() async {
        let files = [
            "inv.yaml": "inventory:\n  files: [devices.csv]\n",
            "t.yaml": "topics:\n  - name: all\n    members: [{devices: [d1, d2]}]\n",
            "devices.csv": "\u{FEFF}device_id,token\r\nd1,\(Self.token)\r\nd2,\(Self.other)\r\n",
        ]
        let loaded = await load(files)
        #expect(loaded.diagnostics.filter { $0.severity == .error }.isEmpty, "\(loaded.diagnostics)")
        #expect(loaded.inventory.count == 2)
    }

    @Test func aQuotedCSVFieldWithTextAfterItsQuoteIsRefused() async {
        let files = [
            "inv.yaml": "inventory:\n  files: [devices.csv]\n",
            "devices.csv": "device_id,token\nd1,\"\(Self.token)\"x\nd2,\(Self.other)\n",
        ]
        await expectError(files, at: "devices.csv", line: 2, ["text after its closing '\"'"])
        let loaded = await load(files)
        #expect(loaded.inventory.count == 1, "the next row is read from its start")
    }

    @Test func JSONLinesWithATrailingCommaAreRefusedAndABOMIsRead() async {
        let files = [
            "inv.yaml": "inventory:\n  files: [devices.jsonl]\n",
            "devices.jsonl":
                "\u{FEFF}{\"id\": \"d1\", \"token\": \"\(Self.token)\"}\n{\"id\": \"d2\", \"token\": \"\(Self.other)\",}\n{\"id\": \"d3\", \"token\": \"\(Self.other)\", \"labels\": {\"note\": \"a,}\"}}\n",
        ]
        await expectError(files, at: "devices.jsonl", line: 2, ["comma before a closing brace"])
        let loaded = await load(files)
        #expect(loaded.inventory.count == 2, "d1 (after the BOM) and d3 (a comma inside a string) are read")
    }

    // MARK: - Bounded work

    /// A gzip bomb is refused as it inflates, at the ratio no inventory has, long before its limit.
    @Test func aGzipBombIsRefusedByItsRatio() throws {
        let bomb = Gzip.compress(Data(repeating: UInt8(ascii: "\n"), count: 256 << 20), level: 9)
        #expect(bomb.count < 1 << 20)
        let clock = ContinuousClock()
        let started = clock.now
        #expect {
            try Gzip.decompress(bomb, atMost: 8 << 30, setting: "inventory_bytes")
        } throws: { error in
            (error as? GzipError)?.description.contains("more than 200 times its compressed size") == true
        }
        #expect(clock.now - started < .seconds(10))
        // A real export's ratio passes.
        let csv = Data((0..<20_000).map { "d\($0),\(Self.token)\($0)\n" }.joined().utf8)
        #expect(try Gzip.decompress(Gzip.compress(csv), atMost: 8 << 30) == csv)
    }

    /// A manifest of a million member entries (43 MB) is refused by its size before it is parsed into
    /// a YAML tree of a gigabyte.
    @Test func aManifestOfAMillionEntriesIsRefusedBeforeItIsParsed() async {
        var text = "topics:\n  - name: big\n    members:\n"
        text.reserveCapacity(44_000_000)
        for i in 0..<1_000_000 { text += "      - token: \"aaaaaaaaaaa:APA91b\(i)\"\n" }
        let clock = ContinuousClock()
        let started = clock.now
        let found = await errors(["big.yaml": text])
        #expect(clock.now - started < .seconds(30))
        #expect(
            found.contains { $0.location?.file == "big.yaml" && $0.message.contains("limits.manifest_bytes") },
            "\(found)")
    }

    /// A file of nothing but newlines reserves room for the rows its bytes can hold, not one per line.
    @Test func aFileOfNewlinesReservesLittle() async {
        var text = "device_id,token\n"
        text += String(repeating: "\n", count: 4 << 20)
        var builder = InventoryBuilder(deviceLimit: 50_000_000)
        let clock = ContinuousClock()
        let started = clock.now
        FileInventorySource.loadCSV(Data(text.utf8), file: "devices.csv", into: &builder)
        #expect(clock.now - started < .seconds(10))
        #expect(builder.inventory.count == 0)
        // 1 GiB of newlines (the campaign's case) reserves for 43 million rows at most, not a billion;
        // the device limit and a short file bound it further.
        let gib = 1 << 30
        #expect(FileInventorySource.reservation(lines: gib, bytes: gib, room: .max) == gib / 25 + 1)
        #expect(FileInventorySource.reservation(lines: gib, bytes: gib, room: 1000) == 1000)
        #expect(FileInventorySource.reservation(lines: 3, bytes: 200, room: 0) == 0)
        #expect(FileInventorySource.reservation(lines: 3, bytes: 200, room: -5) == 0)
    }

    /// JSON lines are found one at a time: runs of empty lines keep their numbers, a line too long to be
    /// a device is refused by its length before any JSON parser sees it, and a flood of newlines costs
    /// a pass over its bytes (the campaign's gigabyte of them took 17.9 GB and three minutes).
    @Test func JSONLinesAreWalkedNotSplit() {
        var builder = InventoryBuilder(deviceLimit: 1000)
        let long = "{\"id\": \"d9\", \"token\": \"" + String(repeating: "x", count: 2 << 20) + "\"}"
        let text =
            "\n\n{\"id\": \"d1\", \"token\": \"\(Self.token)\"}\n\n\n\(long)\n{\"id\": \"d2\", \"token\": \"\(Self.other)\"}"
        FileInventorySource.loadJSONLines(Data(text.utf8), file: "devices.jsonl", into: &builder)
        #expect(builder.inventory.count == 2, "d1 on line 3 and d2 on the last line, with no newline after it")
        let problems = builder.diagnostics.map(\.description)
        #expect(problems.count == 1 && problems[0].contains("devices.jsonl:6:1"), "\(problems)")
        #expect(problems.first?.contains("is at most 1 MiB") == true, "\(problems)")

        var flood = InventoryBuilder(deviceLimit: 1000)
        let clock = ContinuousClock()
        let started = clock.now
        FileInventorySource.loadJSONLines(
            Data(repeating: UInt8(ascii: "\n"), count: 64 << 20), file: "devices.jsonl", into: &flood)
        #expect(clock.now - started < .seconds(30))
        #expect(flood.inventory.count == 0 && flood.diagnostics.isEmpty)
    }

    /// A CSV whose first line runs past 64 KiB with no line break is no header, and is refused before it
    /// is split into fields (a gigabyte of it took 55 s and 3.9 GB, and the message quoted all of it);
    /// a header that is wrong is quoted short.
    @Test func aCSVWithoutAHeaderLineIsRefusedAtOnce() {
        var builder = InventoryBuilder(deviceLimit: 1000)
        FileInventorySource.loadCSV(
            Data(repeating: UInt8(ascii: "x"), count: 8 << 20), file: "devices.csv", into: &builder)
        let problems = builder.diagnostics.map(\.description)
        #expect(problems.count == 1 && problems[0].contains("longer than 64 KiB"), "\(problems.map { $0.prefix(300) })")
        var wrong = InventoryBuilder(deviceLimit: 1000)
        FileInventorySource.loadCSV(
            Data((String(repeating: "y", count: 50_000) + "\nd1,t\n").utf8), file: "devices.csv", into: &wrong)
        let message = wrong.diagnostics.first?.message ?? ""
        #expect(message.contains("must name a 'device_id'") && message.count < 400, "\(message.prefix(400))")
    }

    /// A thousand rows with the same problem read as twenty lines and a count, not a thousand lines;
    /// problems of another kind are still listed.
    @Test func repeatedRowProblemsAreCountedPastTwenty() {
        var builder = InventoryBuilder(deviceLimit: 10_000)
        let rows = (0..<1000).map { "d\($0),\n" }.joined() + "x1,abc\n"
        FileInventorySource.loadCSV(Data(("device_id,token\n" + rows).utf8), file: "devices.csv", into: &builder)
        let all = builder.allDiagnostics.map(\.description)
        #expect(all.count == 22, "\(all.count): \(all.suffix(3))")
        #expect(all.filter { $0.hasPrefix("devices.csv:2:") || $0.hasPrefix("devices.csv:21:") }.count == 2)
        #expect(all.contains { $0.hasPrefix("devices.csv:1002:") }, "the one row of another kind is listed")
        #expect(
            all.last?.contains("… and 980 more rows with the same problem as devices.csv:2:1, not listed.") == true,
            "\(all.last ?? "")")
    }

    // MARK: - Saved plans

    @Test func aSavedPlanNoTidemarkWroteIsRefused() throws {
        var plan = StateStoreConformance.plan(
            [PlannedOperation(kind: .subscribe, target: "news", tokens: [Fixtures.token(0)])],
            state: StateStoreConformance.sample(tokens: 10))
        plan.serial = 3
        plan.operationsDigestWhenMade = plan.operationsDigest
        let json = String(decoding: try Plan.encoder().encode(plan), as: UTF8.self)
        func refused(_ text: String, _ part: String, encoding: String.Encoding = .utf8) {
            #expect {
                try Plan.decodeSaved(text.data(using: encoding)!, file: "plan.json")
            } throws: { error in
                (error as? SavedPlanError)?.description.contains(part) == true
            }
        }
        refused(
            json.replacingOccurrences(of: "\"format_version\" : 1", with: "\"format_version\" : -1"), "plan format -1")
        refused(json.replacingOccurrences(of: "\"serial\" : 3", with: "\"serial\" : -3"), "serial -3")
        // Operations are counted before the plan is decoded (decoding costs several times the file).
        #expect((1...3).contains(Plan.operationCount(Data(json.utf8), atMost: 10)))
        let many = StateStoreConformance.plan(
            (0..<200).map { PlannedOperation(kind: .subscribe, target: "news", tokens: [Fixtures.token($0)]) },
            state: StateStoreConformance.sample(tokens: 10))
        let manyJSON = try Plan.encoder().encode(many)
        #expect(throws: Never.self) { try Plan.decodeSaved(manyJSON, file: "plan.json", maxOperations: 200) }
        #expect {
            try Plan.decodeSaved(manyJSON, file: "plan.json", maxOperations: 50)
        } throws: { error in
            (error as? SavedPlanError)?.description.contains("raise limits.plan_operations") == true
        }
        refused(json, "not UTF-8", encoding: .utf16)
        refused(json, "not UTF-8", encoding: .utf16LittleEndian)
        #expect(throws: Never.self) { try Plan.decodeSaved(Data(json.utf8), file: "plan.json") }
    }

    /// A saved plan naming a topic or registrations that neither the manifests, the inventory nor state
    /// know is refused as soon as state is loaded, before its registrations are read from FCM (a
    /// million forged ones would cost minutes of reads before the same refusal).
    @Test func aForgedSavedPlanIsRefusedBeforeAnythingIsRead() async throws {
        let project = try WorkflowTests.Project()
        let made = try await project.plan(PlanRequest(refresh: false)).plan
        var forged = made
        forged.coverage = nil
        forged.operations = (0..<20_000).map {
            PlannedOperation(kind: .subscribe, target: "team-zero", tokens: [Fixtures.token($0 + 1_000_000)])
        }
        forged.operationsDigestWhenMade = nil
        let before = project.backend.calls.count
        await #expect {
            _ = try await project.apply(project.saved(forged))
        } throws: { error in
            "\(error)".contains("20,000 registrations that neither the inventory, the manifests nor state know")
        }
        var elsewhere = made
        elsewhere.operations = [PlannedOperation(kind: .subscribe, target: "forged-topic", tokens: [Fixtures.token(0)])]
        elsewhere.operationsDigestWhenMade = nil
        await #expect {
            _ = try await project.apply(project.saved(elsewhere))
        } throws: { error in
            "\(error)".contains("'forged-topic' as a topic that neither the manifests nor state know")
        }
        // A name that is known, but as something else: a topic is no device group, and a group no topic.
        for (kind, target, what) in [
            (PlannedOperation.Kind.groupAdd, "team-zero", "a device group"),
            (.subscribe, "family", "a topic"), (.audienceSet, "team-zero", "an audience"),
        ] {
            var retyped = made
            retyped.operations = [PlannedOperation(kind: kind, target: target, tokens: [Fixtures.token(0)])]
            retyped.operationsDigestWhenMade = nil
            await #expect {
                _ = try await project.apply(project.saved(retyped))
            } throws: { error in
                "\(error)".contains("'\(target)' as \(what) that neither the manifests nor state know")
            }
        }
        #expect(project.backend.calls.count - before < 10, "no forged registration was read")
    }
}
