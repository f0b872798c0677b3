import ArgumentParser
import Foundation
import TidemarkCore
import TidemarkRuntime

struct PlanCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "plan",
        abstract: "Show what must change in FCM to match the manifests.",
        discussion: """
            Reads what FCM holds for the registrations the plan would change and a slice of the rest \
            (--refresh: touched, sample, all or none), diffs it against the manifests and state, and prints \
            the plan, saying how much of the fleet it read: the verdict first, destructive changes called out, tokens redacted. \
            With --out the plan is saved as JSON for 'tidemark apply FILE'. Nothing is changed.
            """
    )

    @OptionGroup var global: GlobalOptions
    @OptionGroup var refreshing: RefreshOptions
    @OptionGroup var reading: RefreshModeOptions
    @OptionGroup var planning: PlanningOptions
    @OptionGroup var render: RenderOptions
    @OptionGroup var drift: DriftOnlyOption

    @Option(
        name: .long,
        help: ArgumentHelp(
            "Save the plan as JSON, to apply exactly with 'tidemark apply FILE'; with TIDEMARK_PLAN_KEY set, its registration tokens are sealed (AES-256-GCM).",
            valueName: "FILE"))
    var out: String?

    @Flag(help: "Exit 2 when the plan has changes, 0 when it has none, 1 on error.")
    var detailedExitcode = false

    func validate() throws {
        // A saved plan is checked against the manifests when applied; a drift-only plan is a preview.
        try drift.check(
            reading: reading,
            conflicts: [(out != nil, "--out (preview it here, apply it with 'tidemark apply --drift-only')")])
    }

    func run() async throws {
        try await Interruption.endingAtOnce("plan sends nothing to FCM and writes no state, so nothing was changed.") {
            try await plan()
        }
    }

    private func plan() async throws {
        try await runReportingErrors {
            let runtime = try Runtime(global, readQPS: refreshing.readQps)
            try await runtime.traced { try await plan(runtime) }
        }
    }

    private func plan(_ runtime: Runtime) async throws {
        if let out { try Self.checkOverwritable(out) }
        let key = out == nil ? nil : try runtime.planKey()
        var request = runtime.planRequest(
            try planning.flags(reading), targets: try planning.selection.targets(), driftOnly: drift.driftOnly)
        request.allowShrink = planning.allowShrink
        request.skipHeld = planning.skipHeld
        let outcome = try await TerminalOutput.during {
            try await runtime.plan(request, output: $0, acceptDead: refreshing.acceptDead)
        }
        let plan = outcome.plan
        PhaseTrace.mark("plan made")
        let refused = plan.diagnostics.hasErrors
        if let out, !refused {
            if let key {
                try writeAtomically(SealedPlan.seal(plan.summarized(), key: key), to: out, mode: 0o600)
            } else {
                try writeAtomically(jsonFile(plan.summarized()), to: out, mode: 0o600)
                if plan.hasChanges || !plan.observations.isEmpty {
                    Terminal.err(
                        "warning: \(out) holds registration tokens in the clear (anyone who can read the file can message those devices); set \(PlanKey.variable) to base64 of 32 random bytes ('openssl rand -base64 32', kept as a CI secret) to seal saved plans, as the CI recipes do.\n"
                    )
                }
            }
            PhaseTrace.mark("plan saved")
        }
        try runtime.output(
            plan, format: render.format, inventory: outcome.loaded.inventory,
            partsDir: render.partsDir, planFile: refused ? nil : out)
        if refused {
            let errors = plan.diagnostics.filter { $0.severity == .error }.count
            Terminal.err(
                "\(errors) error\(errors == 1 ? "" : "s") in the plan; it cannot be applied\(out != nil ? " and was not saved" : "")."
            )
        } else if let out, render.format == .text {
            try Terminal.write("Saved the plan to \(out); apply it exactly with: tidemark apply \(out)\n")
        }
        PhaseTrace.mark("plan shown")
        endProcess(keeping: outcome, with: outcome.exitStatus(detailedExitcode: detailedExitcode))
    }

    /// `--out` replaces an older plan, never a manifest or any other file.
    static func checkOverwritable(_ path: String) throws {
        guard FileManager.default.fileExists(atPath: path) else { return }
        guard let data = FileManager.default.contents(atPath: path),
            SealedPlan.isSealed(data) || (try? Plan.decodeSaved(data, file: path)) != nil
        else {
            throw CLIError(
                "\(path) exists and is not a tidemark plan; --out replaces only an older plan. Choose another file, such as plan.json."
            )
        }
    }
}
