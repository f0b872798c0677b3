import Foundation
import Testing
import TidemarkTesting

@testable import TidemarkCore

/// A seeded fuzz target over every reader of user input: manifests, tidemark.yaml, CSV and JSON-lines
/// inventories, token files and saved plans. Each case is a valid input mutated at random (bytes
/// flipped, deleted, duplicated; hostile fragments inserted: CRLF, byte order marks, YAML tags,
/// anchors, nulls, huge numbers, control characters). A case fails on a crash (the test process
/// dies), on taking longer than its bound, or on a message that shows a Swift type, a decoding
/// error's text or a stack trace instead of words. Seed and count are fixed, so a failure repeats:
/// `TIDEMARK_FUZZ_SEED` and `TIDEMARK_FUZZ_CASES` change them.
@Suite struct FuzzTests {
    static let seed = ProcessInfo.processInfo.environment["TIDEMARK_FUZZ_SEED"].flatMap(UInt64.init) ?? 20_261_124
    static let cases = ProcessInfo.processInfo.environment["TIDEMARK_FUZZ_CASES"].flatMap(Int.init) ?? 1000
    /// Far above what any case takes (milliseconds alone; the whole suite's blocking CLI tests can
    /// starve this process for tens of seconds); a hang or a blow-up passes it.
    static let bound: Duration = .seconds(90)

    static let fragments: [String] = [
        "\r\n", "\u{FEFF}", "\u{0}", "\u{1B}[2J", "\u{202E}", "null", "~", "!!int ", "!!binary ", "!custom ", "&a ",
        "*a", "<<: *a", "{", "}", "[", "]", ",", ":", ": ", "- ", "\"", "'", "#", "\t", "\n", "\n  ", ".nan", "-.inf",
        "1e400", "-9223372036854775809", "99999999999999999999", "0x7f", "true", "?", "|", ">", "%YAML 1.1\n",
        "---\n", "...\n", String(repeating: "a", count: 5000), String(repeating: "[", count: 200), "ß", "😀",
        "\\u0000", "\"\"", ",,,,", "\u{FFFD}",
    ]

    /// Messages must be words: none of these may appear in one.
    static let dumps = [
        "DecodingError", "CodingKeys", "Swift.", "Optional(", "Error Domain", "NSCocoaErrorDomain", "dataCorrupted",
        "typeMismatch", "keyNotFound", "valueNotFound", "Fatal error", "0x0000",
    ]

