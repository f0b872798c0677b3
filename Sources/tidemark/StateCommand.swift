import ArgumentParser
import Foundation
import TidemarkCore
import TidemarkRuntime

/// `tidemark state …`: what tidemark remembers, for people debugging a plan.
struct StateCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "state",
        abstract: "Inspect tidemark's state: topics and groups it manages, past applies, the lock.",
        subcommands: [
            StateListCommand.self, StateShowCommand.self, StateLockCommand.self, StateForceUnlockCommand.self,
            StatePullCommand.self, StatePushCommand.self, StateMigrateCommand.self, StatePruneCommand.self,
            StateRemoveCommand.self, StateMoveCommand.self,
        ]
    )
}

struct StateListCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "list",
        abstract: "List the topics and groups in state, with counts, and the latest applies."
    )

    @OptionGroup var global: GlobalOptions

    @OptionGroup var output: DataFormatOption

    func run() async throws {
        try await runReportingErrors {
            let runtime = try Runtime(global)
            let listing = try await runtime.stateListing()
            if output.json {
                try Terminal.writeJSON(listing)
                return
            }
            try Terminal.write(Self.text(listing, state: runtime.stateDisplay))
        }
    }

    /// The listing for a person.
    static func text(_ listing: StateListing, state: String) -> String {
        var lines = [
            "State \(state): lineage \(listing.lineage), serial \(listing.serial); \(PlanRenderer.formatCount(listing.tokens)) tokens known, \(PlanRenderer.formatCount(listing.dead)) dead."
        ]
        if !listing.topics.isEmpty {
            lines.append("")
            lines.append("Topics (managed = memberships tidemark made; observed = last seen in FCM):")
            let width = min(40, listing.topics.map(\.name.count).max() ?? 0)
            for t in listing.topics {
                let padded = t.name.padding(toLength: max(width, t.name.count), withPad: " ", startingAt: 0)
                lines.append(
                    "  \(padded)  \(t.mode.padding(toLength: 13, withPad: " ", startingAt: 0))  managed \(PlanRenderer.formatCount(t.managed)), observed \(PlanRenderer.formatCount(t.observed))\(t.protect ? ", protected" : "")"
                )
            }
        }
        for audiences in [false, true] {
            let groups = listing.groups.filter { ($0.kind == "audience") == audiences }
            guard !groups.isEmpty else { continue }
            lines.append("")
            lines.append(audiences ? "Audiences (named sets in state):" : "Device groups:")
            for g in groups {
                var parts: [String] = []
                if !audiences { parts.append(g.exists ? "exists" : "not created") }
                parts.append("\(g.members) member\(g.members == 1 ? "" : "s")")
                if audiences, g.exists { parts.append("its FCM group kept until retired") }
                if let exported = g.exported { parts.append("\(exported) token\(exported == 1 ? "" : "s") exported") }
                if g.protect { parts.append("protected") }
                lines.append("  \(g.name)  \(parts.joined(separator: ", "))")
            }
        }
        if !listing.applies.isEmpty {
            lines.append("")
            lines.append("Latest applies:")
            let formatter = ISO8601DateFormatter()
            for apply in listing.applies {
                let started = formatter.string(from: Date(timeIntervalSince1970: TimeInterval(apply.startedAt)))
                lines.append(
                    "  \(started)  \(apply.status.padding(toLength: 11, withPad: " ", startingAt: 0))  \(apply.done)/\(apply.operations) operations  (\(apply.id.prefix(8)))"
                )
            }
        }
        return lines.joined(separator: "\n") + "\n"
    }
}

