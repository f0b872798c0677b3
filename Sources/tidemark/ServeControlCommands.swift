import ArgumentParser
import Foundation
import TidemarkCore
import TidemarkRuntime
import TidemarkServe

extension ServedWorkspaces {
    /// The served workspaces of the project the global flags name.
    init(global: GlobalOptions) { self.init(RuntimeFlags(global)) }
}

/// How long ago `date` was, as a person says it ("2m ago"), or how long until it ("in 4m").
private func relative(_ date: Date, now: Date = Date()) -> String {
    let seconds = now.timeIntervalSince(date)
    let text = ServeSettings.describe(.seconds(Int64(abs(seconds).rounded())))
    return seconds >= 0 ? "\(text) ago" : "in \(text)"
}

struct StatusCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "status",
        abstract: "Show what 'tidemark serve' reports of each workspace it reconciles.",
        discussion: """
            Reads the status the owning replica of each workspace publishes in its state store (so it \
            works from any machine that reaches the state): its phase (ready, failing, blocked, \
            suspended, reconciling), the last reconcile's result and why, the last success, drift \
            found, changes waiting, the next run and the replica that owns it. Without WORKSPACE it \
            shows every workspace tidemark.yaml lists under 'serve.workspaces' (or the project's \
            workspace). A workspace no replica owns says so: no 'tidemark serve' runs for it, or its \
            replica stopped renewing its claim.
            """
    )

    @OptionGroup var global: GlobalOptions
    @OptionGroup var output: DataFormatOption

    @Argument(help: "The workspace (default: every workspace 'serve' reconciles).")
    var workspace: String?

    func run() async throws {
        try await runReportingErrors {
            let entries = try await ServedWorkspaces(global: global).records(workspace)
            if output.json {
                try Terminal.write(try ServedWorkspaces.report(entries, now: Date()).json() + "\n")
            } else {
                try Terminal.write(entries.map { Self.text($0.runtime, $0.record) }.joined(separator: "\n\n") + "\n")
            }
        }
    }

    /// A workspace's status for a person.
    static func text(_ runtime: Runtime, _ record: ServeRecord) -> String {
        let now = Date()
        let status = record.publishedStatus
        var lines: [String] = []
        let owner = record.liveOwner(at: now)
        var phase = status?.phase.rawValue ?? "never reconciled"
        if owner == nil, status != nil { phase += " (as last published)" }
        lines.append("\(record.workspace): \(phase)")
        lines.append("  state: \(runtime.stateDisplay)")
        // What the serving replica reconciles against, as it published it; else what these settings say.
        lines.append(
            "  backend: "
                + (status?.backend
                    ?? "\(runtime.backendKind.rawValue) (project \(runtime.resolved.project.project)), as tidemark.yaml here says")
        )
        let replicas = record.liveReplicas(at: now)
        if let owner {
            lines.append("  owner: replica \(owner)")
        } else if let status, let to = status.handedOverTo, replicas.contains(to) {
            lines.append(
                "  owner: none for a moment; replica \(status.replica) handed it over to replica \(to), which owns fewer workspaces"
            )
        } else if let previous = record.owner, let expires = record.ownerExpires {
            lines.append(
                "  owner: none; replica \(previous)'s claim lapsed \(relative(expires)) (it stopped, or no 'tidemark serve' reaches this state)"
            )
        } else {
            lines.append("  owner: none; no 'tidemark serve' has reconciled it from this state")
        }
        let standing = replicas.filter { $0 != owner }
        if !standing.isEmpty {
            lines.append("  standing by: " + standing.map { "replica \($0)" }.joined(separator: ", "))
        }
        if record.suspended {
            lines.append("  suspended by \(record.suspendedBy ?? "someone"); 'tidemark resume' lifts it")
        }
        if let status {
            if let last = status.last {
                var line = "  last reconcile: \(last.outcome.rawValue)"
                if let reason = last.reason { line += " (\(reason))" }
                line += ", \(relative(last.finishedAt)): \(last.summary)"
                lines.append(line)
                if last.outcome != .success, let message = last.message { lines.append("    \(message)") }
                if let commit = last.commit { lines.append("  manifests: \(status.manifests) at commit \(commit)") }
            }
            if let started = status.reconcileStartedAt {
                var line = "  reconciling since \(relative(started))"
                if let progress = status.progress, progress.total > 0 {
                    line +=
                        ": \(progress.step), \(PlanRenderer.formatCount(progress.done)) of \(PlanRenderer.formatCount(progress.total))"
                    if let eta = progress.etaSeconds { line += ", about \(ServeSettings.describe(.seconds(eta))) left" }
                }
                lines.append(line)
            }
            if let sweep = status.last?.sweep {
                var line = "  drift sweep: every registration read since \(relative(sweep.oldestReadAt))"
                if sweep.neverRead > 0 {
                    line =
                        "  drift sweep: \(PlanRenderer.formatCount(sweep.neverRead)) of \(PlanRenderer.counted(sweep.fleet, "registration")) never read yet"
                        + (sweep.reconcilesToComplete.map {
                            ", about \(PlanRenderer.counted($0, "reconcile")) to read them all"
                        }
                            ?? "")
                        + "; the others read since \(relative(sweep.oldestReadAt))"
                }
                lines.append(line + " (drift is seen only where it has read)")
            }
            for held in status.held ?? [] {
                let since = held.since.map { " since \(relative($0))" } ?? ""
                lines.append(
                    "  held: \(held.subject) by \(held.rail)\(held.at.map { " at \($0)" } ?? "")\(since); its changes wait, the rest is applied"
                )
                lines.append("    \(held.message)")
            }
            if let trouble = status.fcmTrouble {
                lines.append("  FCM has answered \(trouble.answer) to every request since \(relative(trouble.since))")
            }
            if let success = status.lastSuccessAt { lines.append("  last success: \(relative(success))") }
            if let next = status.nextRunAt, !record.suspended { lines.append("  next run: \(relative(next))") }
            let settings = status.settings.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }
            lines.append("  settings: " + settings.joined(separator: ", "))
            if let at = record.statusAt { lines.append("  published \(relative(at))") }
        }
        if let asked = record.reconcileRequestedAt {
            lines.append("  reconcile requested \(relative(asked)) by \(record.reconcileRequestedBy ?? "someone")")
        }
        return lines.joined(separator: "\n")
    }
}

