import Foundation
import TidemarkCore
import TidemarkRuntime

extension RuntimeFlags {
    /// The flags of a command's global options and, for the commands that take them, its rates.
    init(_ options: GlobalOptions, qps: Double? = nil, qpsUnit: QuotaUnit? = nil, readQPS: Double? = nil) {
        self.init(options.project)
        backend = options.backend
        transport = options.transport
        state = options.state
        workspace = options.workspace
        showTokens = options.showTokens
        self.qps = qps
        self.qpsUnit = qpsUnit
        self.readQPS = readQPS
    }
}

/// The CLI's side of the runtime: flags in, terminal output out. Everything else (settings, stores,
/// sources, backends) is the runtime's.
extension Runtime {
    /// The runtime for a command's global options and, for the commands that take them, its rates.
    init(_ options: GlobalOptions, qps: Double? = nil, qpsUnit: QuotaUnit? = nil, readQPS: Double? = nil) throws {
        self = try Runtime.load(RuntimeFlags(options, qps: qps, qpsUnit: qpsUnit, readQPS: readQPS))
        if let transport = options.transport, !backendKind.isHTTP {
            Terminal.err(
                "warning: --transport \(transport.rawValue) has no effect on the \(backendKind.rawValue) backend, which keeps memberships in-process without a topic API; it chooses the API of --backend emulator and fcm."
            )
        }
    }

    /// The runtime of a command that reads only the project's files (`fmt`).
    init(_ options: ProjectOptions) throws {
        self = try Runtime.load(RuntimeFlags(options))
    }

    /// Reports the dead devices `outcome` found as serve does (`reportDeadTokens`: to `file` and to
    /// each source's `on_dead` hook), saying what was done (on stderr when stdout carries a JSON
    /// document); fails, after every hook was tried, when one failed, so CI sees it. Nothing is said
    /// when nothing is dead.
    func reportDead(of outcome: ApplyOutcome, to file: String?, json: Bool) async throws {
        let say: (String) -> Void = json ? { Terminal.err($0) } : { Terminal.out($0 + "\n") }
        let report: DeadTokenWriteBack.Report
        do {
            guard let reported = try await reportDeadTokens(of: outcome, to: file) else { return }
            report = reported
        } catch let error as DeadTokenWriteBack.FileError {
            throw CLIError("cannot write --dead-tokens \(error.path): \(error.detail).")
        }
        let dead = outcome.dead
        if let file {
            say("Dead tokens: \(PlanRenderer.counted(dead.count, "device")) of the inventory, written to \(file).")
        } else if !dead.isEmpty {
            say(
                "Dead tokens: \(PlanRenderer.counted(dead.count, "device")) of the inventory \(dead.count == 1 ? "has" : "have") a token FCM no longer knows; --dead-tokens FILE lists them."
            )
        }
        for (source, reported, changed) in report.reported {
            say(
                "Dead tokens: reported \(PlanRenderer.formatCount(reported)) to '\(source)' (on_dead)\(changed.map { "; \(PlanRenderer.counted($0, "row")) changed" } ?? "")."
            )
        }
        if !report.failures.isEmpty {
            throw CLIError(
                "the apply finished, but reporting dead tokens failed: \(report.failures.joined(separator: "; "))")
        }
    }

    func renderer(_ inventory: Inventory?, tokensRedacted: Bool = false) -> PlanRenderer {
        PlanRenderer(
            showTokens: showTokens, width: Terminal.width,
            deviceName: deviceNamer(inventory, tokensRedacted: tokensRedacted))
    }

    /// Names a token's device for human output, when the inventory knows it; `tokensRedacted`: the
    /// plan's tokens are redacted already (a sealed plan read without its key).
    func deviceNamer(_ inventory: Inventory?, tokensRedacted: Bool = false) -> @Sendable (String) -> String? {
        guard let inventory else { return { _ in nil } }
        return tokensRedacted ? inventory.redactedDeviceNamer : inventory.deviceNamer
    }

    /// Renders `plan` in `format` on standard output; a failed write is an error, never a silent success.
    /// `planFile` is named in markdown as where the full plan is.
    func output(
        _ plan: Plan, format: OutputFormat, inventory: Inventory?, partsDir: String? = nil,
        planFile: String? = nil, tokensRedacted: Bool = false
    ) throws {
        switch format {
        case .text:
            let text = renderer(inventory, tokensRedacted: tokensRedacted).render(plan)
            try Terminal.write(Terminal.colour ? Terminal.coloured(text) : text)
        case .markdown:
            var markdown = MarkdownPlanRenderer(
                showTokens: showTokens,
                fullPlanHint: planFile.map { "`\($0)` (`tidemark show \($0) --format json`)" },
                deviceName: deviceNamer(inventory, tokensRedacted: tokensRedacted))
            markdown.planFile = planFile
            markdown.context = planContext
            try writeMarkdown(markdown.render(plan), partsDir: partsDir)
        case .json:
            try Terminal.writeJSON(plan.summarized())
        }
    }

    /// Prints markdown parts separated by a marker line, and writes each to `partsDir` when given.
    func writeMarkdown(_ parts: [String], partsDir: String?) throws {
        if let partsDir {
            try FileManager.default.createDirectory(atPath: partsDir, withIntermediateDirectories: true)
            let stale = (try? FileManager.default.contentsOfDirectory(atPath: partsDir)) ?? []
            for name in stale where name.hasPrefix("part-") && name.hasSuffix(".md") {
                try FileManager.default.removeItem(atPath: (partsDir as NSString).appendingPathComponent(name))
            }
            for (index, part) in parts.enumerated() {
                try writeAtomically(
                    Data(part.utf8), to: (partsDir as NSString).appendingPathComponent("part-\(index + 1).md"))
            }
        }
        var text = ""
        for (index, part) in parts.enumerated() {
            if index > 0 { text += "\n<!-- tidemark: part \(index + 1) of \(parts.count) -->\n\n" }
            text += part
        }
        try Terminal.write(text)
    }
}

extension RuntimeFlags {
    /// The flags of `-C` and `--manifests`; the rest at their defaults.
    init(_ project: ProjectOptions) {
        self.init()
        directory = project.directory
        manifests = project.manifests
    }
}
