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
}
