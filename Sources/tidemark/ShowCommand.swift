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
            try workspace.output(plan, format: render.format, inventory: inventory, partsDir: render.partsDir,
                planFile: planFile)
        }
    }
}

/// Reads and checks a saved plan file.
func readPlan(_ path: String) throws -> Plan {
    guard let data = FileManager.default.contents(atPath: path) else {
        throw CLIError("cannot read the plan file \(path); check the path.")
    }
    struct Header: Decodable { var formatVersion: Int? }
    let header = try? Plan.decoder().decode(Header.self, from: data)
    guard let version = header?.formatVersion else {
        throw CLIError("\(path) is not a tidemark plan file (no format_version); make one with 'tidemark plan --out \(path)'.")
    }
    guard version <= Plan.currentFormatVersion else {
        throw CLIError("\(path) has plan format \(version); this tidemark reads up to \(Plan.currentFormatVersion). Upgrade tidemark.")
    }
    let plan: Plan
    do {
        plan = try Plan.decoder().decode(Plan.self, from: data)
    } catch {
        throw CLIError("\(path) is not a valid tidemark plan: \(error).")
    }
    do {
        _ = try plan.selection
    } catch {
        throw CLIError("\(path) has an invalid target selection: \(error.description)")
    }
    return plan
}