struct StateShowCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "show",
        abstract: "Show one topic or group from state: its managed and observed members, redacted.",
        discussion: "NAME is topic:NAME, group:NAME, or a bare name (a topic first, then a group)."
    )

    @OptionGroup var global: GlobalOptions

    @Argument(help: ArgumentHelp("The topic or group.", valueName: "NAME"))
    var name: String

    @Option(help: "Members to list per section (0 lists none; --format json lists all).")
    var limit = 50

    @OptionGroup var output: DataFormatOption

    /// `--format json`: every member in full, with its device when the inventory knows it.
    struct Report: Encodable {
        struct Member: Encodable {
            var token: String
            var device: String?
        }
        var kind: String
        var name: String
        var mode: String?
        var protect: Bool
        var exists: Bool?
        var managed: [Member]?
        var observed: [Member]?
        var members: [Member]?
        /// What `groups export` read from FCM for the group (members the app added included).
        var exported: [Member]?
        var serial: Int
    }

    func run() async throws {
        try await runReportingErrors {
            let runtime = try Runtime(global)
            let entry = try await runtime.stateEntry(name)
            let (state, bare) = (entry.state, entry.name)
            let namer = runtime.deviceNamer(entry.inventory)
            func list(_ set: TokenSet) -> [String] {
                var lines = set.prefix(limit).map { id -> String in
                    let token = state.tokens[id]
                    let shown = global.showTokens ? token : Redaction.redact(token)
                    return "    \(shown)\(namer(token).map { " (\($0))" } ?? "")"
                }
                if set.count > limit { lines.append("    … and \(PlanRenderer.formatCount(set.count - limit)) more") }
                return lines
            }
            func members(_ set: TokenSet) -> [Report.Member] {
                set.map { id in
                    let token = state.tokens[id]
                    return Report.Member(token: token, device: entry.device(ofToken: token, id: id))
                }
            }
            var lines: [String] = []
            switch entry.kind {
            case .topic(let topic):
                if output.json {
                    try Terminal.writeJSON(
                        Report(
                            kind: "topic", name: bare, mode: topic.mode.rawValue, protect: topic.protect,
                            managed: members(topic.managed), observed: members(topic.observed), serial: state.serial))
                    return
                }
                lines.append("Topic '\(bare)': \(topic.mode.rawValue)\(topic.protect ? ", protected" : "")")
                lines.append("  managed (\(PlanRenderer.formatCount(topic.managed.count))):")
                lines += list(topic.managed)
                lines.append("  observed (\(PlanRenderer.formatCount(topic.observed.count))):")
                lines += list(topic.observed)
            case .group(let group):
                if output.json {
                    try Terminal.writeJSON(
                        Report(
                            kind: group.audience ? "audience" : "group", name: bare, protect: group.protect,
                            exists: group.key != nil, members: members(group.members),
                            exported: group.exported.map(members), serial: state.serial))
                    return
                }
                if group.audience {
                    lines.append(
                        "Audience '\(bare)': a named set in state\(group.key == nil ? "" : "; the FCM group it was converted from is kept in step until retired")\(group.protect ? ", protected" : "")"
                    )
                } else {
                    lines.append(
                        "Device group '\(bare)': \(group.key == nil ? "not created in FCM" : "exists in FCM (key kept in state)")\(group.protect ? ", protected" : "")"
                    )
                }
                lines.append("  members (\(group.members.count)):")
                lines += list(group.members)
                if let exported = group.exported {
                    let when = ISO8601DateFormatter().string(
                        from: Date(timeIntervalSince1970: TimeInterval(group.exportedAt)))
                    lines.append("  exported from FCM at \(when) (\(exported.count)):")
                    lines += list(exported)
                }
            }
            try Terminal.write(lines.joined(separator: "\n") + "\n")
        }
    }
}

