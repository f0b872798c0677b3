import ArgumentParser
import TidemarkCore

struct ValidateCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "validate",
        abstract: "Check the manifests and FCM's limits; prints file:line:col diagnostics.",
        discussion:
            "Reads every *.yaml file in the manifests directory, the inventory and token files they name, and reports every problem at once. Exit 1 when there is an error."
    )

    @OptionGroup var global: GlobalOptions

    func run() async throws {
        try await runReportingErrors {
            let workspace = try Workspace(global)
            let loaded = await workspace.loadManifests()
            try reportDiagnostics(loaded.diagnostics)
            let members = loaded.desired.topics.reduce(0) { $0 + $1.members.count }
            Terminal.out(
                "The manifests are valid: \(loaded.manifests.files.count) file(s), \(loaded.desired.topics.count) topics, \(loaded.desired.groups.count) device groups, \(PlanRenderer.formatCount(loaded.inventory.count)) devices, \(PlanRenderer.formatCount(members)) declared memberships.\n"
            )
        }
    }
}