    /// `text` with 1 to 8 random edits.
    static func mutate(_ text: String, _ random: inout SeededGenerator) -> String {
        var bytes = Array(text.utf8)
        for _ in 0..<Int.random(in: 1...8, using: &random) {
            let at = Int.random(in: 0...bytes.count, using: &random)
            switch Int.random(in: 0..<5, using: &random) {
            case 0 where at < bytes.count: bytes.remove(at: at)
            case 1 where at < bytes.count: bytes[at] = UInt8.random(in: 0...255, using: &random)
            case 2 where at < bytes.count:
                let end = min(bytes.count, at + Int.random(in: 1...40, using: &random))
                bytes.insert(contentsOf: bytes[at..<end], at: at)
            default:
                bytes.insert(contentsOf: Array(fragments.randomElement(using: &random)!.utf8), at: at)
            }
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    func check(
        _ what: String, _ index: Int, _ messages: [String], started: ContinuousClock.Instant,
        sourceLocation: Testing.SourceLocation = #_sourceLocation
    ) {
        let took = ContinuousClock.now - started
        #expect(
            took < Self.bound, "\(what) case \(index) (seed \(Self.seed)) took \(took)", sourceLocation: sourceLocation)
        for message in messages {
            for dump in Self.dumps where message.contains(dump) {
                Issue.record(
                    "\(what) case \(index) (seed \(Self.seed)): a message shows '\(dump)': \(message.prefix(300))",
                    sourceLocation: sourceLocation)
            }
        }
    }

    static let token = "aaaaaaaaaaa:APA91bAAAA"

    static let manifest = """
        inventory:
          devices:
            - id: d1
              token: "\(token)"
              labels: {platform: ios, region: north}
          files: [devices.csv]
        topics:
          - name: weather-north
            mode: authoritative
            description: Forecasts.
            members:
              - selector: {region: north, platform: {not: web}}
              - devices: [d1, d2]
              - file: testers.txt
          - name: all
            allow_empty: true
            members: []
        groups:
          - notification_key_name: pair
            members: [{devices: [d1, d2]}]
        audiences:
          - name: family
            members: [{devices: [d1]}]
        """

    static let csv =
        "device_id,token,platform,region,last_seen\nd2,bbbbbbbbbbb:APA91bBBBB,android,north,2026-05-01\n"
        + "d3,\"ccccccccccc:APA91bCCCC\",\"ios\",south,1777629600\n"

    @Test func manifestsAndTheirFiles() async {
        var random = SeededGenerator(seed: Self.seed)
        for index in 0..<Self.cases {
            var files = [
                "topics.yaml": Self.manifest, "devices.csv": Self.csv,
                "testers.txt": "# testers\n\(Self.token)\n",
            ]
            let target = ["topics.yaml", "topics.yaml", "devices.csv", "testers.txt"].randomElement(using: &random)!
            files[target] = Self.mutate(files[target]!, &random)
            let started = ContinuousClock.now
            var table = TokenTable()
            let loaded = await ManifestLoader(files: InMemoryFileSource(files)).load(into: &table)
            var messages = loaded.diagnostics.map(\.description)
            if case .failed(let problems) = ManifestFormatter().format(files["topics.yaml"]!, file: "topics.yaml") {
                messages += problems.map(\.description)
            }
            check("manifest (\(target))", index, messages, started: started)
        }
    }

    /// The detector itself: a raw decoding error, as Swift prints one, is caught.
    @Test func theDumpDetectorCatchesARawError() {
        let raw = String(describing: DecodingError.dataCorrupted(.init(codingPath: [], debugDescription: "bad")))
        #expect(Self.dumps.contains { raw.contains($0) }, "\(raw)")
    }

    @Test func projectSettings() {
        let settings = """
            project: my-project-1
            backend: emulator
            transport: iid
            qps: 1500
            read_qps: 300
            max_shrink: 20%
            dead_share: 10%
            limits: {manifest_bytes: 64MiB, devices: 2000000}
            refresh: sample
            refresh_budget: 5%
            inventory:
              - name: app-db
                postgres: {url_env: APP_DATABASE_URL, query: "select id, token from devices"}
                exclude_if: {last_seen_older_than: 270d}
                max_shrink: 30%
            """
        var random = SeededGenerator(seed: Self.seed &+ 1)
        for index in 0..<Self.cases {
            let text = Self.mutate(settings, &random)
            let started = ContinuousClock.now
            let (_, diagnostics) = ProjectSettings.decode(text, file: "tidemark.yaml")
            check("tidemark.yaml", index, diagnostics.map(\.description), started: started)
        }
    }

    @Test func inventories() {
        let jsonl = """
            {"id": "d1", "token": "\(Self.token)", "labels": {"platform": "ios", "n": 3}, "last_seen": "2026-05-01"}
            {"device_id": "d2", "token": "bbbbbbbbbbb:APA91bBBBB"}

            """
        let rule = ExclusionRule(maxAge: 270 * 86_400, text: "270d")
        var random = SeededGenerator(seed: Self.seed &+ 2)
        for index in 0..<Self.cases {
            let csv = Bool.random(using: &random)
            let text = Self.mutate(csv ? Self.csv : jsonl, &random)
            var data = Data(text.utf8)
            if Int.random(in: 0..<10, using: &random) == 0 { data = Gzip.compress(data) }
            let started = ContinuousClock.now
            var builder = InventoryBuilder(deviceLimit: 1000)
            let exclusion = Bool.random(using: &random) ? ExclusionFilter(rule, now: 1_790_000_000) : nil
            var messages: [String] = []
            do {
                if Gzip.isCompressed(data) { data = try Gzip.decompress(data, atMost: 1 << 20) }
                if csv {
                    FileInventorySource.loadCSV(data, file: "devices.csv", into: &builder, exclusion: exclusion)
                } else {
                    FileInventorySource.loadJSONLines(data, file: "devices.jsonl", into: &builder, exclusion: exclusion)
                }
            } catch {
                messages.append(ErrorText.describe(error))
            }
            messages += builder.allDiagnostics.map(\.description)
            check(csv ? "CSV inventory" : "JSON-lines inventory", index, messages, started: started)
        }
    }

    @Test func savedPlans() throws {
        var plan = StateStoreConformance.plan(
            [
                PlannedOperation(kind: .subscribe, target: "news", tokens: [Fixtures.token(0), Fixtures.token(1)]),
                PlannedOperation(kind: .unsubscribe, target: "sports", tokens: [Fixtures.token(2)]),
            ],
            state: StateStoreConformance.sample(tokens: 10))
        plan.operationsDigestWhenMade = plan.operationsDigest
        let valid = String(decoding: try Plan.encoder().encode(plan), as: UTF8.self)
        var random = SeededGenerator(seed: Self.seed &+ 3)
        for index in 0..<Self.cases {
            let text = Self.mutate(valid, &random)
            let started = ContinuousClock.now
            var messages: [String] = []
            do {
                let decoded = try Plan.decodeSaved(Data(text.utf8), file: "plan.json")
                // What decodes is rendered as `show` would: that must hold too.
                messages.append(PlanRenderer(showTokens: false).render(decoded))
            } catch {
                messages.append(ErrorText.describe(error))
            }
            check("saved plan", index, messages, started: started)
        }
    }

    // MARK: - Generators of the third hostile round (issue 53)

    /// Manifests built to flood: a topic repeated through one alias up to thousands of times, custom
    /// tags on keys, mappings, lists and values, and up to 5,000 invalid names. Each is refused in a
    /// bounded number of lines (each problem once, at most 20 of a kind), in bounded time.
    @Test func aliasFloodsTagsAndErrorFloods() async {
        var random = SeededGenerator(seed: Self.seed &+ 4)
        let tags = ["!custom", "!!int", "!!binary", "!evil", "!!python/object", "!<tag:example.com,2000:x>"]
        for index in 0..<max(20, Self.cases / 20) {
            var text = "inventory:\n  devices:\n    - {id: d1, token: \"\(Self.token)\", labels: {team: a}}\n"
            let kind = index % 3
            switch kind {
            case 0:
                let copies = Int.random(in: 2...3000, using: &random)
                text += "topics:\n  - &t {name: news, members: [{selector: {team: a}}]}\n"
                text += String(repeating: "  - *t\n", count: copies)
            case 1:
                let tag = tags.randomElement(using: &random)!
                let places = [
                    "topics:\n  - \(tag) {name: news, members: [{selector: {team: a}}]}\n",
                    "topics: \(tag)\n  - {name: news, members: [{selector: {team: a}}]}\n",
                    "topics:\n  - {\(tag) name: news, members: [{selector: {team: a}}]}\n",
                    "topics:\n  - {name: news, members: \(tag) [{selector: {team: a}}]}\n",
                    "topics:\n  - {name: news, allow_empty: \(tag) true, members: [{selector: {team: a}}]}\n",
                ]
                text += places.randomElement(using: &random)!
            default:
                let count = Int.random(in: 100...5000, using: &random)
                text += "topics:\n"
                for n in 0..<count { text += "  - {name: \"bad name \(n)\", members: [{selector: {team: a}}]}\n" }
            }
            let started = ContinuousClock.now
            var table = TokenTable()
            let loaded = await ManifestLoader(files: InMemoryFileSource(["topics.yaml": text])).load(into: &table)
            let shown = loaded.diagnostics.condensed()
            check("flood \(kind)", index, shown.map(\.description), started: started)
            #expect(loaded.diagnostics.hasErrors, "flood \(kind) case \(index) must be refused")
            #expect(shown.count <= 60, "flood \(kind) case \(index) prints \(shown.count) lines")
            if kind == 1 {
                #expect(shown.contains { $0.message.contains("carries the YAML tag") }, "\(shown)")
            }
        }
    }

    /// An inventory in another encoding or format (UTF-16 and UTF-32 with and without a byte order
    /// mark, gzip twice, a ZIP archive, zstd, binary, Latin-1) is refused in one line naming it.
    @Test func encodings() async {
        var random = SeededGenerator(seed: Self.seed &+ 5)
        let text = Self.csv
        let forms: [(String, Data, String)] = [
            ("UTF-16LE with BOM", Data([0xFF, 0xFE]) + text.data(using: .utf16LittleEndian)!, "UTF-16"),
            ("UTF-16BE with BOM", Data([0xFE, 0xFF]) + text.data(using: .utf16BigEndian)!, "UTF-16"),
            ("UTF-16LE", text.data(using: .utf16LittleEndian)!, "UTF-16"),
            ("UTF-32", Data([0xFF, 0xFE, 0, 0]) + text.data(using: .utf32LittleEndian)!, "UTF-32"),
            ("gzip twice", Gzip.compress(Gzip.compress(Data(text.utf8))), "compressed twice"),
            ("ZIP", Data([0x50, 0x4B, 0x03, 0x04]) + Data(text.utf8), "ZIP"),
            ("zstd", Data([0x28, 0xB5, 0x2F, 0xFD]) + Data(text.utf8), "zstd"),
            ("binary", Data(text.utf8) + Data([0, 1, 2, 0]), "binary"),
            ("Latin-1", text.replacingOccurrences(of: "north", with: "nörth").data(using: .isoLatin1)!, "UTF-8"),
        ]
        for index in 0..<max(20, Self.cases / 20) {
            let (name, data, says) = forms.randomElement(using: &random)!
            let file = Bool.random(using: &random) ? "devices.csv" : "devices.csv.gz"
            let bytes = file.hasSuffix(".gz") && !Gzip.isCompressed(data) ? Gzip.compress(data) : data
            let manifest =
                "inventory:\n  files: [\(file)]\ntopics:\n  - {name: news, members: [{selector: {region: north}}]}\n"
            let started = ContinuousClock.now
            var table = TokenTable()
            var source = InMemoryFileSource(["topics.yaml": manifest])
            source.files[file] = bytes
            let loaded = await ManifestLoader(files: source).load(into: &table)
            let messages = loaded.diagnostics.condensed().map(\.description)
            check("encoding \(name)", index, messages, started: started)
            #expect(
                messages.contains { $0.contains(file) && $0.contains(says) } && messages.count <= 3,
                "\(name) as \(file): \(messages)")
        }
    }