struct StateRemoveCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "rm",
        abstract: "Stop managing topics, device groups or audiences, leaving them as they are in FCM.",
        discussion: """
            ADDRESS is topic:NAME, group:NAME or audience:NAME, with the exact name ('tidemark state list' \
            shows them). State forgets each one at once, under the state lock, and nothing is sent to FCM: \
            its memberships stay, and no later plan removes or re-asserts them. A protected topic can be \
            released too, since releasing sends nothing. If the manifests still declare it, the next apply \
            adopts it again (it records the memberships FCM holds and sends nothing for them): delete the \
            declaration too, or list it under 'removed:' with 'unsubscribe: false', which does the same \
            through a reviewed plan. Refused while an apply is unfinished, when any address names what \
            state does not hold (nothing is changed then), and while a 'tidemark serve' owns the workspace \
            and the manifests still declare it (serve would adopt it again within seconds; 'tidemark \
            suspend' first, or delete the declaration).
            """
    )

    @OptionGroup var global: GlobalOptions

    @Argument(help: ArgumentHelp("What to release: topic:NAME, group:NAME or audience:NAME.", valueName: "ADDRESS"))
    var addresses: [String]

    @Flag(help: "Say what would be released; write nothing.")
    var dryRun = false

    @OptionGroup var output: DataFormatOption

    /// `--format json`: what was (or would be) released.
    struct Report: Encodable {
        var dryRun: Bool
        var released: [ReleasedEntry]
        var serial: Int?
        var state: String
    }

    func validate() throws {
        if addresses.isEmpty { throw ValidationError("name at least one ADDRESS, such as topic:weather.") }
    }

    func run() async throws {
        try await runReportingErrors {
            let parsed = try addresses.map { text throws(StateAddressError) in try StateAddress(parsing: text) }
            let runtime = try Runtime(global)
            if !dryRun { try await runtime.refuseWhileServed(parsed, command: "tidemark state rm") }
            let outcome = try await runtime.releaseFromState(parsed, dryRun: dryRun)
            if output.json {
                try Terminal.writeJSON(
                    Report(
                        dryRun: dryRun, released: outcome.released, serial: outcome.serial,
                        state: runtime.stateDisplay))
                return
            }
            var lines: [String] = []
            for entry in outcome.released {
                let kept =
                    entry.address.hasPrefix("topic:")
                    ? "its \(PlanRenderer.counted(entry.observed, "known subscriber")) stay\(entry.observed == 1 ? "s" : "") subscribed"
                    : "its \(PlanRenderer.counted(entry.managed, "member")) stay\(entry.managed == 1 ? "s" : "") as \(entry.managed == 1 ? "it is" : "they are")"
                lines.append(
                    "\(dryRun ? "Would release" : "Released") \(entry.address): \(kept) in FCM; nothing was sent.")
            }
            if dryRun {
                lines.append("Nothing was written; run without --dry-run to release.")
            } else {
                lines.append(
                    "State \(runtime.stateDisplay) is at serial \(outcome.serial.map(String.init) ?? "?"). If the manifests still declare any of these, the next apply adopts it again: delete the declaration too."
                )
            }
            try Terminal.write(lines.joined(separator: "\n") + "\n")
        }
    }
}

