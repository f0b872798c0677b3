import ArgumentParser
import Foundation
import TidemarkCore
import TidemarkStore

struct ApplyCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "apply",
        abstract: "Make FCM match the manifests, or carry out a saved plan exactly.",
        discussion: """
            Without PLANFILE, plans (as 'tidemark plan') and asks for confirmation on a terminal unless \
            --auto-approve. With PLANFILE, applies exactly that plan, or refuses it as stale when the state, \
            manifests or backend moved on since it was made. Progress is journaled after every batch: an \
            apply that was killed resumes with only the remaining work. Exit 1 when a token could not be \
            changed for a reason other than being unregistered.
            """
    )

    @OptionGroup var global: GlobalOptions
    @OptionGroup var planning: PlanningOptions

    @Argument(help: ArgumentHelp("A plan saved with 'tidemark plan --out FILE'.", valueName: "PLANFILE"))
    var planFile: String?

    @Flag(help: "Apply without asking for confirmation (required when not on a terminal).")
    var autoApprove = false

    @Option(help: "Requests in flight at once.")
    var parallelism = 8

    @Option(help: ArgumentHelp(
        "Subscription changes per second to send to FCM (emulator and fcm backends; default: 'qps' in tidemark.yaml, else FCM's documented 3000).",
        valueName: "N"))
    var qps: Double?

    @Option(help: ArgumentHelp(
        "What --qps counts: tokens (membership changes, the default) or requests (HTTP calls; an IID batch is one).",
        valueName: "UNIT"))
    var qpsUnit: String?

    @Flag(help: "Plan from state alone, without reading FCM first.")
    var noRefresh = false

    func validate() throws {
        if let qps, !(qps > 0) { throw ValidationError("--qps must be a positive number, not \(qps).") }
        if let qpsUnit, !ProjectSettings.qpsUnits.contains(qpsUnit) {
            throw ValidationError("unknown --qps-unit '\(qpsUnit)'; use tokens or requests.")
        }
        guard parallelism >= 1, parallelism <= 1000 else {
            throw ValidationError("--parallelism must be between 1 and 1000, not \(parallelism).")
        }
        if planFile != nil, noRefresh {
            throw ValidationError("--no-refresh has no effect with a saved plan; the plan already says whether it refreshed.")
        }
    }

    func run() async throws {
        try await runReportingErrors {
            let workspace = try Workspace(global)
            let lock = try workspace.lockState(for: "tidemark apply")
            defer { withExtendedLifetime(lock) {} }
            try await workspace.withBackend(qps: qps, qpsUnit: qpsUnit) { backend in try await apply(workspace, backend) }
        }
    }

    /// Resumes an interrupted apply, or plans (or reads the saved plan) and carries it out.
    func apply(_ workspace: Workspace, _ backend: any Backend) async throws {
        let existing = try workspace.openStore(create: false)
        if let existing, try await resumeUnfinished(workspace, existing, backend) { return }

        var state: State
        var loaded: LoadedManifests
        var plan: Plan
        if let planFile {
            plan = try readPlan(planFile)
            state = try workspace.loadState(existing)
            loaded = workspace.loadManifests(into: &state)
            try reportDiagnostics(loaded.diagnostics.filter { $0.severity == .error })
            try checkFresh(plan, state: state, loaded: loaded, backend: backend.identity, workspace: workspace)
            try checkSelection(plan, state: state)
        } else {
            let result = try await workspace.makePlan(store: existing, backend: backend, refresh: !noRefresh,
                targets: try planning.selection.targets(), maxUnsubscribes: try planning.limit())
            (state, loaded, plan) = (result.state, result.loaded, result.plan)
            try workspace.output(plan, format: .text, inventory: loaded.inventory)
            if plan.diagnostics.hasErrors {
                throw CLIError("the plan has errors (above); nothing was changed.")
            }
            if plan.hasChanges, !autoApprove {
                guard Terminal.stdinIsTerminal else {
                    throw CLIError("apply needs confirmation: run it on a terminal, pass --auto-approve, or apply a saved plan file.")
                }
                guard Terminal.confirm("\nDo you want to apply this plan?") else {
                    Terminal.err("Apply cancelled; nothing was changed.")
                    throw ExitCode.failure
                }
            }
        }
        if !plan.hasChanges, plan.observations.isEmpty {
            if planFile != nil { Terminal.out("The plan has no changes; nothing to apply.\n") }
            return
        }
        let store = try workspace.storeForWriting(existing, state: &state)
        let session = try ApplySession.begin(plan: plan, desired: loaded.desired, store: store, state: state)
        try await execute(plan, done: [], session: session, backend: backend)
    }

    /// Finishes an interrupted apply when it was made from the same manifests; returns true when nothing more is to do.
    private func resumeUnfinished(_ workspace: Workspace, _ store: SQLiteStateStore, _ backend: any Backend) async throws -> Bool {
        guard let unfinished = try store.unfinishedApply() else { return false }
        var state = try store.load()
        let loaded = workspace.loadManifests(into: &state)
        let session = ApplySession.resume(unfinished, store: store, state: state)
        let started = ISO8601DateFormatter().string(from: unfinished.startedAt)
        guard unfinished.plan.manifestsDigest == loaded.digest, unfinished.plan.backend == backend.identity,
            !loaded.diagnostics.hasErrors
        else {
            Terminal.err("An apply started at \(started) was interrupted, and the manifests or backend changed since; it is abandoned and a new plan is made from the current state.")
            try await session.finish(status: "abandoned")
            return false
        }
        Terminal.err("Resuming the apply started at \(started) that was interrupted: \(unfinished.done.count) of \(unfinished.plan.operations.count) operations were done; running the \(unfinished.plan.operations.count - unfinished.done.count) remaining.")
        try await execute(unfinished.plan, done: unfinished.done, session: session, backend: backend)
        if let planFile {
            let plan = try readPlan(planFile)
            if plan.operationsDigest == unfinished.plan.operationsDigest { return true }
            throw CLIError("\(planFile) is stale: an interrupted apply was finished first, so the state moved on. Make a new plan.")
        }
        return false
    }

    /// A saved plan runs with the selection it was made with: flags may repeat it, never change or widen it;
    /// `--max-unsubscribes` still applies.
    private func checkSelection(_ plan: Plan, state: State) throws {
        let file = planFile ?? "the plan"
        let saved = try plan.selection
        let given = try planning.selection.targets()
        if given.isPartial, given != saved {
            throw CLIError("\(file) was planned for \(saved.summary); --target/--exclude (\(given.summary)) cannot change what a saved plan covers. Make a new plan with those selectors.")
        }
        if let limit = try planning.limit(),
            let violation = limit.violation(unsubscribes: plan.unsubscribeCount, known: state.observedMembershipCount)
        {
            throw CLIError("\(file) is refused: \(violation)")
        }
    }

    private func checkFresh(_ plan: Plan, state: State, loaded: LoadedManifests, backend: BackendIdentity,
        workspace: Workspace) throws
    {
        let file = planFile ?? "the plan"
        if plan.lineage != state.lineage {
            if plan.lineage.isEmpty {
                throw CLIError("\(file) is stale: it was made before any state existed, but \(workspace.stateDisplay) now exists (lineage \(state.lineage.prefix(8))). Make a new plan.")
            }
            throw CLIError("\(file) was made for another state (lineage \(plan.lineage.prefix(8)), this state is \(state.lineage.isEmpty ? "missing" : String(state.lineage.prefix(8)))). Make a new plan against this state.")
        }
        if plan.serial != state.serial {
            throw CLIError("\(file) is stale: the state moved from serial \(plan.serial) (when planned) to \(state.serial). Make a new plan.")
        }
        if plan.manifestsDigest != loaded.digest {
            throw CLIError("\(file) is stale: the manifests or inventory changed since it was made (sha256 \(plan.manifestsDigest.prefix(12)) then, \(loaded.digest.prefix(12)) now). Make a new plan.")
        }
        if plan.backend != backend {
            throw CLIError("\(file) was made for backend \(plan.backend), but this run uses \(backend). Use the same backend and project, or make a new plan.")
        }
    }

    private func execute(_ plan: Plan, done: Set<Int>, session: ApplySession, backend: any Backend) async throws {
        let started = Date()
        let state = await session.state
        let keys = state.groups.compactMapValues(\.key)
        let total = plan.operations.reduce(0) { $0 + $1.tokens.count }
        let progress = ProgressReporter(label: "Applying")
        let report: @Sendable (ExecutionProgress) -> Void = { p in
            progress.update(done: p.tokensDone, total: p.tokensTotal, unit: "tokens")
        }
        let executor = Executor(backend: backend, recorder: session, parallelism: parallelism,
            progress: total >= 5_000 ? report : nil)
        let result = try await executor.run(plan.operations, done: done, groupKeys: keys)
        try await session.finish()
        let elapsed = Date().timeIntervalSince(started)
        let remaining = plan.operations.indices.filter { !done.contains($0) }.map { plan.operations[$0] }
        let subscribed = remaining.filter { $0.kind == PlannedOperation.Kind.subscribe }.reduce(0) { $0 + $1.tokens.count }
        let unsubscribed = remaining.filter { $0.kind == PlannedOperation.Kind.unsubscribe }.reduce(0) { $0 + $1.tokens.count }
        let groupCalls = remaining.filter { $0.kind.isGroup }.count
        let failures: [TokenFailure] = result.failures
        let failedBy = Dictionary(grouping: failures, by: { (failure: TokenFailure) in failure.error.code })
        let subscribedOK = subscribed - failures.filter { $0.kind == PlannedOperation.Kind.subscribe }.count
        let unsubscribedOK = unsubscribed - failures.filter { $0.kind == PlannedOperation.Kind.unsubscribe }.count
        Terminal.out("Apply complete: +\(PlanRenderer.formatCount(subscribedOK)) subscribed, −\(PlanRenderer.formatCount(unsubscribedOK)) unsubscribed, \(groupCalls) group calls; \(PlanRenderer.formatCount(result.requests)) requests in \(String(format: "%.1f", elapsed)) s.\n")
        guard !failures.isEmpty else { return }
        for (code, failures) in failedBy.sorted(by: { $0.key < $1.key }) {
            let examples = failures.prefix(5).map { "\(global.showTokens ? $0.token : Redaction.redact($0.token)) (\($0.kind.rawValue) \($0.target))" }
            let advice = code == "NOT_FOUND" ? "unregistered in FCM; recorded and skipped from now on"
                : code == "TOO_MANY_TOPICS" ? "the device holds 2000 topics already" : "not retried"
            Terminal.err("warning: \(failures.count) token(s) failed with \(code) (\(advice)): \(examples.joined(separator: ", "))\(failures.count > 5 ? ", …" : "")")
        }
        if failures.contains(where: { $0.error != TokenError.notFound }) {
            Terminal.err("Some tokens could not be changed; the next plan shows what is left.")
            throw ExitCode.failure
        }
    }
}