    /// Saved plans forged into shapes tidemark never writes (a batch past 1,000 tokens, a device-group
    /// call past 20 members, a name FCM refuses, a token that is none, a selector no name can match),
    /// with the digest recomputed as a careful forger would: each is refused before it is rendered.
    @Test func forgedPlanShapes() throws {
        var random = SeededGenerator(seed: Self.seed &+ 6)
        let base = StateStoreConformance.plan(
            [PlannedOperation(kind: .subscribe, target: "news", tokens: [Fixtures.token(0)])],
            state: StateStoreConformance.sample(tokens: 10))
        for index in 0..<max(20, Self.cases / 20) {
            var plan = base
            let kind = index % 6
            switch kind {
            case 0:
                let count = Int.random(in: 1001...5000, using: &random)
                plan.operations = [
                    PlannedOperation(kind: .subscribe, target: "news", tokens: (0..<count).map { Fixtures.token($0) })
                ]
            case 1:
                let count = Int.random(in: 21...200, using: &random)
                plan.operations = [
                    PlannedOperation(kind: .groupAdd, target: "pair", tokens: (0..<count).map { Fixtures.token($0) })
                ]
            case 2:
                let bad = ["news flash", "/topics/news", "news\u{0}", String(repeating: "n", count: 901), ""]
                plan.operations = [
                    PlannedOperation(
                        kind: .unsubscribe, target: bad.randomElement(using: &random)!, tokens: [Fixtures.token(1)])
                ]
            case 3:
                let junk = ["abc", "", "a b", "x\u{1B}[2J", String(repeating: "A", count: 5000), "user@example.com"]
                plan.operations = [
                    PlannedOperation(kind: .subscribe, target: "news", tokens: [junk.randomElement(using: &random)!])
                ]
            case 4:
                plan.targets = [
                    "topic:news\nevil", "topic:a b", "topic:" + String(repeating: "x", count: 2000), "group:\u{7}",
                ]
                .randomElement(using: &random).map { [$0] }!
            default:
                plan.operations = [PlannedOperation(kind: .subscribe, target: "news", tokens: [])]
            }
            plan.operationsDigestWhenMade = plan.operationsDigest
            let data = try Plan.encoder().encode(plan)
            let started = ContinuousClock.now
            var messages: [String] = []
            do {
                let decoded = try Plan.decodeSaved(data, file: "plan.json")
                Issue.record(
                    "forged plan \(kind) case \(index) was accepted: \(decoded.operations.first.map { "\($0.kind) \($0.tokens.count)" } ?? "")"
                )
            } catch {
                messages.append(ErrorText.describe(error))
            }
            check("forged plan \(kind)", index, messages, started: started)
            #expect(
                messages.allSatisfy { $0.contains("could have written") || $0.contains("selector") },
                "forged plan \(kind): \(messages)")
        }
    }
}
