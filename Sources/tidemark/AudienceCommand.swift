import ArgumentParser
import Foundation
import TidemarkCore
import TidemarkRuntime

struct AudienceCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "audience",
        abstract: "Say which devices a message to an FCM topic condition, or a named audience, would reach.",
        discussion: """
            Parses CONDITION as FCM does (quoted topics with 'in topics', !, &&, ||, parentheses, at \
            most five topics) and evaluates it over the memberships the manifests declare (--from \
            desired, the default) or those tidemark last observed (--from observed; add --refresh to \
            read the backend first). Prints how many devices it reaches and which, tokens redacted. \
            Example: tidemark audience "'scores-breaking' in topics && !('ops-canary' in topics)"

            --name NAME lists an audience (manifests' 'audiences:') or device group instead: its members \
            as declared (--from desired) or as state holds them after the last apply (--from observed). \
            With --format json this is the token list an app sends to one by one (sendEachForMulticast, \
            500 tokens a call) once device groups are gone.
            """
    )

    @OptionGroup var global: GlobalOptions

    @Argument(
        help: ArgumentHelp(
            "An FCM condition, e.g. \"'a' in topics && ('b' in topics || 'c' in topics)\".",
            valueName: "CONDITION"))
    var condition: String?

    @Option(
        help: ArgumentHelp(
            "List the members of this audience (or device group) instead of evaluating a condition.",
            valueName: "NAME"))
    var name: String?

    @Option(
        help: ArgumentHelp(
            "Judge from the manifests (desired) or from the memberships last observed (observed).",
            valueName: "SOURCE"))
    var from: String = "desired"

    @Flag(help: "With --from observed: read the backend first, instead of using what state last saw.")
    var refresh = false

    @Option(help: "Devices to list in text output (0 lists none).")
    var limit = 20

    @OptionGroup var output: DataFormatOption

    func validate() throws {
        if (condition == nil) == (name == nil) {
            throw ValidationError("give a CONDITION or --name NAME (one of them).")
        }
        if name != nil, refresh {
            throw ValidationError("--refresh reads topics from the backend; an audience lives in state.")
        }
        guard Audience.Source(rawValue: from) != nil else {
            throw ValidationError("--from must be desired or observed, not '\(from)'.")
        }
        if refresh, from != "observed" {
            throw ValidationError("--refresh reads the backend; it needs --from observed.")
        }
        if limit < 0 { throw ValidationError("--limit must be 0 or more.") }
    }

    func run() async throws {
        try await runReportingErrors {
            if let name {
                try await listNamed(name)
                return
            }
            let condition = condition!
            let parsed: FCMCondition
            do {
                parsed = try FCMCondition.parse(condition)
            } catch let error as ConditionError {
                let shown =
                    condition.count > 200 ? condition.prefix(200) + "… (\(condition.utf8.count) bytes)" : condition
                throw CLIError("\(error.description) The condition was: \(shown)")
            }
            let runtime = try Runtime(global)
            let source = Audience.Source(rawValue: from)!
            let (audience, loaded) = try await TerminalOutput.during {
                try await runtime.audience(parsed, source: source, refresh: refresh, output: $0)
            }
            if output.json {
                struct Output: Encodable {
                    var condition: String
                    var evaluatedAs: String
                    var from: String
                    var count: Int
                    var unknownTopics: [String]
                    var devices: [ListedDevice]
                }
                try Terminal.writeJSON(
                    Output(
                        condition: condition, evaluatedAs: parsed.description,
                        from: source.rawValue, count: audience.tokens.count, unknownTopics: audience.unknownTopics,
                        devices: Self.listed(audience.tokens, loaded.inventory)))
                return
            }
            for topic in audience.unknownTopics {
                let where_ = source == .desired ? "the manifests declare no topic" : "state has never observed topic"
                Terminal.err("warning: \(where_) '\(topic)'; it counts as having no subscribers.")
            }
            let count = audience.tokens.count
            let basis =
                source == .desired
                ? "as the manifests declare them"
                : refresh ? "as just read from \(runtime.backendKind)" : "as tidemark last observed them (no refresh)"
            var lines = [
                "The condition reaches \(PlanRenderer.formatCount(count)) device\(count == 1 ? "" : "s") \(basis).",
                "Evaluated as: \(parsed)",
            ]
            lines += deviceLines(audience.tokens, loaded.inventory, runtime)
            try Terminal.write(lines.joined(separator: "\n") + "\n")
        }
    }

    /// `--name`: an audience's or group's members.
    private func listNamed(_ name: String) async throws {
        let runtime = try Runtime(global)
        let source = Audience.Source(rawValue: from)!
        let found = try await TerminalOutput.during {
            try await runtime.namedAudience(name, source: source, output: $0)
        }
        let kind = found.isAudience ? "audience" : "device group"
        if output.json {
            struct Output: Encodable {
                var name: String
                var kind: String
                var from: String
                var count: Int
                var devices: [ListedDevice]
            }
            let devices = Self.listed(found.tokens, found.inventory, state: found.state)
            try Terminal.writeJSON(
                Output(name: name, kind: kind, from: source.rawValue, count: devices.count, devices: devices))
            return
        }
        let count = found.tokens.count
        let basis = source == .desired ? "as the manifests declare it" : "as state holds it after the last apply"
        var lines = [
            "The \(kind) '\(name)' has \(PlanRenderer.formatCount(count)) device\(count == 1 ? "" : "s") \(basis)."
        ]
        lines += deviceLines(found.tokens, found.inventory, runtime)
        try Terminal.write(lines.joined(separator: "\n") + "\n")
    }

    /// A device of `--format json`: its token in full, and its id when known.
    struct ListedDevice: Encodable {
        var token: String
        var device: String?
    }

    /// The devices of `tokens`, ids from the inventory, else from what state remembers.
    static func listed(_ tokens: [String], _ inventory: Inventory, state: State? = nil) -> [ListedDevice] {
        tokens.map { token in
            ListedDevice(
                token: token,
                device: inventory.index(ofToken: token).map { inventory.deviceIDs[$0] }
                    ?? state.flatMap { s in s.tokens.id(token).flatMap { s.deviceID(of: $0) } })
        }
    }

    /// The platform breakdown and the first `limit` devices, redacted unless asked, for text output.
    private func deviceLines(_ tokens: [String], _ inventory: Inventory, _ runtime: Runtime) -> [String] {
        var lines: [String] = []
        if let platforms = breakdown(tokens, inventory) { lines.append("By platform: \(platforms)") }
        let namer = runtime.deviceNamer(inventory)
        for token in tokens.prefix(limit) {
            let shown = global.showTokens ? token : Redaction.redact(token)
            lines.append("  \(shown)\(namer(token).map { " (\($0))" } ?? "")")
        }
        if tokens.count > limit, limit > 0 {
            lines.append("  … and \(PlanRenderer.formatCount(tokens.count - limit)) more (--format json lists all)")
        }
        return lines
    }

    /// "android 812, ios 402, (none) 3" when the inventory has a platform label.
    private func breakdown(_ tokens: [String], _ inventory: Inventory) -> String? {
        guard inventory.labelKeys.contains("platform") else { return nil }
        var counts: [String: Int] = [:]
        for token in tokens {
            let platform =
                inventory.index(ofToken: token).flatMap { inventory.label("platform", ofDevice: $0) } ?? "(none)"
            counts[platform, default: 0] += 1
        }
        guard !counts.isEmpty else { return nil }
        return counts.sorted { ($0.value, $1.key) > ($1.value, $0.key) }.map {
            "\($0.key) \(PlanRenderer.formatCount($0.value))"
        }
        .joined(separator: ", ")
    }
}
