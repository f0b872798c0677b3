import ArgumentParser
import Foundation
import TidemarkCore
import TidemarkRuntime

struct ApplyCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "apply",
        abstract: "Make FCM match the manifests, or carry out a saved plan exactly.",
        discussion: """
            Without PLANFILE, plans (as 'tidemark plan') and asks for confirmation on a terminal unless \
            --auto-approve. With PLANFILE, applies exactly that plan, or refuses it as stale when the state, \
            manifests or backend moved on since it was made. Progress is journaled after every batch: an \
            apply that was killed resumes with only the remaining work. With --drift-only (for scheduled \
            self-heal), re-asserts only what the last apply established and takes in no manifest or \
            inventory change. Exit 1 when a token could not be changed for a reason other than being \
            unregistered, or when the plan breaks a safety rail (then nothing is changed).
            """
    )

    @OptionGroup var global: GlobalOptions
    @OptionGroup var refreshing: RefreshOptions
    @OptionGroup var reading: RefreshModeOptions
    @OptionGroup var planning: PlanningOptions
    @OptionGroup var drift: DriftOnlyOption
    @OptionGroup var output: DataFormatOption

    @Argument(help: ArgumentHelp("A plan saved with 'tidemark plan --out FILE'.", valueName: "PLANFILE"))
    var planFile: String?

    @Flag(help: "Apply without asking for confirmation (required when not on a terminal).")
    var autoApprove = false

    @Option(help: "Requests in flight at once.")
    var parallelism = 8

    @Option(
        help: ArgumentHelp(
            "Subscription changes per second to send to FCM (emulator and fcm backends; default: 'qps' in tidemark.yaml, else FCM's documented 3000).",
            valueName: "N"))
    var qps: Double?

    @Option(
        help: ArgumentHelp(
            "What --qps counts: tokens (membership changes, the default) or requests (HTTP calls; an IID batch is one).",
            valueName: "UNIT"))
    var qpsUnit: QuotaUnit?

    @Flag(
        help:
            "Read FCM (per --refresh) and record what it holds in state, changing nothing in FCM: advances the sweep for scheduled jobs."
    )
    var refreshOnly = false

    @Option(
        help: ArgumentHelp(
            "While another run holds the state lock, wait up to this many seconds for it (trying every second) instead of failing at once; for CI jobs that must not be dropped.",
            valueName: "SECONDS"))
    var lockTimeout: Double = 0

    @Option(
        help: ArgumentHelp(
            "Write the inventory's devices whose token FCM reported dead to FILE (NDJSON: device id, token, redacted token, source, reason, when), so the app can stop sending to them.",
            valueName: "FILE"))
    var deadTokens: String?

    func validate() throws {
        if let qps, !FCMLimits.isRate(qps) {
            throw ValidationError(
                "--qps must be a number of changes per second from above 0 to \(FCMLimits.maxRate), not \(qps).")
        }
        guard lockTimeout >= 0, lockTimeout <= 86_400 else {
            throw ValidationError("--lock-timeout must be between 0 and 86400 seconds, not \(lockTimeout).")
        }
        guard parallelism >= 1, parallelism <= 1000 else {
            throw ValidationError("--parallelism must be between 1 and 1000, not \(parallelism).")
        }
        if planFile != nil, reading.noRefresh || reading.refresh == RefreshMode.none {
            throw ValidationError(
                "--no-refresh has no effect with a saved plan: apply reads again the registrations whose changes state does not call for (all of them when the plan is older than 'saved_plan_reread_after')."
            )
        }
        if refreshOnly, planFile != nil {
            throw ValidationError("--refresh-only changes nothing in FCM; it takes no PLANFILE.")
        }
        try drift.check(
            reading: reading, conflicts: [(planFile != nil, "a PLANFILE"), (refreshOnly, "--refresh-only")])
        if refreshOnly, reading.noRefresh || reading.refresh == RefreshMode.none {
            throw ValidationError("--refresh-only needs something to read; it cannot be combined with --refresh none.")
        }
    }

    func run() async throws {
        try await runReportingErrors {
            let runtime = try Runtime(global, qps: qps, qpsUnit: qpsUnit, readQPS: refreshing.readQps)
            try await runtime.traced { try await apply(runtime) }
        }
    }

    /// The replica of `tidemark serve` that owns the workspace now, when one does and the state
    /// store keeps serve's records; nil otherwise (or when they cannot be read: the apply says why).
    static func serveOwner(_ runtime: Runtime) async -> String? {
        guard let records = try? runtime.serveRecords(), let record = try? await records.serveRecord()
        else { return nil }
        return record.liveOwner(at: Date())
    }

    private func apply(_ runtime: Runtime) async throws {
        PhaseTrace.mark("apply started")
        let showTokens = global.showTokens
        var request = try runtime.applyRequest(
            runtime.planRequest(
                try planning.flags(reading), targets: try planning.selection.targets(), driftOnly: drift.driftOnly),
            savedPlan: planFile)
        PhaseTrace.mark("saved plan read")
        request.approve = { [autoApprove] _ in
            if autoApprove { return .approved }
            guard Terminal.stdinIsTerminal else { return .unavailable }
            return Terminal.confirm("\nDo you want to apply this plan?") ? .approved : .declined
        }
        request.planReady = { [json = output.json] outcome in
            // With --format json, stdout carries only the result; the plan is shown on stderr.
            if json {
                Terminal.err(runtime.renderer(outcome.loaded.inventory).render(outcome.plan))
            } else {
                try runtime.output(outcome.plan, format: .text, inventory: outcome.loaded.inventory)
            }
        }
        request.approveResume = { [autoApprove, planFile] unfinished in
            // A saved plan was reviewed already; --auto-approve says yes to everything.
            if autoApprove || planFile != nil { return .approved }
            guard Terminal.stdinIsTerminal else { return .unavailable }
            var remaining = unfinished.plan
            remaining.operations = unfinished.plan.operations.indices.filter { !unfinished.done.contains($0) }
                .map { unfinished.plan.operations[$0] }
            Terminal.err(
                "An apply started at \(ISO8601DateFormatter().string(from: unfinished.startedAt)) was interrupted with \(unfinished.done.count) of \(unfinished.plan.operations.count) operations done. It still has to run:\n"
            )
            try? Terminal.write(PlanRenderer(showTokens: showTokens).render(remaining))
            return Terminal.confirm("\nDo you want to finish it?") ? .approved : .declined
        }
        request.planning.allowShrink = planning.allowShrink
        request.planning.skipHeld = planning.skipHeld
        request.refreshOnly = refreshOnly
        if let owner = await Self.serveOwner(runtime) {
            Terminal.err(
                "note: 'tidemark serve' on replica \(owner) owns workspace '\(runtime.workspaceName)'; its next reconcile will see your change (a reconcile that meets this apply's state lock waits for it). 'tidemark status' shows what serve holds."
            )
        }
        let prepared = request
        let interruption = Interruption()
        let (parallelism, acceptDead, lockTimeout) = (parallelism, refreshing.acceptDead, lockTimeout)
        let outcome: ApplyOutcome
        do {
            outcome = try await interruption.run {
                try await TerminalOutput.during {
                    try await runtime.apply(
                        prepared, output: $0, parallelism: parallelism, acceptDead: acceptDead,
                        lockTimeout: lockTimeout)
                }
            }
        } catch  where interruption.exitCode != nil {
            Terminal.err(
                "Interrupted by \(interruption.signal == .sigint ? "SIGINT" : "SIGTERM"): every operation that finished is journaled in \(runtime.stateDisplay). Run 'tidemark apply' to finish the rest."
            )
            throw ExitCode(interruption.exitCode!)
        } catch let error as StateStoreError where error.code == .io {
            // The state server went away (down, restarted, a lost connection, a timeout) mid-run.
            Terminal.err("error: \(error.description)")
            Terminal.err(
                "What finished before this is journaled in \(runtime.stateDisplay); once the state server answers again, 'tidemark apply' resumes from there."
            )
            throw ExitCode.failure
        }
        if output.json {
            try Terminal.writeJSON(Report(outcome, state: runtime.stateDisplay))
            try await runtime.reportDead(of: outcome, to: deadTokens, json: true)
            try end(with: outcome.exitStatus)
            return
        }
        // The finished interrupted apply was said when it finished (before the new plan); its
        // failures are listed here.
        if let resumed = outcome.resumed { reportFailures(resumed, showTokens: showTokens) }
        switch outcome.result {
        case .applied(let summary): report(summary, showTokens: showTokens)
        case .nothingToDo(let savedPlan):
            if savedPlan { Terminal.out("The plan has no changes; nothing to apply.\n") }
        case .declined: Terminal.err("Apply cancelled; nothing was changed.")
        case .resumedOnly: break
        case .refreshed(let record): Terminal.out(Self.describe(record, state: runtime.stateDisplay) + "\n")
        }
        if outcome.hasUnexpectedFailures {
            Terminal.err("Some tokens could not be changed; the next plan shows what is left.")
        }
        if let pruned = outcome.pruned {
            Terminal.out(
                StatePruneCommand.describe(
                    pruned, age: runtime.settings.pruneAfterText ?? "", dryRun: false,
                    state: runtime.stateDisplay) + "\n")
        }
        // Reported after the apply, outside its lock: the hooks write to the app's database, not to state.
        try await runtime.reportDead(of: outcome, to: deadTokens, json: false)
        try end(with: outcome.exitStatus)
    }

    /// `--format json`: how the apply ended, as one document (full tokens in failures).
    struct Report: Encodable {
        struct Summary: Encodable {
            var subscribed: Int
            var unsubscribed: Int
            var groupCalls: Int
            var audiences: Int
            var adopted: Int
            var released: Int
            var requests: Int
            var retries: Int
            var seconds: Double
            var failures: [TokenFailure]

            init(_ summary: ApplySummary) {
                subscribed = summary.subscribed
                unsubscribed = summary.unsubscribed
                groupCalls = summary.groupCalls
                audiences = summary.audiences
                adopted = summary.adopted
                released = summary.released
                requests = summary.requests
                retries = summary.retries
                seconds = (summary.seconds * 1000).rounded() / 1000
                failures = summary.failures
            }
        }
        struct Refreshed: Encodable {
            var coverage: RefreshCoverage
            var membershipsDiffering: Int
            var dead: Int
            var serial: Int?
        }
        /// applied, nothing_to_do, declined, resumed_only or refreshed.
        var result: String
        var applied: Summary?
        /// An interrupted apply finished first.
        var resumed: Summary?
        var refreshed: Refreshed?
        var savedPlan: Bool?
        /// Tokens the automatic prune forgot, and the serial it wrote.
        var prunedTokens: Int?
        var deadDevices: Int
        var state: String

        init(_ outcome: ApplyOutcome, state: String) {
            resumed = outcome.resumed.map(Summary.init)
            deadDevices = outcome.dead.count
            self.state = state
            prunedTokens = outcome.pruned.map { $0.selection.count }
            switch outcome.result {
            case .applied(let summary):
                result = "applied"
                applied = Summary(summary)
            case .nothingToDo(let saved):
                result = "nothing_to_do"
                savedPlan = saved
            case .declined: result = "declined"
            case .resumedOnly: result = "resumed_only"
            case .refreshed(let record):
                result = "refreshed"
                refreshed = Refreshed(
                    coverage: record.coverage,
                    membershipsDiffering: record.observations.topics.reduce(0) {
                        $0 + $1.subscribed.count + $1.unsubscribed.count
                    }, dead: record.observations.dead.count, serial: record.serial)
            }
        }
    }

    /// What `--refresh-only` read and recorded.
    static func describe(_ record: RefreshRecord, state: String) -> String {
        let coverage = PlanRenderer.coverageSentence(record.coverage)
        let observations = record.observations
        let moved = observations.topics.reduce(0) { $0 + $1.subscribed.count + $1.unsubscribed.count }
        var found: [String] = []
        if moved > 0 { found.append("\(PlanRenderer.counted(moved, "membership")) differed from state") }
        if !observations.dead.isEmpty {
            found.append("\(PlanRenderer.counted(observations.dead.count, "token")) dead")
        }
        let news = found.isEmpty ? "state already matched what was read" : found.joined(separator: ", ")
        let written = record.serial.map { "recorded in \(state) (serial \($0))" } ?? "nothing recorded"
        return
            "Refresh only: \(coverage) \(news.prefix(1).uppercased() + news.dropFirst()); \(written). Nothing was changed in FCM; 'tidemark plan' shows what apply would do about it."
    }

    /// "+12 subscribed, −3 unsubscribed, 0 group calls; 4 requests in 0.2 s".
    static func describe(_ summary: ApplySummary) -> String {
        "+\(PlanRenderer.formatCount(summary.subscribed)) subscribed, −\(PlanRenderer.formatCount(summary.unsubscribed)) unsubscribed, \(PlanRenderer.counted(summary.groupCalls, "group call"))\(summary.audiences > 0 ? ", \(PlanRenderer.counted(summary.audiences, "audience")) written in state" : "")\(summary.adopted > 0 ? ", \(PlanRenderer.counted(summary.adopted, "membership")) adopted" : "")\(summary.released > 0 ? ", \(PlanRenderer.formatCount(summary.released)) released" : ""); \(PlanRenderer.counted(summary.requests, "request"))\(summary.retries > 0 ? " (\(PlanRenderer.formatCount(summary.retries)) of them retries)" : "") in \(String(format: "%.1f", summary.seconds)) s"
    }

    /// The summary line of an apply, and a warning per kind of failure.
    private func report(_ summary: ApplySummary, showTokens: Bool) {
        Terminal.out("Apply complete: \(Self.describe(summary)).\n")
        reportFailures(summary, showTokens: showTokens)
    }

    /// A warning per kind of failure.
    private func reportFailures(_ summary: ApplySummary, showTokens: Bool) {
        for (code, failures) in summary.failuresByCode {
            let examples = failures.prefix(5).map {
                "\(showTokens ? $0.token : Redaction.redact($0.token)) (\($0.kind.rawValue) \($0.target))"
            }
            Terminal.err(
                "warning: \(PlanRenderer.counted(failures.count, "token")) failed with \(code) (\(failures[0].error.advice)): \(examples.joined(separator: ", "))\(failures.count > 5 ? ", …" : "")"
            )
        }
    }
}
