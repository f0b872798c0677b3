import ArgumentParser
import Foundation
import TidemarkCore
import TidemarkRuntime

/// `tidemark workspace …`: the workspaces one state file or database holds.
struct WorkspaceCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "workspace",
        abstract: "The workspaces of the state's file or database: one per project and environment.",
        subcommands: [WorkspaceListCommand.self, WorkspaceDeleteCommand.self]
    )
}

struct WorkspaceListCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "list",
        abstract: "List the workspaces of the state: serial, last apply, lock holder and size.",
        discussion: """
            Reads the state named by --state, TIDEMARK_STATE_URL or 'state' in tidemark.yaml (a SQLite \
            file or a PostgreSQL database) and lists every workspace it holds, the current one marked \
            with '*'. Reads state only; takes no lock.
            """
    )

    @OptionGroup var global: GlobalOptions

    @OptionGroup var output: DataFormatOption

    func run() async throws {
        try await runReportingErrors {
            let runtime = try Runtime(global)
            let summaries = try await runtime.workspaceSummaries()
            if output.json {
                struct Output: Encodable {
                    var state: String
                    var workspaces: [WorkspaceSummary]
                }
                try Terminal.writeJSON(Output(state: runtime.stateDisplay, workspaces: summaries))
                return
            }
            guard !summaries.isEmpty else {
                try Terminal.write(
                    "No workspace in \(runtime.stateDisplay) yet; 'tidemark apply' or 'tidemark import' makes one.\n")
                return
            }
            let now = Int64(Date().timeIntervalSince1970)
            var rows = [["", "WORKSPACE", "SERIAL", "TOKENS", "TOPICS", "GROUPS", "MEMBERSHIPS", "LAST APPLY", "LOCK"]]
            for summary in summaries {
                let last = summary.lastApply.map {
                    "\($0.status.rawValue), \(PlanRenderer.formatAge(now - $0.startedAt)) ago"
                }
                let groups =
                    summary.audiences > 0 ? "\(summary.groups) (+\(summary.audiences) audiences)" : "\(summary.groups)"
                rows.append([
                    summary.current ? "*" : "", summary.name, "\(summary.serial)",
                    PlanRenderer.formatCount(summary.tokens),
                    "\(summary.topics)", groups, PlanRenderer.formatCount(summary.memberships), last ?? "never",
                    summary.lockHolder.map { "\($0.operation) (pid \($0.pid) on \($0.host))" } ?? "free",
                ])
            }
            let widths = rows[0].indices.map { column in rows.map { $0[column].count }.max() ?? 0 }
            let lines = rows.map { row in
                row.enumerated().map { column, cell in
                    column == row.count - 1 ? cell : cell.padding(toLength: widths[column], withPad: " ", startingAt: 0)
                }.joined(separator: "  ")
            }
            try Terminal.write("Workspaces in \(runtime.stateDisplay):\n" + lines.joined(separator: "\n") + "\n")
        }
    }
}

struct WorkspaceDeleteCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "delete",
        abstract: "Delete a workspace from the state: its state, journal and history. Sends nothing to FCM.",
        discussion: """
            Takes the workspace's lock, then deletes everything tidemark keeps for it in the state's file \
            or database; other workspaces stay as they are. Refused while the workspace manages any \
            membership: FCM would keep them with nothing left to clean them up. Remove them from its \
            manifests and apply first, or pass --force to forget them (FCM keeps them as they are).
            """
    )

    @OptionGroup var global: GlobalOptions

    @Argument(help: ArgumentHelp("The workspace to delete.", valueName: "WORKSPACE"))
    var workspace: String

    @Flag(help: "Delete a workspace that still manages memberships (they stay in FCM, unmanaged).")
    var force = false

    func run() async throws {
        try await runReportingErrors {
            let runtime = try Runtime(global)
            let deleted = try await runtime.deleteWorkspace(workspace, force: force)
            var line =
                "Deleted workspace '\(deleted.name)' from \(runtime.stateDisplay): its state (serial \(deleted.serial), \(PlanRenderer.counted(deleted.tokens, "token"))), journal and history. Nothing was sent to FCM"
            if deleted.memberships > 0 {
                line +=
                    "; the \(PlanRenderer.counted(deleted.memberships, "membership")) it managed stay in FCM, unmanaged"
            }
            try Terminal.write(line + ".\n")
        }
    }
}