struct SuspendCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "suspend",
        abstract: "Stop 'tidemark serve' reconciling a workspace, on every replica, until 'tidemark resume'.",
        discussion: """
            Records the request in the workspace's state store, without taking the state lock; the \
            replica that owns the workspace stops within a few seconds (a reconcile in flight \
            finishes first). 'tidemark apply' still works on a suspended workspace.
            """
    )

    @OptionGroup var global: GlobalOptions

    @Argument(
        help:
            "The workspace (default: the one 'serve' runs: --workspace, 'workspace' in tidemark.yaml, or the only one 'serve.workspaces' lists)."
    )
    var workspace: String?

    @OptionGroup var request: ControlRequestOptions

    func run() async throws {
        try await runReportingErrors {
            let (runtime, record) = try await ServedWorkspaces(global: global).request(
                .suspend, workspace, by: request.requester, reason: request.said)
            try Terminal.write(
                "Suspended workspace '\(record.workspace)' (\(runtime.stateDisplay)). "
                    + (record.liveOwner(at: Date()).map { "Replica \($0) stops reconciling it within a few seconds." }
                        ?? "No replica owns it now; whichever takes it will not reconcile it.")
                    + " 'tidemark resume \(record.workspace)' lifts it.\n")
        }
    }
}

struct ResumeCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "resume",
        abstract: "Let 'tidemark serve' reconcile a suspended workspace again, on its schedule.",
        discussion: """
            Records the request in the workspace's state store; the owning replica reconciles it at \
            its next scheduled run ('tidemark reconcile' runs one now). A workspace that \
            tidemark.yaml suspends ('suspend: true') stays suspended until the file says otherwise.
            """
    )

    @OptionGroup var global: GlobalOptions

    @Argument(
        help:
            "The workspace (default: the one 'serve' runs: --workspace, 'workspace' in tidemark.yaml, or the only one 'serve.workspaces' lists)."
    )
    var workspace: String?

    @OptionGroup var request: ControlRequestOptions

    func run() async throws {
        try await runReportingErrors {
            let (runtime, record) = try await ServedWorkspaces(global: global).request(
                .resume, workspace, by: request.requester, reason: request.said)
            var line = "Resumed workspace '\(record.workspace)' (\(runtime.stateDisplay))."
            if let entry = runtime.settings.serve?.workspace(record.workspace), entry.settings.suspend {
                line +=
                    " tidemark.yaml still suspends it ('suspend: true', \(entry.location)): it stays suspended until the file says otherwise."
            }
            try Terminal.write(line + "\n")
        }
    }
}

