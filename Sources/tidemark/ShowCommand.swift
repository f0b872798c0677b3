import ArgumentParser
import Foundation
import TidemarkCore

struct ShowCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "show",
        abstract: "Render a saved plan file as text, markdown (pull-request comments) or JSON."
    )

    @OptionGroup var global: GlobalOptions

    @Argument(help: ArgumentHelp("A plan saved with 'tidemark plan --out FILE'.", valueName: "PLANFILE"))
    var planFile: String

    @OptionGroup var render: RenderOptions

    func run() async throws {
        try await runReportingErrors {
            let workspace = try Workspace(global)
            let plan = try readPlan(planFile)
            // Device ids from the inventory when the manifests can be read; the plan shows without them otherwise.
            let loaded = render.format == .json ? nil : await workspace.loadManifests()
            let inventory = loaded.flatMap { $0.diagnostics.hasErrors ? nil : $0.inventory }
            try workspace.output(
                plan, format: render.format, inventory: inventory, partsDir: render.partsDir,
                planFile: planFile)
        }
    }
}

/// Reads and checks a saved plan file.
func readPlan(_ path: String) throws -> Plan {
    guard let data = FileManager.default.contents(atPath: path) else {
        throw CLIError("cannot read the plan file \(path); check the path.")
    }
    do {
        return try Plan.decodeSaved(data, file: path)
    } catch {
        throw CLIError(error.description)
    }
}