struct StateMoveCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "mv",
        abstract: "Move a topic, device group or audience to another workspace or store, sending nothing to FCM.",
        discussion: """
            ADDRESS is topic:NAME, group:NAME or audience:NAME. The entry moves with its memberships and \
            its tokens (when each was last seen, its device, when it left) into the workspace \
            --to-workspace of the same store, or of the store --to-state (a SQLite path or a postgres:// \
            URL); the target must not hold it already, and must belong to the same FCM project. Both \
            states' locks are held. Within one PostgreSQL database the move is one transaction; between \
            stores each side journals it, so a run stopped at any moment (a kill, a lost connection) \
            leaves both states saying so: until the same 'tidemark state mv' is run again, which finishes \
            it, both refuse other commands, and the entry is never acted on in two places. Afterwards, \
            declare it in the target's manifests and delete it from the source's \
            (or the next plans there adopt it back or remove it). Refused while a 'tidemark serve' owns \
            the source workspace and its manifests still declare the entry. The apply history stays with \
            the workspace where each apply ran.
            """
    )

    @OptionGroup var global: GlobalOptions

    @Argument(help: ArgumentHelp("What to move: topic:NAME, group:NAME or audience:NAME.", valueName: "ADDRESS"))
    var address: String

    @Option(help: ArgumentHelp("The workspace to move it to.", valueName: "NAME"))
    var toWorkspace: String

    @Option(
        help: ArgumentHelp(
            "The store to move it to: a SQLite path or a postgres:// URL (default: the same store).",
            valueName: "PATH|URL"))
    var toState: String?

    @OptionGroup var output: DataFormatOption

    /// `--format json`: what moved, between which states.
    struct Report: Encodable {
        var moved: ReleasedEntry
        var from: String
        var to: String
        var resumed: Bool
        var sourceSerial: Int
        var targetSerial: Int
    }

    func run() async throws {
        try await runReportingErrors {
            let parsed = try StateAddress(parsing: address)
            let runtime = try Runtime(global)
            var targetOptions = global
            if let toState { targetOptions.state = toState }
            targetOptions.workspace = toWorkspace
            let target = try Runtime(targetOptions)
            try await runtime.refuseWhileServed([parsed], command: "tidemark state mv")
            let outcome = try await runtime.moveInState(parsed, to: target)
            if let at = runtime.declarations()[parsed] {
                Terminal.err(
                    "warning: workspace '\(runtime.workspaceName)' still declares \(parsed) (\(at)): its next apply would manage it again beside '\(target.workspaceName)', and each would undo the other's changes; delete the declaration there."
                )
            }
            if output.json {
                try Terminal.writeJSON(
                    Report(
                        moved: outcome.moved, from: runtime.stateDisplay, to: target.stateDisplay,
                        resumed: outcome.resumed, sourceSerial: outcome.serials.source,
                        targetSerial: outcome.serials.target))
                return
            }
            let what =
                outcome.moved.address.hasPrefix("topic:")
                ? PlanRenderer.counted(outcome.moved.managed, "managed membership")
                    + " (\(PlanRenderer.formatCount(outcome.moved.observed)) known subscribers)"
                : PlanRenderer.counted(outcome.moved.managed, "member")
            try Terminal.write(
                "\(outcome.resumed ? "Finished the interrupted move of" : "Moved") \(outcome.moved.address) with \(what) from \(runtime.stateDisplay) (serial \(outcome.serials.source)) to \(target.stateDisplay) (serial \(outcome.serials.target)); nothing was sent to FCM. Declare it in the target's manifests and delete it from the source's before their next apply.\n"
            )
        }
    }
}

struct StateLockCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "lock",
        abstract: "Say whether a run holds the state lock, and which.",
        discussion:
            "With SQLite state the lock is an flock(2) lock: the kernel releases it when the holding process ends, even when it is killed. With PostgreSQL state it is a lease row with a heartbeat: it expires when its holder stops renewing it, a lease whose holder process is gone from this machine is taken over at once, and 'tidemark state force-unlock ID' breaks one (recorded). Exit 0 when it is free, 2 when a run holds it."
    )

    @OptionGroup var global: GlobalOptions
    @OptionGroup var output: DataFormatOption

    func run() async throws {
        try await runReportingErrors {
            let runtime = try Runtime(global)
            let report = try await runtime.lockReport(checkingExistence: output.json)
            if output.json {
                try Terminal.writeJSON(report)
            } else {
                try Terminal.write(Self.text(report) + "\n")
            }
            if report.locked { throw ExitCode(2) }
        }
    }

    /// The answer for a person.
    static func text(_ report: StateLockReport) -> String {
        let state = report.state
        if report.locked, let lease = report.lease, let holder = report.holder, let expires = report.expires {
            return
                "The state \(state) is locked: \(holder), lease \(lease.prefix(8)), expiring at \(ISO8601DateFormatter().string(from: expires)) unless renewed."
        }
        if report.locked { return "The state \(state) is locked: \(report.holder.map { "\($0)" } ?? "a run")." }
        if !report.exists { return "There is no state at \(state) yet, and nothing holds its lock." }
        return "The state \(state) is not locked."
    }
}