struct ReconcileCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "reconcile",
        abstract: "Ask 'tidemark serve' to reconcile a workspace now, and wait for the result.",
        discussion: """
            Records the request in the workspace's state store, without taking the state lock; the \
            replica that owns the workspace starts a reconcile within a few seconds (after one in \
            flight). By default it waits, saying what it waits for, until the owner publishes the \
            result: exit 0 when it succeeded, 1 when it failed or a rail blocked it, 1 at --timeout. \
            --no-wait only records the request.
            """
    )

    @OptionGroup var global: GlobalOptions

    @Argument(
        help:
            "The workspace (default: the one 'serve' runs: --workspace, 'workspace' in tidemark.yaml, or the only one 'serve.workspaces' lists)."
    )
    var workspace: String?

    @OptionGroup var request: ControlRequestOptions

    @Flag(inversion: .prefixedNo, help: "Wait for the reconcile's result.")
    var wait = true

    @Option(help: ArgumentHelp("How long to wait for the result (default 10m).", valueName: "DURATION"))
    var timeout = "10m"

    func validate() throws {
        guard ServeSettings.duration(timeout) != nil else {
            throw ValidationError("--timeout must be a duration such as 90s, 5m or 1h, not '\(timeout)'.")
        }
    }

    func run() async throws {
        try await runReportingErrors {
            let (runtime, asked) = try await ServedWorkspaces(global: global).request(
                .reconcile, workspace, by: request.requester, reason: request.said)
            let name = asked.workspace
            guard let askedAt = asked.reconcileRequestedAt else { return }
            let owner = asked.liveOwner(at: Date())
            try Terminal.write(
                "Asked for a reconcile of workspace '\(name)' now"
                    + (owner.map { "; replica \($0) owns it." }
                        ?? "; no replica owns it now, so it runs when a 'tidemark serve' takes the workspace.") + "\n")
            guard !asked.suspended else {
                try Terminal.write("It is suspended: it is not reconciled until 'tidemark resume \(name)'.\n")
                if wait { throw ExitCode.failure }
                return
            }
            guard wait else { return }
            let limit = ServeSettings.duration(timeout) ?? .seconds(600)
            let done = try await ServedWorkspaces.waitForReconcile(of: runtime, askedAt: askedAt, limit: limit) {
                record in
                let who = record.liveOwner(at: Date()).map { "replica \($0)" } ?? "a replica to take the workspace"
                Terminal.err("Waiting for \(who) to reconcile '\(name)' (asked \(relative(askedAt)))…")
            }
            if let done {
                try Terminal.write(StatusCommand.text(runtime, done) + "\n")
                if done.publishedStatus?.last?.outcome != .success { throw ExitCode.failure }
                return
            }
            throw RuntimeError(
                "no result for workspace '\(name)' within \(timeout); 'tidemark status \(name)' shows what its replica reports (is a 'tidemark serve' running for it?)."
            )
        }
    }
}

/// Who asks and why, recorded with a control request and shown by `status`, `/status` and the log.
struct ControlRequestOptions: ParsableArguments {
    @Option(
        help: ArgumentHelp(
            "Who asks, as status and the log show it (default: your user name). A pipeline passes the person it acts for.",
            valueName: "NAME"))
    var actor: String?

    @Option(help: ArgumentHelp("Why, in a few words (one line), shown with who asked.", valueName: "TEXT"))
    var reason: String?

    func validate() throws {
        for (flag, value, limit) in [("--actor", actor, 80), ("--reason", reason, 200)] {
            guard let value else { continue }
            let trimmed = value.trimmingCharacters(in: .whitespaces)
            guard !trimmed.isEmpty, trimmed.count <= limit,
                !trimmed.unicodeScalars.contains(where: { $0.properties.generalCategory == .control })
            else {
                throw ValidationError(
                    "\(flag) must be one line of at most \(limit) characters, not '\(value.escapedOnOneLine)'.")
            }
        }
    }

    /// The requester `runtime` records: `NAME on HOST`.
    func requester(_ runtime: Runtime) -> String {
        let who = actor?.trimmingCharacters(in: .whitespaces) ?? runtime.userName
        return "\(who) on \(ProcessInfo.processInfo.hostName)"
    }

    /// The reason, trimmed.
    var said: String? { reason?.trimmingCharacters(in: .whitespaces) }
}
