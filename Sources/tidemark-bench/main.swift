import Foundation
import TidemarkCore
import TidemarkStore

// Generates a large synthetic project for the scale benchmark (scripts/bench-plan.sh):
// an inventory of N devices, 200 topics selecting ~5 memberships per device, and a state file
// as a previous apply would have left it, differing from the manifests by a churn fraction.
//
// usage: tidemark-bench generate DIR [--devices N] [--churn FRACTION] [--seed S]

struct Generator {
    var devices = 1_000_000
    var churn = 0.01
    var seed: UInt64 = 7

    static let regions = (0..<20).map { "r\($0)" }
    static let teams = (0..<100).map { "team\($0)" }
    static let languages = ["en", "de", "fr", "es", "it", "nl", "pl", "pt", "sv", "ja"]
    static let cohorts = (0..<35).map { "c\($0)" }

    func run(_ directory: String) async throws {
        var rng = SeededGenerator(seed: seed)
        let fm = FileManager.default
        try fm.createDirectory(atPath: directory + "/manifests", withIntermediateDirectories: true)
        let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)
        var csv = Data("device_id,token,region,team,lang,cohort,platform\n".utf8)
        csv.reserveCapacity(devices * 200)
        for i in 0..<devices {
            var line = [UInt8]("d\(i),".utf8)
            for _ in 0..<11 { line.append(alphabet[Int(rng.next() % 64)]) }
            line.append(contentsOf: Array(":APA91b".utf8))
            for _ in 0..<134 { line.append(alphabet[Int(rng.next() % 64)]) }
            let region = Self.regions[Int(rng.next() % 20)]
            let team = Self.teams[Int(rng.next() % 100)]
            let language = Self.languages[Int(rng.next() % 10)]
            let cohort = Self.cohorts[Int(rng.next() % 35)]
            let platform = ["android", "ios", "web"][Int(rng.next() % 3)]
            line.append(contentsOf: Array(",\(region),\(team),\(language),\(cohort),\(platform)\n".utf8))
            csv.append(contentsOf: line)
        }
        try csv.write(to: URL(fileURLWithPath: directory + "/manifests/devices.csv"))
        var yaml = "inventory:\n  files: [devices.csv]\ntopics:\n"
        for region in Self.regions {
            yaml += "  - name: alerts-\(region)\n    members: [{selector: {region: \(region)}}]\n"
        }
        for team in Self.teams { yaml += "  - name: scores-\(team)\n    members: [{selector: {team: \(team)}}]\n" }
        for language in Self.languages {
            yaml +=
                "  - name: news-\(language)\n    mode: authoritative\n    members: [{selector: {lang: \(language)}}]\n"
        }
        for (i, cohort) in Self.cohorts.enumerated() {
            let next = Self.cohorts[(i + 1) % Self.cohorts.count]
            yaml += "  - name: promo-\(cohort)-a\n    members: [{selector: {cohort: \(cohort)}}]\n"
            yaml +=
                "  - name: promo-\(cohort)-b\n    members: [{selector: {cohort: [\(cohort), \(next)], platform: {not: web}}}]\n"
        }
        try yaml.write(toFile: directory + "/manifests/topics.yaml", atomically: true, encoding: .utf8)

        // The state a previous apply left: the desired memberships, with `churn` of them different.
        let statePath = directory + "/.tidemark/state.db"
        try? fm.removeItem(atPath: statePath)
        let store = SQLiteStateStore(path: statePath)
        var state = State(lineage: Timing.live.uuid(), serial: 0)
        let files = PlainFiles(root: directory + "/manifests")
        let loaded = await state.interning { await ManifestLoader(files: files).load(into: &$0) }
        guard !loaded.diagnostics.hasErrors else { throw DiagnosticsError(loaded.diagnostics) }
        var memberships = 0
        var changed = 0
        for topic in loaded.desired.topics {
            var ids = topic.members.ids
            let flips = Int(Double(ids.count) * churn)
            for _ in 0..<flips / 2 where !ids.isEmpty { ids.remove(at: Int(rng.next() % UInt64(ids.count))) }
            for _ in 0..<(flips - flips / 2) { ids.append(UInt32(rng.next() % UInt64(state.tokens.count))) }
            let set = TokenSet(ids)
            changed += set.subtracting(topic.members).count + topic.members.subtracting(set).count
            memberships += set.count
            state.setTopic(topic.name, TopicState(mode: topic.mode, managed: set, observed: set))
        }
        var write = StateWrite()
        write.topics = Array(state.topics.keys)
        try await store.save(&state, write, at: Timing.live.unixTime())
        print(
            "generated \(devices) devices, \(loaded.desired.topics.count) topics, \(memberships) memberships in state, \(changed) differing from the manifests (\(String(format: "%.2f", Double(changed) * 100 / Double(max(1, memberships))))%)"
        )
    }
}

struct PlainFiles: FileSource {
    let root: String
    func read(_ path: String, atMost limit: Int, setting: String?) throws -> Data {
        try InputFile.read(root + "/" + path, atMost: limit, setting: setting)
    }
    func list(_ directory: String) throws -> [String] { try FileManager.default.contentsOfDirectory(atPath: root) }
}

var arguments = Array(CommandLine.arguments.dropFirst())
guard arguments.first == "generate", arguments.count >= 2 else {
    FileHandle.standardError.write(
        Data("usage: tidemark-bench generate DIR [--devices N] [--churn FRACTION] [--seed S]\n".utf8))
    exit(2)
}
var generator = Generator()
let directory = arguments[1]
var index = 2
while index + 1 < arguments.count {
    switch arguments[index] {
    case "--devices": generator.devices = Int(arguments[index + 1]) ?? generator.devices
    case "--churn": generator.churn = Double(arguments[index + 1]) ?? generator.churn
    case "--seed": generator.seed = UInt64(arguments[index + 1]) ?? generator.seed
    default: break
    }
    index += 2
}
do {
    try await generator.run(directory)
} catch {
    FileHandle.standardError.write(Data("error: \(error)\n".utf8))
    exit(1)
}
