import Foundation
import Testing
import TidemarkTesting

@testable import TidemarkCore

/// Random and adversarial input for every parser: no crash, bounded time, and a message that names
/// the input. Seeds are fixed so a failure repeats.
@Suite struct HostileInputTests {
    /// Every case here finishes far below this; a parser that hangs or blows up would not.
    static let bound: Duration = .seconds(10)

    @discardableResult
    func timed<T>(_ what: String, _ body: () async throws -> T) async rethrows -> T {
        let clock = ContinuousClock()
        let start = clock.now
        let result = try await body()
        #expect(clock.now - start < Self.bound, "\(what) took \(clock.now - start)")
        return result
    }

    /// `text` with a random number of `edits`: each deletes a character or inserts one of `fragments`.
    static func mutate(
        _ text: String, edits: ClosedRange<Int>, fragments: [String], _ random: inout SeededGenerator
    ) -> String {
        var characters = Array(text)
        for _ in 0..<Int.random(in: edits, using: &random) {
            let at = Int.random(in: 0...characters.count, using: &random)
            if Bool.random(using: &random), at < characters.count {
                characters.remove(at: at)
            } else {
                characters.insert(contentsOf: fragments.randomElement(using: &random)!, at: min(at, characters.count))
            }
        }
        return String(characters)
    }

    // MARK: - Conditions

