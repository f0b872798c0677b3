import ArgumentParser
import Foundation
import TidemarkCore

struct PlanCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "plan",
        abstract: "Show what must change in FCM to match the manifests.",
        discussion: """
            Refreshes what FCM holds for every known token (unless --no-refresh), diffs it against the \
            manifests and prints the plan: the verdict first, destructive changes called out, tokens redacted. \
            With --out the plan is saved as JSON for 'tidemark apply FILE'. Nothing is changed.
            """
    )

    @OptionGroup var global: GlobalOptions

    @Option(name: .long, help: ArgumentHelp("Save the plan as JSON, to apply exactly with 'tidemark apply FILE'.", valueName: "FILE"))
    var out: String?

    @Option(help: "Output format: text or json (json carries full tokens).")
    var format: OutputFormat = .text

    @Flag(help: "Exit 2 when the plan has changes, 0 when it has none, 1 on error.")
    var detailedExitcode = false

    @Flag(help: "Plan from state alone, without reading FCM (fast; for pull requests).")
    var noRefresh = false

    func run() async throws {
        try await runReportingErrors {
            let workspace = try Workspace(global)
            let store = try workspace.openStore(create: false)
            let result = try await workspace.withBackend { backend in
                try await workspace.makePlan(store: store, backend: backend, refresh: !noRefresh)
            }
            if let out {
                var data = try Plan.encoder().encode(result.plan)
                data.append(UInt8(ascii: "\n"))
                try writeAtomically(data, to: out, mode: 0o600)
            }
            try workspace.output(result.plan, format: format, inventory: result.loaded.inventory)
            if let out, format == .text {
                Terminal.out("Saved the plan to \(out); apply it exactly with: tidemark apply \(out)\n")
            }
            if detailedExitcode, result.plan.hasChanges { throw ExitCode(2) }
        }
    }
}