struct StateForceUnlockCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "force-unlock",
        abstract: "Break the lease a run holds on PostgreSQL state (recorded with who broke it).",
        discussion:
            "Use it when a runner died on another machine and you cannot wait for its lease to expire. The run that held the lease can no longer write (every write checks the lease's fencing counter). ID is the lease id 'tidemark state lock' shows (its first 8 characters are enough). SQLite state needs no force-unlock: its flock(2) lock ends with its process."
    )

    @OptionGroup var global: GlobalOptions

    @Argument(help: ArgumentHelp("The lease id that 'tidemark state lock' shows.", valueName: "ID"))
    var id: String

    func run() async throws {
        try await runReportingErrors {
            let runtime = try Runtime(global)
            // A store whose lock ends with its process (SQLite's flock) refuses, saying there is nothing to force.
            guard let broken = try await runtime.forceUnlock(id) else {
                try Terminal.write("Nothing holds the lock of \(runtime.stateDisplay).\n")
                return
            }
            try Terminal.write(
                "Broke the lease of \(broken) on \(runtime.stateDisplay); that run can no longer write. The break is recorded in tidemark_lease_breaks.\n"
            )
        }
    }
}

struct StatePullCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "pull",
        abstract: "Write a consistent, self-contained snapshot of the state to a SQLite file.",
        discussion:
            "The snapshot keeps the state's lineage, serial and versions; 'tidemark state push FILE' uploads it again. It is read under the state's lock, so it is never half an apply."
    )

    @OptionGroup var global: GlobalOptions

    @Argument(help: ArgumentHelp("The SQLite file to write (must not exist).", valueName: "FILE"))
    var file = "tidemark-state.db"

    func run() async throws {
        try await runReportingErrors {
            let runtime = try Runtime(global)
            guard !FileManager.default.fileExists(atPath: file) else {
                throw CLIError("\(file) exists; remove it or name another file.")
            }
            let state = try await runtime.copyState(to: runtime.snapshotStore(file), .emptyTarget)
            try? FileManager.default.removeItem(atPath: file + ".lock")
            try Terminal.write(
                "Wrote \(runtime.stateDisplay) (lineage \(state.lineage.prefix(8)), serial \(state.serial)) to \(file).\n"
            )
        }
    }
}

struct StatePushCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "push",
        abstract: "Upload a SQLite state snapshot into the configured store.",
        discussion:
            "Refused when the store holds another lineage, or the same lineage at the same or a newer serial: an older snapshot never overwrites newer state."
    )

    @OptionGroup var global: GlobalOptions

    @Argument(help: ArgumentHelp("A SQLite state file ('tidemark state pull' writes one).", valueName: "FILE"))
    var file: String

    func run() async throws {
        try await runReportingErrors {
            let runtime = try Runtime(global)
            guard FileManager.default.fileExists(atPath: file) else { throw CLIError("\(file): no such file.") }
            let state = try await runtime.copyState(from: runtime.snapshotStore(file), .newerThanTarget)
            try Terminal.write("Pushed \(file) (serial \(state.serial)) to \(runtime.stateDisplay).\n")
        }
    }
}

