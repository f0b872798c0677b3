import ArgumentParser
import Foundation
import TidemarkCore
import TidemarkRuntime

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
            let runtime = try Runtime(global)
            let opened = try runtime.readSavedPlan(planFile, requireWhole: false)
            if let why = opened.closedBecause {
                Terminal.err("Showing \(planFile) without its registration tokens: \(why).\n")
            }
            let plan = opened.plan
            // Device ids from the inventory when the manifests can be read; the plan shows without them otherwise.
            let loaded = render.format == .json ? nil : await runtime.loadManifests()
            let inventory = loaded.flatMap { $0.diagnostics.hasErrors ? nil : $0.inventory }
            try runtime.output(
                plan, format: render.format, inventory: inventory, partsDir: render.partsDir,
                planFile: planFile, tokensRedacted: !opened.whole)
        }
    }
}
