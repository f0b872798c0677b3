import ArgumentParser
import Foundation
import TidemarkCore

struct AudienceCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "audience",
        abstract: "Say which devices a message to an FCM topic condition would reach.",
        discussion: """
            Parses CONDITION as FCM does (quoted topics with 'in topics', !, &&, ||, parentheses, at \
            most five topics) and evaluates it over the memberships the manifests declare (--from \
            desired, the default) or those tidemark last observed (--from observed; add --refresh to \
            read the backend first). Prints how many devices it reaches and which, tokens redacted. \
            Example: tidemark audience "'scores-breaking' in topics && !('ops-canary' in topics)"
            """
    )

    @OptionGroup var global: GlobalOptions

    @Argument(
        help: ArgumentHelp(
            "An FCM condition, e.g. \"'a' in topics && ('b' in topics || 'c' in topics)\".",
            valueName: "CONDITION"))
    var condition: String

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
            let parsed: FCMCondition
            do {
                parsed = try FCMCondition.parse(condition)
            } catch let error as ConditionError {
                let shown =
                    condition.count > 200 ? condition.prefix(200) + "… (\(condition.utf8.count) bytes)" : condition
                throw CLIError("\(error.description) The condition was: \(shown)")
            }
            let workspace = try Workspace(global)
            let source = Audience.Source(rawValue: from)!
            let workflow = AudienceWorkflow(
                manifests: workspace.manifestSource(), store: workspace.stateStore(),
                output: TerminalOutput())
            let (audience, loaded) =
                refresh
                ? try await workspace.withBackend { backend in
                    try await workflow.run(parsed, source: source, refreshFrom: backend)
                }
                : try await workflow.run(parsed, source: source)
            if output.json {
                struct Output: Encodable {
                    var condition: String
                    var evaluatedAs: String
                    var from: String
                    var count: Int
                    var unknownTopics: [String]
                    var devices: [Device]
                    struct Device: Encodable {
                        var token: String
                        var device: String?
                    }
                }
                let devices = audience.tokens.map { token in
                    Output.Device(
                        token: token,
                        device: loaded.inventory.index(ofToken: token).map { loaded.inventory.deviceIDs[$0] })
                }
                try Terminal.writeJSON(
                    Output(
                        condition: condition, evaluatedAs: parsed.description,
                        from: source.rawValue, count: audience.tokens.count, unknownTopics: audience.unknownTopics,
                        devices: devices))
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
                : refresh ? "as just read from \(workspace.backendKind)" : "as tidemark last observed them (no refresh)"
            var lines = [
                "The condition reaches \(PlanRenderer.formatCount(count)) device\(count == 1 ? "" : "s") \(basis).",
                "Evaluated as: \(parsed)",
            ]
            if let platforms = breakdown(audience.tokens, loaded.inventory) {
                lines.append("By platform: \(platforms)")
            }
            let namer = workspace.deviceNamer(loaded.inventory)
            for token in audience.tokens.prefix(limit) {
                let shown = global.showTokens ? token : Redaction.redact(token)
                lines.append("  \(shown)\(namer(token).map { " (\($0))" } ?? "")")
            }
            if count > limit, limit > 0 {
                lines.append("  … and \(PlanRenderer.formatCount(count - limit)) more (--format json lists all)")
            }
            try Terminal.write(lines.joined(separator: "\n") + "\n")
        }
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