struct StateMigrateCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "migrate",
        abstract: "Move the state to another store or workspace (a SQLite path or a postgres:// URL).",
        discussion:
            "The target must hold no state. The source is left as it was; point 'state' (and 'workspace') in tidemark.yaml at the target afterwards."
    )

    @OptionGroup var global: GlobalOptions

    @Option(help: ArgumentHelp("Where to move the state: a SQLite path or a postgres:// URL.", valueName: "PATH|URL"))
    var to: String

    @Option(help: ArgumentHelp("The target workspace (default: the current one).", valueName: "NAME"))
    var toWorkspace: String?

    func run() async throws {
        try await runReportingErrors {
            let runtime = try Runtime(global)
            var targetOptions = global
            targetOptions.state = to
            targetOptions.workspace = toWorkspace ?? runtime.workspaceName
            let target = try Runtime(targetOptions)
            guard target.stateDisplay != runtime.stateDisplay else {
                throw CLIError("the target is the state itself (\(runtime.stateDisplay)).")
            }
            let state = try await runtime.copyState(to: target.stateStore(), .emptyTarget)
            try Terminal.write(
                "Copied \(runtime.stateDisplay) (serial \(state.serial)) to \(target.stateDisplay). Point 'state' in tidemark.yaml (or TIDEMARK_STATE_URL) there; the old state was left as it was.\n"
            )
        }
    }
}

struct StatePruneCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "prune",
        abstract: "Forget dead tokens and tokens that left the inventory, once they have been gone a while.",
        discussion: """
            A token is forgotten when the manifests and inventory stopped declaring it at least --older-than \
            ago (default: 'prune_after' in tidemark.yaml, else 90d; an apply notes when a token leaves), and \
            it is either dead (FCM reported it unregistered) or holds no membership tidemark manages (an \
            apply unsubscribed it already). Its observed memberships go with it. Refused while an apply is unfinished or the \
            inventory cannot be read. With 'prune_after' set, apply prunes on its own when at least 1,000 \
            tokens (or a tenth of state) can go. Pruning rewrites every topic's row, so plans saved before \
            it are stale.
            """
    )

    @OptionGroup var global: GlobalOptions

    @Option(
        help: ArgumentHelp(
            "Forget only tokens that left at least this long ago (such as 90d, 12w).", valueName: "AGE"))
    var olderThan: String?

    @Flag(help: "Say what would be forgotten; write nothing.")
    var dryRun = false

    @OptionGroup var output: DataFormatOption

    /// `--format json`: what was (or would be) forgotten.
    struct Report: Encodable {
        var dryRun: Bool
        var olderThan: String
        var tokensBefore: Int
        var pruned: Int
        var dead: Int
        var departed: Int
        var serial: Int?
        var state: String
    }

    func validate() throws {
        if let olderThan, Quantities.seconds(olderThan) == nil {
            throw ValidationError("--older-than must be a duration such as 90d or 12w, not '\(olderThan)'.")
        }
    }

    func run() async throws {
        try await runReportingErrors {
            let runtime = try Runtime(global)
            let (retention, age) = runtime.pruneRetention(olderThan)
            let outcome = try await TerminalOutput.during {
                try await runtime.prune(retention: retention, dryRun: dryRun, output: $0)
            }
            if output.json {
                let selection = outcome.selection
                try Terminal.writeJSON(
                    Report(
                        dryRun: dryRun, olderThan: age, tokensBefore: outcome.tokensBefore, pruned: selection.count,
                        dead: selection.dead.count, departed: selection.departed.count, serial: outcome.serial,
                        state: runtime.stateDisplay))
                return
            }
            try Terminal.write(Self.describe(outcome, age: age, dryRun: dryRun, state: runtime.stateDisplay) + "\n")
        }
    }

    static func describe(_ outcome: PruneOutcome, age: String, dryRun: Bool, state: String) -> String {
        let selection = outcome.selection
        guard !selection.isEmpty else {
            return
                "Nothing to prune in \(state): no token left the inventory \(age) or more ago without a membership tidemark still manages."
        }
        let what =
            "\(PlanRenderer.formatCount(selection.count)) of \(PlanRenderer.formatCount(outcome.tokensBefore)) tokens (\(PlanRenderer.formatCount(selection.dead.count)) dead, \(PlanRenderer.formatCount(selection.departed.count)) no longer in the inventory), gone for \(age) or more"
        if dryRun { return "Would prune \(what) from \(state). Run without --dry-run to forget them." }
        return "Pruned \(what) from \(state); serial \(outcome.serial.map(String.init) ?? "?")."
    }
}