    @Test func conditionsDeepLongOrRandomNeverCrash() async throws {
        let adversarial = [
            String(repeating: "(", count: 10_000) + "'a' in topics" + String(repeating: ")", count: 10_000),
            String(repeating: "!", count: 20_000) + "'a' in topics",
            Array(repeating: "'a' in topics", count: 100_000).joined(separator: " && "),
            Array(repeating: "!('a' in topics)", count: 50_000).joined(separator: " || "),
            String(repeating: "(", count: 1_000_000),
            "'" + String(repeating: "a", count: 1_000_000) + "' in topics",
        ]
        for text in adversarial {
            await timed("condition of \(text.utf8.count) bytes") {
                #expect(throws: ConditionError.self) { try FCMCondition.parse(text) }
            }
        }
        #expect {
            try FCMCondition.parse(String(repeating: "!", count: 40) + "'a' in topics")
        } throws: { ($0 as? ConditionError)?.message.contains("nest more than 32") == true }
        #expect {
            try FCMCondition.parse(Array(repeating: "'a' in topics", count: 6).joined(separator: " && "))
        } throws: { ($0 as? ConditionError)?.message.contains("more than 5 topics") == true }
        // What FCM takes still parses: five topics, nesting as deep as is useful.
        _ = try FCMCondition.parse(
            "!(!('a' in topics && ('b' in topics || !('c' in topics))) || 'd' in topics) && 'e' in topics")

        var random = SeededGenerator(seed: 13)
        let pieces = [
            "(", ")", "!", "&&", "||", "'a' in topics", "'b'", " in ", "topics", "'", "x", " ", "\"", "%", "é",
        ]
        for _ in 0..<3000 {
            let text = (0..<Int.random(in: 0..<40, using: &random)).map { _ in pieces.randomElement(using: &random)! }
                .joined()
            do {
                let condition = try FCMCondition.parse(text)
                #expect(condition.topics.count <= FCMCondition.maxTopics)
            } catch {
                #expect(error.column >= 1 && !error.message.isEmpty, "\(text)")
            }
        }
    }

    // MARK: - Manifests

    func load(_ files: [String: String], limits: InputLimits = InputLimits()) async -> [Diagnostic] {
        var table = TokenTable()
        return await ManifestLoader(files: InMemoryFileSource(files), limits: limits).load(into: &table).diagnostics
    }

    static func aliasBomb(levels: Int) -> String {
        var yaml = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n"
        for level in 1...levels {
            yaml +=
                "a\(level): &a\(level) [" + Array(repeating: "*a\(level - 1)", count: 10).joined(separator: ", ")
                + "]\n"
        }
        return yaml + "topics: *a\(levels)\n"
    }

    @Test func manifestBlowUpsAreRefusedQuickly() async throws {
        for levels in [5, 9] {
            let bomb = Self.aliasBomb(levels: levels)
            let diagnostics = await timed("alias bomb of \(levels) levels") { await load(["bomb.yaml": bomb]) }
            #expect(
                diagnostics.contains { $0.location?.file == "bomb.yaml" && $0.message.contains("aliases expand") },
                "\(diagnostics.prefix(3))")
            let formatted = await timed("fmt of the alias bomb") { ManifestFormatter().format(bomb, file: "bomb.yaml") }
            guard case .failed(let problems) = formatted else {
                Issue.record("fmt rewrote an alias bomb")
                continue
            }
            #expect(problems.contains { $0.message.contains("aliases expand") })
        }
        for deep in [String(repeating: "[", count: 100_000), String(repeating: "- ", count: 5_000) + "x"] {
            let diagnostics = await timed("deeply nested YAML") { await load(["deep.yaml": deep]) }
            #expect(diagnostics.contains { $0.location?.file == "deep.yaml" && $0.severity == .error })
        }
    }

    @Test func fmtRefusesFilesThatAreNotManifests() {
        for text in [
            "colour: blue\nsize: 3\n", "- a\n- b\n", "topics:\n  - name: a\n    colour: blue\n", "just words\n",
        ] {
            guard case .failed(let problems) = ManifestFormatter().format(text, file: "notes.yaml") else {
                Issue.record("fmt rewrote a file that is not a manifest: \(text)")
                continue
            }
            #expect(problems.first?.message.contains("not a tidemark manifest") == true, "\(problems)")
            #expect(problems.first?.location?.file == "notes.yaml")
        }
    }

    @Test func manifestsOfRandomBytesAndMutationsNeverCrash() async throws {
        let valid = """
            inventory:
              devices:
                - {id: d1, token: "aaaaaaaaaaa:APA91bAAAA", labels: {team: a}}
            topics:
              - name: news
                mode: authoritative
                members: [{devices: [d1]}, {selector: {team: a}}]
            groups:
              - notification_key_name: family
                members: [{device: d1}]
            """
        var random = SeededGenerator(seed: 7)
        let fragments = [
            ":", "- ", "&a ", "*a", "{", "}", "[", "]", "'", "\"", "\n", "  ", "\t", "#", "!!binary ", "? ", "|", ">",
            "\u{0}", "\u{FEFF}", "topics", "members", "~", "%YAML 1.2\n", "---\n", "...\n",
        ]
        var cases = 0
        for _ in 0..<600 {
            let text = Self.mutate(valid, edits: 1...6, fragments: fragments, &random)
            let diagnostics = await load(["m.yaml": text])
            for diagnostic in diagnostics where diagnostic.severity == .error {
                #expect(!diagnostic.message.contains("Error Domain") && !diagnostic.message.contains("DecodingError"))
            }
            if diagnostics.hasErrors {
                #expect(diagnostics.contains { $0.location?.file == "m.yaml" }, "\(diagnostics.prefix(2))")
            }
            cases += 1
        }
        for _ in 0..<200 {
            let bytes = (0..<Int.random(in: 0..<300, using: &random)).map { _ in
                UInt8.random(in: 0...255, using: &random)
            }
            let diagnostics = await load(["r.yaml": String(decoding: bytes, as: UTF8.self)])
            #expect(diagnostics.allSatisfy { !$0.message.contains("Error Domain") })
            cases += 1
        }
        #expect(cases == 800)
    }

    @Test func sizeLimitsAreEnforcedAndNamed() async {
        var limits = InputLimits()
        limits.manifestBytes = 100
        let big = "topics:\n" + String(repeating: "  - {name: t, members: []}\n", count: 10)
        let diagnostics = await load(["big.yaml": big], limits: limits)
        #expect(
            diagnostics.contains { $0.location?.file == "big.yaml" && $0.message.contains("limits.manifest_bytes") })

        limits = InputLimits()
        limits.inventoryBytes = 50
        limits.devices = 2
        let csv = "device_id,token\n" + (0..<5).map { "d\($0),\(Fixtures.token($0))" }.joined(separator: "\n") + "\n"
        let files = ["inv.yaml": "inventory:\n  files: [devices.csv]\n", "devices.csv": csv]
        let tooBig = await load(files, limits: limits)
        #expect(tooBig.contains { $0.message.contains("limits.inventory_bytes") && $0.location?.file == "inv.yaml" })
        limits.inventoryBytes = 1 << 20
        let tooMany = await load(files, limits: limits)
        #expect(tooMany.filter { $0.message.contains("limits.devices") }.count == 1, "\(tooMany)")
        #expect(tooMany.contains { $0.location?.file == "devices.csv" && $0.location?.line == 4 })
    }

    @Test func limitsAreSettableInTidemarkYAML() {
        let (settings, problems) = ProjectSettings.decode(
            "limits:\n  manifest_bytes: 1MiB\n  inventory_bytes: 2GB\n  plan_bytes: 12345\n  devices: 2_000_000\n",
            file: "tidemark.yaml")
        #expect(problems.isEmpty)
        #expect(settings.limits.manifestBytes == 1 << 20 && settings.limits.inventoryBytes == 2_000_000_000)
        #expect(settings.limits.planBytes == 12345 && settings.limits.devices == 2_000_000)
        let (_, bad) = ProjectSettings.decode("limits:\n  plan_bytes: lots\n  rows: 3\n", file: "tidemark.yaml")
        #expect(bad.contains { $0.message.contains("limits.plan_bytes") && $0.location?.line == 2 })
        #expect(bad.contains { $0.message.contains("unknown key 'rows'") && $0.location?.line == 3 })
    }

    // MARK: - Inventory

    @Test func inventoryFilesOfGarbageNeverCrash() async throws {
        var random = SeededGenerator(seed: 99)
        let good =
            "device_id,token,team\n"
            + (0..<20).map { "d\($0),\(Fixtures.token($0)),t\($0 % 3)" }
            .joined(separator: "\n") + "\n"
        let goodJSON =
            (0..<20).map { #"{"device_id":"d\#($0)","token":"\#(Fixtures.token($0))","team":"t"}"# }
            .joined(separator: "\n") + "\n"
        let fragments = ["\"", ",", "\n", "\r", "\r\n", "{", "}", "[", ":", "\u{0}", "\\", "\"\"", "\u{FEFF}", "null"]
        var cases = 0
        for (name, base) in [("devices.csv", good), ("devices.jsonl", goodJSON)] {
            for _ in 0..<300 {
                let text = Self.mutate(base, edits: 1...8, fragments: fragments, &random)
                let diagnostics = await load(["inv.yaml": "inventory:\n  files: [\(name)]\n", name: text])
                for diagnostic in diagnostics where diagnostic.severity == .error {
                    #expect(
                        diagnostic.location?.file == name || diagnostic.location?.file == "inv.yaml",
                        "\(diagnostic)")
                    #expect((diagnostic.location?.line ?? 0) >= 1)
                }
                cases += 1
            }
        }
        // A file of nothing but one endless unterminated quote, and one of a million empty lines.
        for text in [
            "device_id,token\n\"" + String(repeating: "a", count: 2_000_000), String(repeating: "\n", count: 1_000_000),
        ] {
            let diagnostics = await timed("pathological CSV") {
                await load(["inv.yaml": "inventory:\n  files: [d.csv]\n", "d.csv": text])
            }
            #expect(diagnostics.hasErrors)
            #expect(diagnostics.count <= InventoryBuilder.diagnosticLimit + 5)
            cases += 1
        }
        #expect(cases == 602)
    }

    @Test func garbageRowsAreCountedNotAllListed() async {
        let csv = "device_id,token\n" + (0..<5000).map { "d\($0),abc\($0)" }.joined(separator: "\n") + "\n"
        let diagnostics = await load(["inv.yaml": "inventory:\n  files: [d.csv]\n", "d.csv": csv])
        // One kind of problem: twenty listed, the rest counted in one line.
        #expect(diagnostics.count <= InventoryBuilder.sameKindLimit + 2)
        #expect(diagnostics.contains { $0.message.contains("4,980 more rows with the same problem as d.csv:2:1") })
    }

    // MARK: - Tokens

    @Test func tokensMustHaveAShapeFCMIssues() {
        let fid = "cAbCdEfGhIjKlMnOpQrS_-"
        #expect(fid.count == 22)
        for accepted in [
            "aaaaaaaaaaa:APA91bAAAA", fid, "APA91b" + String(repeating: "x", count: 140),
            "dXk3Q2pRSmVBZk1QdkN1Zw:APA91bH" + String(repeating: "k", count: 134),
        ] {
            #expect(FCMLimits.tokenProblem(accepted) == nil, "\(accepted)")
        }
        for refused in [
            "abc", "x", "aaaaaaaaaaa:notapa", ":APA91bAAAA", "APA91bshort", String(repeating: "a", count: 23),
            "user@example.com", "a:b:APA91b", "", String(repeating: "a", count: 21), "aaaa aaaa",
        ] {
            #expect(FCMLimits.tokenProblem(refused) != nil, "\(refused)")
        }
        #expect(FCMLimits.tokenProblem("abc")?.contains("PREFIX:APA91b") == true)
    }

    @Test func aThreeLetterTokenIsRefusedAtItsPlace() async {
        let diagnostics = await load([
            "m.yaml": "topics:\n  - name: news\n    members:\n      - token: abc\n"
        ])
        #expect(
            diagnostics.contains {
                $0.location?.file == "m.yaml" && $0.location?.line == 4 && $0.message.contains("'abc'")
            },
            "\(diagnostics)")
    }

    // MARK: - Plan files

    @Test func savedPlansOfGarbageAreRefusedInOneLine() throws {
        let plan = StateStoreConformance.plan(
            [PlannedOperation(kind: .subscribe, target: "news", tokens: [Fixtures.token(0), Fixtures.token(1)])],
            state: StateStoreConformance.sample(tokens: 10))
        var made = plan
        made.operationsDigestWhenMade = plan.operationsDigest
        let valid = try Plan.encoder().encode(made)
        _ = try Plan.decodeSaved(valid, file: "plan.json")
        var random = SeededGenerator(seed: 5)
        var refused = 0
        let text = Array(valid)
        for round in 0..<1500 {
            var bytes = text
            switch round % 3 {
            case 0: bytes = Array(bytes.prefix(Int.random(in: 0..<bytes.count, using: &random)))
            case 1:
                for _ in 0..<Int.random(in: 1...4, using: &random) {
                    bytes[Int.random(in: 0..<bytes.count, using: &random)] = UInt8.random(in: 0...255, using: &random)
                }
            default:
                let replacements: [(String, String)] = [
                    ("\"subscribe\"", "\"resubscribe\""), ("\"news\"", "7"), ("[", "{"), ("2", "\"2\""),
                    ("\"format_version\" : 1", "\"format_version\" : \"one\""), ("true", "null"),
                ]
                let (from, to) = replacements.randomElement(using: &random)!
                bytes = Array(String(decoding: bytes, as: UTF8.self).replacingOccurrences(of: from, with: to).utf8)
            }
            do {
                _ = try Plan.decodeSaved(Data(bytes), file: "plan.json")
            } catch {
                refused += 1
                #expect(error.description.hasPrefix("plan.json"), "\(error.description)")
                #expect(!error.description.contains("DecodingError") && !error.description.contains("CodingKeys"))
                #expect(!error.description.contains("\n"))
            }
        }
        #expect(refused > 1000)
    }

    @Test func decodingErrorsAreDescribedByPlace() {
        struct Inner: Decodable { var kind: String }
        struct Outer: Decodable { var operations: [Inner] }
        let cases: [(String, String)] = [
            (#"{"operations":[{"kind":1}]}"#, "operations[0].kind is not a string"),
            (#"{"operations":[{}]}"#, "'kind' is missing at operations[0]"),
            (#"{"operations":null}"#, "operations is null"),
            ("{", "not valid JSON"),
        ]
        for (json, expected) in cases {
            do {
                _ = try JSONDecoder().decode(Outer.self, from: Data(json.utf8))
                Issue.record("decoded \(json)")
            } catch {
                #expect(ErrorText.describe(error).contains(expected), "\(ErrorText.describe(error))")
            }
        }
        let cocoa = CocoaError(.fileReadNoPermission, userInfo: [NSFilePathErrorKey: "/x/plan.json"])
        #expect(ErrorText.describe(cocoa) == "/x/plan.json: permission denied; check the file's owner and mode")
    }
}

/// An error that says nothing for itself is never shown as a dump of its value.
@Suite struct ErrorTextDumpTests {
    struct SingleConnectionFailure: Error {
        var target: String
        var underlying: Int
    }

    struct Dumping: Error, CustomStringConvertible {
        var description: String { "PSQLError(code: connectionError, underlying: nil)" }
    }

    @Test func dumpsAreRecognisedAndNeverShown() {
        #expect(ErrorText.isDump("SingleConnectionFailure(target: [IPv4]127.0.0.1/127.0.0.1:5432, error: x)"))
        #expect(ErrorText.isDump("Optional(\"x\")") && ErrorText.isDump("Error Domain=NSCocoaErrorDomain Code=4"))
        #expect(ErrorText.isDump("NIOCore.IOError(errnoCode: 111)"))
        #expect(!ErrorText.isDump("connection refused (is the server running on 127.0.0.1:5432?)"))
        #expect(!ErrorText.isDump("topic 'a' (authoritative): 3 removals"))
        #expect(!ErrorText.isDump("Read 1,001 registrations (--refresh all)."))
        for error in [SingleConnectionFailure(target: "x", underlying: 1) as any Error, Dumping()] {
            let text = ErrorText.describe(error)
            #expect(!ErrorText.isDump(text) && !text.contains("target:") && !text.contains("code:"), "\(text)")
            #expect(text.contains("TIDEMARK_TRACE_PHASES=1"), "\(text)")
        }
    }
}
