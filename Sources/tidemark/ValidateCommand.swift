import ArgumentParser
import TidemarkCore
import TidemarkRuntime

struct ValidateCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "validate",
        abstract: "Check the manifests and FCM's limits; prints file:line:col diagnostics.",
        discussion:
            "Reads every *.yaml file in the manifests directory, the inventory and token files they name, and reports every problem at once. Exit 1 when there is an error. With --format json, one document: whether the manifests are valid, what they declare, and every diagnostic with its file, line and column."
    )

    @OptionGroup var global: GlobalOptions
    @OptionGroup var output: DataFormatOption

    struct Report: Encodable {
        var valid: Bool
        var files: Int
        var topics: Int
        var groups: Int
        var devices: Int
        var memberships: Int
        var diagnostics: [Diagnostic]
    }

    func run() async throws {
        try await runReportingErrors {
            let runtime = try Runtime(global)
            var loaded = await runtime.loadManifests()
            // FCM's deadlines for device groups and the iid transport, said once.
            loaded.diagnostics += runtime.deadlines.diagnostics(groups: loaded.desired.groups.count, full: true)
            let members = loaded.desired.topics.reduce(0) { $0 + $1.members.count }
            if output.json {
                let valid = loaded.diagnostics.errorCount == 0
                try Terminal.writeJSON(
                    Report(
                        valid: valid, files: loaded.manifests.files.count, topics: loaded.desired.topics.count,
                        groups: loaded.desired.groups.count, devices: loaded.inventory.count, memberships: members,
                        diagnostics: loaded.diagnostics))
                if !valid { throw ExitCode.failure }
                return
            }
            try reportDiagnostics(loaded.diagnostics)
            Terminal.out(
                "The manifests are valid: \(PlanRenderer.counted(loaded.manifests.files.count, "file")), \(PlanRenderer.counted(loaded.desired.topics.count, "topic")), \(PlanRenderer.counted(loaded.desired.groups.count, "device group")), \(loaded.desired.audiences.isEmpty ? "" : "\(PlanRenderer.counted(loaded.desired.audiences.count, "audience")), ")\(PlanRenderer.counted(loaded.inventory.count, "device")), \(PlanRenderer.counted(members, "declared membership", plural: "declared memberships")).\n"
            )
        }
    }
}
