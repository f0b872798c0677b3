import ArgumentParser
import Foundation
import TidemarkCore
import TidemarkRuntime

/// `tidemark groups`: device groups before FCM turns them down.
struct GroupsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "groups",
        abstract: "Device groups before FCM turns them down on 29 September 2027.",
        subcommands: [GroupsExportCommand.self]
    )
}

struct GroupsExportCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "export",
        abstract: "Read every managed group's tokens from FCM and write them to a file, for the app's own mapping.",
        discussion: """
            FCM turns device groups down on 29 September 2027 together with the call that lists a group's \
            tokens, and keeps no copy. This reads, for every group the manifests declare or state remembers \
            (and any NAME given), all its tokens through that call, including members tidemark did not add, \
            and writes them to FILE: NDJSON (group, notification_key, device_id, token) or, for a .csv name, \
            CSV with a header, readable only by you. State records them too (see 'tidemark state show \
            group:NAME'), so the mapping outlives FCM's. Nothing in FCM changes. Tokens and keys are redacted \
            on the terminal; the file and --format json carry them in full.
            """
    )

    @OptionGroup var global: GlobalOptions
    @OptionGroup var refreshing: RefreshOptions
    @OptionGroup var output: DataFormatOption

    @Argument(help: ArgumentHelp("More groups to export by notification_key_name.", valueName: "NAME"))
    var names: [String] = []

    @Option(
        help: ArgumentHelp(
            "Write one line per token to FILE: NDJSON, or CSV when FILE ends in .csv.", valueName: "FILE"))
    var out: String?

    func validate() throws {
        if out == nil, !output.json {
            throw ValidationError("give --out FILE (or --format json): the tokens are what the export is for.")
        }
    }

    func run() async throws {
        try await runReportingErrors {
            let runtime = try Runtime(global, readQPS: refreshing.readQps)
            let export = try await TerminalOutput.during { try await runtime.exportGroups(names, output: $0) }
            if let out {
                if FileManager.default.fileExists(atPath: out),
                    let first = FileManager.default.contents(atPath: out).map({
                        String(decoding: $0.prefix(200), as: UTF8.self)
                    }),
                    !(first.isEmpty || first.hasPrefix("group,notification_key,") || first.hasPrefix("{\"device_id\"")
                        || first.hasPrefix("{\"group\""))
                {
                    throw CLIError(
                        "\(out) exists and is not an earlier export; choose another file, such as groups.ndjson.")
                }
                try writeAtomically(export.file(csv: out.lowercased().hasSuffix(".csv")), to: out, mode: 0o600)
            }
            if output.json {
                try Terminal.writeJSON(export)
                return
            }
            var lines: [String] = []
            let show = { (text: String) in global.showTokens ? text : Redaction.redact(text) }
            let total = export.groups.reduce(0) { $0 + $1.members.count }
            lines.append(
                "Exported \(PlanRenderer.formatCount(total)) token\(total == 1 ? "" : "s") of \(export.groups.filter { $0.notificationKey != nil }.count) device group\(export.groups.count == 1 ? "" : "s")\(out.map { " to \($0)" } ?? "")\(export.serial.map { " and to state (serial \($0))" } ?? ""):"
            )
            for group in export.groups {
                guard let key = group.notificationKey else {
                    lines.append("  \(group.name): not found in FCM (nothing to export)")
                    continue
                }
                let foreign =
                    group.notAddedByTidemark == 0 ? "" : ", \(group.notAddedByTidemark) not added by tidemark"
                lines.append(
                    "  \(group.name): \(group.members.count) token\(group.members.count == 1 ? "" : "s")\(foreign) (key \(show(key)))"
                )
            }
            lines.append(
                "Load the file into the app's own group-to-token table and send to each token (sendEachForMulticast); docs/migrating.md says how."
            )
            try Terminal.write(lines.joined(separator: "\n") + "\n")
        }
    }
}
