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
    func makePlan(store: SQLiteStateStore?, backend: any Backend, refresh: Bool) async throws -> PlanningResult {
        let (state, loaded) = try await loadStateAndManifests(store)
        try reportDiagnostics(loaded.diagnostics.filter { $0.severity == .error })
        var observed: RefreshResult?
        if refresh {
            let progress = ProgressReporter(label: "Refreshing")
            let groups = Set(loaded.desired.groups.map(\.name)).union(state.groups.keys).sorted()
            let report: @Sendable (Int, Int) -> Void = { done, total in
                progress.update(done: done, total: total, unit: "tokens")
            }
            let all = TokenSet(sorted: Array(0..<UInt32(state.tokens.count)))
            let large = state.tokens.count >= 20_000
            let started = ContinuousClock.now
            observed = try await Refresher(backend: backend).refresh(all, table: state.tokens, groups: groups,
                at: Int64(Date().timeIntervalSince1970), progress: large ? report : nil)
            if large {
                let elapsed = ContinuousClock.now - started
                let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) * 1e-18
                Terminal.err("Refreshed \(PlanRenderer.formatCount(all.count)) registrations in \(String(format: "%.1f", seconds)) s (\(PlanRenderer.formatCount(Int(Double(all.count) / max(seconds, 0.001))))/s).")
            }
        }
        let plan = Planner(tidemarkVersion: Workspace.version).plan(loaded: loaded, state: state, refresh: observed,
            backend: backend.identity, now: Date())
        return PlanningResult(state: state, loaded: loaded, plan: plan)
    }

    /// Renders `plan` in `format` on standard output.
    func output(_ plan: Plan, format: OutputFormat, inventory: Inventory?) throws {
        switch format {
        case .text:
            Terminal.out(renderer(inventory).render(plan))
        case .json:
            var data = try Plan.encoder().encode(plan)
            data.append(UInt8(ascii: "\n"))
            FileHandle.standardOutput.write(data)
        }
    }
}
