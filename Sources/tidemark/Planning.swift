import Foundation
import TidemarkCore
import TidemarkStore

/// What a plan was made from, kept together so `apply` can carry it out.
struct PlanningResult {
    var state: State
    var loaded: LoadedManifests
    var plan: Plan
}

extension Workspace {
    /// Loads state and manifests, refreshes unless told not to, and diffs. Stops with exit 1 on errors.
    func makePlan(store: SQLiteStateStore?, backend: any Backend, refresh: Bool, targets: Targets = .all,
        maxUnsubscribes: UnsubscribeLimit? = nil) async throws -> PlanningResult
    {
        let (state, loaded) = try await loadStateAndManifests(store)
        try reportDiagnostics(loaded.diagnostics.filter { $0.severity == .error })
        let observed = refresh ? try await self.refresh(state: state, loaded: loaded, backend: backend) : nil
        let plan = Planner(tidemarkVersion: Workspace.version).plan(loaded: loaded, state: state, refresh: observed,
            backend: backend.identity, now: Date(), targets: targets, maxUnsubscribes: maxUnsubscribes)
        return PlanningResult(state: state, loaded: loaded, plan: plan)
    }

    /// Reads every known token and group from the backend, with progress on long reads.
    func refresh(state: State, loaded: LoadedManifests, backend: any Backend) async throws -> RefreshResult {
        let progress = ProgressReporter(label: "Refreshing")
        let groups = Set(loaded.desired.groups.map(\.name)).union(state.groups.keys).sorted()
        let report: @Sendable (Int, Int) -> Void = { done, total in
            progress.update(done: done, total: total, unit: "tokens")
        }
        let all = TokenSet(sorted: Array(0..<UInt32(state.tokens.count)))
        let large = state.tokens.count >= 20_000
        let started = ContinuousClock.now
        let observed = try await Refresher(backend: backend).refresh(all, table: state.tokens, groups: groups,
            at: Int64(Date().timeIntervalSince1970), progress: large ? report : nil)
        if large {
            let elapsed = ContinuousClock.now - started
            let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) * 1e-18
            Terminal.err("Refreshed \(PlanRenderer.formatCount(all.count)) registrations in \(String(format: "%.1f", seconds)) s (\(PlanRenderer.formatCount(Int(Double(all.count) / max(seconds, 0.001))))/s).")
        }
        return observed
    }

    /// Renders `plan` in `format` on standard output; a failed write is an error, never a silent success.
    /// `planFile` is named in markdown as where the full plan is.
    func output(_ plan: Plan, format: OutputFormat, inventory: Inventory?, partsDir: String? = nil,
        planFile: String? = nil) throws
    {
        switch format {
        case .text:
            try Terminal.write(renderer(inventory).render(plan))
        case .markdown:
            let markdown = MarkdownPlanRenderer(showTokens: options.showTokens,
                fullPlanHint: planFile.map { "`\($0)` (`tidemark show \($0) --format json`)" },
                deviceName: deviceNamer(inventory))
            try writeMarkdown(markdown.render(plan), partsDir: partsDir)
        case .json:
            try Terminal.writeJSON(plan)
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
                try writeAtomically(Data(part.utf8), to: (partsDir as NSString).appendingPathComponent("part-\(index + 1).md"))
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
