/// Renders a plan for people: the verdict first, destructive changes called out, tokens redacted.
public struct PlanRenderer: Sendable {
    /// Full tokens instead of redacted ones (`--show-tokens`).
    public var showTokens: Bool
    /// Tokens listed per topic and operation before "… and N more".
    public var tokensPerSection: Int
    /// Names a token's device, when the inventory knows it.
    public var deviceName: @Sendable (String) -> String?
    /// Columns the output is wrapped to (a terminal's width); nil leaves lines whole, for logs and grep.
    public var width: Int?

    /// A renderer with these limits; tokens redacted by default.
    public init(
        showTokens: Bool = false, tokensPerSection: Int = 5, width: Int? = nil,
        deviceName: @escaping @Sendable (String) -> String? = { _ in nil }
    ) {
        self.showTokens = showTokens
        self.tokensPerSection = tokensPerSection
        self.width = width
        self.deviceName = deviceName
    }

    /// 0.113 → "11%", 0.004 → "0.4%", 0.00004 → "<0.1%".
    public static func formatShare(_ share: Double) -> String {
        let percent = share * 100
        if percent > 0, percent < 0.1 { return "<0.1%" }
        if percent < 100, percent >= 99.5 { return ">99%" }
        if percent < 10, percent != percent.rounded() { return String(format: "%.1f%%", percent) }
        return "\(Int(percent.rounded()))%"
    }

    /// 1234567 → "1,234,567".
    public static func formatCount(_ n: Int) -> String {
        let digits = String(abs(n))
        var result = ""
        for (i, c) in digits.enumerated() {
            if i > 0, (digits.count - i) % 3 == 0 { result.append(",") }
            result.append(c)
        }
        return (n < 0 ? "-" : "") + result
    }

    /// "1 device group", "2 device groups", "1,204 requests": the count and its noun, plural but for one
    /// (`plural` when adding "s" is not the plural).
    public static func counted(_ n: Int, _ noun: String, plural: String? = nil) -> String {
        "\(formatCount(n)) \(n == 1 ? noun : plural ?? noun + "s")"
    }

    /// "Plan: 3 topics and 1 group change: +1,204 subscriptions, −37 unsubscriptions".
    public func verdict(_ plan: Plan) -> String {
        let verdict = changeVerdict(plan)
        // A drift-only plan compares FCM with what the last apply established, not with the manifests.
        guard plan.driftOnly != nil else { return verdict }
        return verdict.replacingOccurrences(
            of: "matches the manifests", with: "matches what the last apply established")
    }

    /// "Drift only: …", for a plan made with `--drift-only`; nil otherwise.
    public static func driftOnlyLine(_ plan: Plan) -> String? {
        guard let note = plan.driftOnly else { return nil }
        let waiting =
            note.waiting == 0
            ? "nothing else is waiting: the manifests and inventory call for no other change."
            : "\(formatCount(note.waiting)) change\(note.waiting == 1 ? "" : "s") the manifests and inventory call for \(note.waiting == 1 ? "waits" : "wait") for a normal 'tidemark apply'."
        return "Drift only: this plan re-asserts what the last apply established and corrects nothing else; \(waiting)"
    }

    private func changeVerdict(_ plan: Plan) -> String {
        guard plan.hasChanges else {
            let dead = plan.observations.dead.count
            if dead > 0 {
                // Never a green all-clear while declared devices cannot be reached.
                return
                    "No changes to make in FCM, but \(Self.formatCount(dead)) token\(dead == 1 ? " is" : "s are") no longer registered: those devices cannot be subscribed until the inventory has their new tokens."
            }
            let optedOut = plan.optedOut ?? 0
            let respected =
                optedOut == 0
                ? ""
                : ", but for \(Self.formatCount(optedOut)) device\(optedOut == 1 ? "" : "s") that opted out in the app (respected)"
            if let coverage = plan.coverage, coverage.mode == .touched || coverage.mode == .sample,
                !coverage.readWholeFleet
            {
                return Self.partialVerdict(coverage, respected: respected)
            }
            return
                "No changes. FCM matches the manifests\(respected)\(plan.refreshed ? "" : " (as recorded in state; not refreshed)")."
        }
        let (topics, groups, audiences) = plan.changedCounts
        var parts: [String] = []
        if topics > 0 { parts.append("\(Self.formatCount(topics)) topic\(topics == 1 ? "" : "s")") }
        if groups > 0 { parts.append("\(Self.formatCount(groups)) group\(groups == 1 ? "" : "s")") }
        if audiences > 0 { parts.append("\(Self.formatCount(audiences)) audience\(audiences == 1 ? "" : "s")") }
        let change = topics + groups + audiences == 1 ? "changes" : "change"
        var counts: [String] = []
        let groupCalls = plan.operations.filter { $0.kind.isGroupCall }.count
        // A plan that only writes audiences in state says so rather than "+0 subscriptions, −0 …".
        if topics > 0 || groups > 0 {
            counts.append(
                "+\(Self.formatCount(plan.subscribeCount)) subscription\(plan.subscribeCount == 1 ? "" : "s")")
            counts.append(
                "−\(Self.formatCount(plan.unsubscribeCount)) unsubscription\(plan.unsubscribeCount == 1 ? "" : "s")")
        }
        if groupCalls > 0 { counts.append("\(groupCalls) group call\(groupCalls == 1 ? "" : "s")") }
        if counts.isEmpty { counts.append("state only, nothing sent to FCM") }
        let rotated = plan.rotations?.count ?? 0
        let rotation =
            rotated == 0
            ? ""
            : " (\(Self.formatCount(rotated)) device\(rotated == 1 ? "" : "s") rotated \(rotated == 1 ? "its token" : "their tokens"))"
        return "Plan: \(parts.joined(separator: " and ")) \(change): \(counts.joined(separator: ", "))\(rotation)."
    }

    /// The plan as text; what came from files shows its control characters escaped.
    public func render(_ plan: Plan) -> String {
        var renderer = self
        renderer.deviceName = Self.naming(plan, deviceName)
        return renderer.renderLines(plan).escapingControlCharacters
    }

    /// What a rail holds: in a plan made beside them, what waits; in a refused plan, what
    /// `--skip-held` (and `serve`) would hold and what would go on beside them.
    static func heldLines(_ plan: Plan) -> [String] {
        guard let held = plan.held, !held.isEmpty else { return [] }
        var out = [""]
        if let beside = plan.beside {
            out.append(
                "Held by a rail: 'tidemark apply' refuses the whole plan; with --skip-held (and in 'tidemark serve') \(held.count == 1 ? "this waits" : "these wait"):"
            )
            out += held.map { "  ‖ \($0.subject)  \($0.rail)\($0.at.map { " at \($0)" } ?? "")" }
            if let errors = beside.errors {
                out.append(
                    "  and what remains is still refused: \(errors.first ?? "")\(errors.count > 1 ? " (and \(errors.count - 1) more)" : "")"
                )
            } else if beside.operations == 0 {
                out.append("  and nothing else would change.")
            } else {
                out.append(
                    "  and the rest would be applied: +\(formatCount(beside.subscribes)) −\(formatCount(beside.unsubscribes)) memberships in \(counted(beside.topics, "topic"))\(beside.groups > 0 ? ", \(counted(beside.groups, "device group or audience", plural: "device groups or audiences"))" : "") (\(counted(beside.operations, "operation")))."
                )
            }
        } else {
            out.append(
                "Held by a rail (not in this plan; \(held.count == 1 ? "its changes wait" : "their changes wait") until \(held.count == 1 ? "its" : "their") plan passes):"
            )
            for hold in held {
                out.append("  ‖ \(hold.subject)  \(hold.rail)\(hold.at.map { " at \($0)" } ?? "")")
                out.append("      \(hold.message)")
            }
        }
        return out
    }

    private func renderLines(_ plan: Plan) -> String {
        var out: [String] = []
        let errors = plan.diagnostics.filter { $0.severity == .error }.count
        if errors > 0 {
            out.append("Error: this plan cannot be applied (\(errors) error\(errors == 1 ? "" : "s"), listed below).")
        }
        out.append(verdict(plan))
        if let line = Self.driftOnlyLine(plan) {
            out.append("")
            out.append(line)
        }
        if let shadow = plan.shadowVerify {
            out.append("")
            out.append(shadow.verdict)
            out += shadow.lines(show: show).map { "  " + $0 }
        }
        if plan.isPartial {
            out.append("")
            out.append(
                "Partial plan (\(plan.selectionSummary)): topics and groups outside the selection are not planned and may have changes of their own."
            )
        }
        out += Self.heldLines(plan)
        let destructive = Self.destructiveLines(Self.flagged(plan))
        if let legend = Self.symbolLegend(plan, flagged: !destructive.isEmpty) {
            out.append("")
            out.append(legend)
        }
        if !destructive.isEmpty {
            out.append("")
            out.append("Destructive changes:")
            out += destructive.map { "  ! " + $0 }
        }
        let rotated = rotationLines(plan)
        if !rotated.isEmpty {
            out.append("")
            out.append("Rotated tokens (the same device with a new token; its memberships move, nothing is lost):")
            out += rotated.map { "  ~ " + $0 }
        }
        let index = OperationIndex(plan)
        let legend = Legend(plan)
        if !plan.topics.isEmpty {
            out.append("")
            out.append("Topics:")
            let width = min(32, plan.topics.map(\.topic.count).max() ?? 0)
            let sizes = plan.topics.map { Self.size($0) ?? "" }
            let sizeWidth = sizes.map(\.count).max() ?? 0
            for (change, size) in zip(plan.topics, sizes) {
                let name = change.topic.padding(toLength: max(width, change.topic.count), withPad: " ", startingAt: 0)
                let sized = size.isEmpty ? "" : "  " + size.padding(toLength: sizeWidth, withPad: " ", startingAt: 0)
                out.append(
                    "  \(Self.symbol(change)) \(name)  \(change.mode.rawValue.padding(toLength: 13, withPad: " ", startingAt: 0))\(sized)  +\(Self.formatCount(change.subscribe))  −\(Self.formatCount(change.unsubscribe))"
                )
                if let previous = change.previousMode {
                    out.append(
                        "      mode: \(previous.rawValue) → \(change.mode.rawValue)\(Self.modeChangeNote(previous, change.mode))"
                    )
                }
                out += Self.reasonLines(change).map { "      " + $0 }
                out += legend.inline(change.notes).map { "      note: \($0)" }
                out += tokenLines(index, topic: change.topic)
            }
        }
        for audiences in [false, true] {
            let changes = plan.groups.filter { ($0.audience ?? false) == audiences }
            guard !changes.isEmpty else { continue }
            out.append("")
            out.append(audiences ? "Audiences (named sets in state; no FCM group):" : "Device groups:")
            for change in changes {
                out.append(
                    "  \(Self.symbol(change)) \(change.group)  \(change.action.rawValue)  +\(change.add)  −\(change.remove)"
                )
                out += legend.inline(change.notes).map { "      note: \($0)" }
                for op in index.groupOperations(change.group) {
                    let verb =
                        switch op.kind {
                        case .groupCreate: "create with"
                        case .groupAdd: "add"
                        default: "remove"
                        }
                    out.append("      \(verb): \(op.tokens.map(show).joined(separator: ", "))")
                }
            }
        }
        if !legend.entries.isEmpty {
            out.append("")
            out.append("Notes:")
            out += legend.entries.enumerated().map { "  [\($0.offset + 1)] \($0.element)" }
        }
        let notable = plan.diagnostics.filter { $0.severity >= .warning }
        if !notable.isEmpty {
            out.append("")
            out += notable.map(\.description)
        }
        out.append("")
        out.append(provenance(plan))
        let lines = width.map { width in out.flatMap { Self.wrap($0, width: width) } } ?? out
        return lines.joined(separator: "\n") + "\n"
    }

    /// A topic's symbol: `+` new (no known subscriber before), `-` leaving the manifests, `~` changed.
    public static func symbol(_ change: TopicChange) -> String {
        if change.released == true { return "=" }
        if change.removedFromManifests { return "-" }
        if let before = change.before { return before == 0 && change.previousMode == nil ? "+" : "~" }
        // A plan from before sizes were recorded: a topic that only gains members may be new.
        return change.unsubscribe > 0 || change.previousMode != nil ? "~" : "+"
    }

    /// A group's or audience's symbol, by what happens to it.
    public static func symbol(_ change: GroupChange) -> String {
        switch change.action {
        case .create: "+"
        case .delete, .retire: "-"
        case .update, .adopt, .convert: "~"
        case .release: "="
        }
    }

    /// One line saying what the plan's symbols mean, only those it uses (`!` when something is
    /// `flagged`); nil when it shows none.
    public static func symbolLegend(_ plan: Plan, flagged: Bool) -> String? {
        let used = Set(plan.topics.map(symbol) + plan.groups.map(symbol))
        guard !used.isEmpty else { return nil }
        var meanings: [String] = []
        if used.contains("+") { meanings.append("+ new (no known member before)") }
        if used.contains("~") { meanings.append("~ changes") }
        if used.contains("-") { meanings.append("- leaves the manifests (tidemark removes the members it added)") }
        if used.contains("=") { meanings.append("= released (left as it is in FCM; state forgets it)") }
        let review = flagged ? "; ! calls for a careful review" : ""
        return "Symbols: \(meanings.joined(separator: ", ")); under each, + joins and − leaves\(review)."
    }

    /// `base`, and for the tokens it cannot name, the devices the plan itself knows: a departed
    /// device's old token, a rotated device's old token.
    static func naming(
        _ plan: Plan, _ base: @escaping @Sendable (String) -> String?
    ) -> @Sendable (String) -> String? {
        let departed = Dictionary(
            (plan.departed ?? []).map { ($0.token, $0.device) }, uniquingKeysWith: { a, _ in a })
        let rotated = Dictionary((plan.rotations ?? []).map { ($0.from, $0.device) }, uniquingKeysWith: { a, _ in a })
        guard !departed.isEmpty || !rotated.isEmpty else { return base }
        return { token in
            base(token) ?? departed[token].map { "device \($0), left the inventory" }
                ?? rotated[token].map { "device \($0), its old token" }
        }
    }

    /// "500 → 435 (−13%)", "0 → 896 (new)": a topic's known subscribers before and after; nil in
    /// plans made before sizes were recorded.
    public static func size(_ change: TopicChange) -> String? {
        guard let before = change.before, let after = change.after else { return nil }
        let delta: String
        if before == 0 {
            delta = after == 0 ? "" : " (new)"
        } else if after == before {
            delta = " (±0%)"
        } else {
            let share = formatShare(Double(abs(after - before)) / Double(before))
            delta = " (\(after > before ? "+" : "−")\(share))"
        }
        return "\(formatCount(before)) → \(formatCount(after))\(delta)"
    }

    /// "+ 120  selector {locale: en-GB} (manifests/weather.yaml:14)", one line per cause.
    static func reasonLines(_ change: TopicChange) -> [String] {
        (change.reasons ?? []).map { reason in
            let sign = reason.direction == .join ? "+" : "−"
            return "\(sign) \(formatCount(reason.count))  \(reason.why)\(reason.at.map { " (\($0))" } ?? "")"
        }
    }

    /// What a mode change does, for the reviewer.
    static func modeChangeNote(_ from: TopicMode, _ to: TopicMode) -> String {
        switch (from, to) {
        case (.additive, .authoritative):
            " (devices tidemark knows that are not declared are removed from now on)"
        case (.authoritative, .additive):
            " (subscriptions made outside tidemark are left alone from now on)"
        default: ""
        }
    }

    /// Lines longer than `width` wrapped at spaces, continuations indented under the text.
    static func wrap(_ line: String, width: Int) -> [String] {
        guard line.count > width else { return [line] }
        let indent = line.prefix { $0 == " " }.count
        let hanging = String(repeating: " ", count: min(indent + 4, width / 2))
        var lines: [String] = []
        var current = ""
        for word in line.dropFirst(indent).split(separator: " ", omittingEmptySubsequences: false) {
            let prefix = lines.isEmpty ? String(repeating: " ", count: indent) : hanging
            if current.isEmpty {
                current = prefix + word
            } else if current.count + 1 + word.count <= width {
                current += " " + word
            } else {
                lines.append(current)
                current = hanging + word
            }
        }
        if !current.isEmpty { lines.append(current) }
        return lines
    }

    /// The topics and groups whose changes call for a careful review, and why: removals that lose
    /// members (never rotations) from authoritative, protected or departing topics or past a topic's
    /// share, and deleted device groups.
    public static func flagged(_ plan: Plan) -> [PlanSummary.Flagged] {
        var flagged: [PlanSummary.Flagged] = []
        for change in plan.topics {
            let reasons = change.before == nil ? legacyReasons(change) : change.destructiveReasons
            guard !reasons.isEmpty else { continue }
            flagged.append(.init(kind: "topic", name: change.topic, removes: change.losses, reasons: reasons))
        }
        let groupCalls = Set(plan.operations.filter { $0.kind == .groupRemove }.map(\.target))
        for change in plan.groups {
            if change.audience != true, change.action == .delete {
                flagged.append(
                    .init(kind: "group", name: change.group, removes: change.remove, reasons: ["device group deleted"]))
            } else if change.audience == true, change.action == .retire || change.action == .delete,
                groupCalls.contains(change.group)
            {
                flagged.append(
                    .init(
                        kind: "audience", name: change.group, removes: change.remove,
                        reasons: ["the FCM device group behind it is deleted"]))
            }
        }
        return flagged
    }

    /// What a reviewer must look at (`flagged`), one line each.
    static func destructiveLines(_ flagged: [PlanSummary.Flagged]) -> [String] {
        flagged.map { item in
            switch item.kind {
            case "topic":
                "\(Self.counted(item.removes, "unsubscription")) from '\(item.name)' (\(item.reasons.joined(separator: "; ")))"
            case "group": "device group '\(item.name)' will be deleted (all \(item.removes) members removed)"
            default: "the FCM device group behind audience '\(item.name)' will be deleted (its members removed)"
            }
        }
    }

    /// A plan saved before sizes were recorded: removals from authoritative topics and topics leaving
    /// the manifests.
    static func legacyReasons(_ change: TopicChange) -> [String] {
        guard change.losses > 0 else { return [] }
        if change.removedFromManifests { return ["topic removed from the manifests"] }
        return change.mode == .authoritative ? ["authoritative topic"] : []
    }

    private func tokenLines(_ index: OperationIndex, topic: String) -> [String] {
        var lines: [String] = []
        for kind in [PlannedOperation.Kind.unsubscribe, .subscribe] {
            let ops = index.operations(kind, topic)
            let total = ops.reduce(0) { $0 + $1.tokens.count }
            guard total > 0 else { continue }
            let sign = kind == .subscribe ? "+" : "−"
            var shown = 0
            outer: for op in ops {
                for token in op.tokens {
                    if shown == tokensPerSection { break outer }
                    lines.append("      \(sign) \(show(token))")
                    shown += 1
                }
            }
            if total > shown { lines.append("      \(sign) … and \(Self.formatCount(total - shown)) more") }
            if ops.count > 1 { lines.append("        (\(ops.count) batches of up to \(FCMLimits.maxBatchTokens))") }
        }
        return lines
    }

    private func show(_ token: String) -> String {
        let shown = showTokens ? token : Redaction.redact(token)
        if let device = deviceName(token) { return "\(shown) (\(device))" }
        return shown
    }

    /// One line per rotated device (at most 20, then a count).
    func rotationLines(_ plan: Plan) -> [String] {
        let rotations = plan.rotations ?? []
        var lines = rotations.prefix(20).map { r in
            let shown = { (token: String) in showTokens ? token : Redaction.redact(token) }
            return
                "device \(r.device): \(shown(r.from)) → \(shown(r.to)) (−\(r.unsubscribes) +\(r.subscribes) membership\(r.subscribes == 1 ? "" : "s"))"
        }
        if rotations.count > 20 {
            lines.append("… and \(PlanRenderer.counted(rotations.count - 20, "more rotated device"))")
        }
        return lines
    }

    /// A "No changes" that read only part of the fleet says how far it looked, and claims the whole
    /// fleet only when a completed sweep read the rest.
    static func partialVerdict(_ coverage: RefreshCoverage, respected: String) -> String {
        let read =
            "\(formatCount(coverage.read)) registration\(coverage.read == 1 ? "" : "s") read, \(formatShare(coverage.fleet == 0 ? 1 : Double(coverage.read) / Double(coverage.fleet))) of the fleet"
        if coverage.read == 0 {
            let age = coverage.oldestUnread.map { " at most \(formatAge(coverage.at - $0)) ago" } ?? ""
            if coverage.neverRead == 0 {
                return
                    "No changes. FCM matches the manifests\(respected) as last read: no registration needed reading now, and every one was read\(age), by the completed sweep."
            }
            return
                "No changes to what state records\(respected); nothing was read now, and \(formatCount(coverage.neverRead)) registrations have never been read, so FCM is not known to match for them."
        }
        if coverage.neverRead == 0 {
            let rest = coverage.oldestUnread.map { "at most \(formatAge(coverage.at - $0)) ago" } ?? "before"
            return
                "No changes. FCM matches the manifests\(respected) among the \(read); the rest were last read \(rest), by the completed sweep."
        }
        let earlier =
            coverage.oldestUnread.map { " (the others last read at most \(formatAge(coverage.at - $0)) ago)" } ?? ""
        let sweep =
            coverage.runsToCompleteSweep.map {
                " The sweep reads the rest in about \($0) more appl\($0 == 1 ? "y" : "ies")."
            } ?? " Run with --refresh all to read them."
        return
            "No changes among the \(read)\(respected); \(formatCount(coverage.neverRead)) have never been read, so FCM is not known to match for them\(earlier).\(sweep)"
    }

    /// "Read 2,140 of 21,400 registrations (10%): 140 the plan changes, 2,000 of the sweep."
    public static func coverageSentence(_ coverage: RefreshCoverage) -> String {
        switch coverage.mode {
        case .none: return "Read nothing from FCM (--refresh none)."
        case .all: return "Read all \(formatCount(coverage.read)) registrations (--refresh all)."
        case .touched, .sample:
            var parts: [String] = []
            if coverage.touched > 0 { parts.append("\(formatCount(coverage.touched)) the plan changes") }
            if coverage.stale > 0 { parts.append("\(formatCount(coverage.stale)) past refresh_max_age") }
            if coverage.sampled > 0 { parts.append("\(formatCount(coverage.sampled)) of the sweep") }
            let share = formatShare(coverage.fleet == 0 ? 1 : Double(coverage.read) / Double(coverage.fleet))
            var text =
                "Read \(formatCount(coverage.read)) of \(formatCount(coverage.fleet)) registrations (\(share), --refresh \(coverage.mode.rawValue))\(parts.isEmpty ? "" : ": " + parts.joined(separator: ", "))."
            if coverage.read < coverage.fleet {
                if coverage.neverRead > 0 {
                    text += " \(formatCount(coverage.neverRead)) never read yet"
                    text +=
                        coverage.runsToCompleteSweep.map {
                            " (the sweep reaches them in about \($0) more appl\($0 == 1 ? "y" : "ies"))."
                        } ?? "."
                }
                if let oldest = coverage.oldestUnread {
                    text += " The rest were last read at most \(formatAge(coverage.at - oldest)) ago."
                }
            }
            return text
        }
    }

    /// 45 → "1 minute", 7_200 → "2 hours", 259_200 → "3 days".
    public static func formatAge(_ seconds: Int64) -> String {
        let s = max(0, seconds)
        let (n, unit): (Int64, String) =
            s < 5_400
            ? (max(1, (s + 30) / 60), "minute")
            : s < 172_800 ? ((s + 1_800) / 3_600, "hour") : ((s + 43_200) / 86_400, "day")
        return "\(n) \(unit)\(n == 1 ? "" : "s")"
    }

    /// The footer: what the plan read from FCM, what applying it sends, and what it was made from.
    func provenance(_ plan: Plan) -> String {
        var read =
            plan.refreshed ? "after reading the backend" : "from state only (--refresh none), reading nothing from FCM"
        if let coverage = plan.coverage, coverage.mode != .none {
            let requests = plan.reads.map { ", \(Self.counted($0, "request"))" } ?? ""
            read =
                "after reading \(Self.formatCount(coverage.read)) of \(Self.formatCount(coverage.fleet)) registrations from FCM (--refresh \(coverage.mode.rawValue)\(requests))"
        }
        let sends: String
        if let requests = plan.requests {
            sends =
                requests == 0
                ? "applying it sends nothing to FCM" : "applying it sends \(Self.counted(requests, "request")) to FCM"
        } else {
            sends = "applying it runs \(Self.counted(plan.operations.count, "operation"))"
        }
        let state = plan.lineage.isEmpty ? "no state yet" : "state \(plan.lineage.prefix(8)) serial \(plan.serial)"
        let manifests =
            plan.manifestFiles.map { "manifest files sha256:\($0.prefix(12))" }
            ?? "manifests sha256:\(plan.manifestsDigest.prefix(12))"
        return
            "Computed \(read); \(sends). Made from \(state); \(manifests); backend \(plan.backend).\(Self.inventoryLine(plan).map { " " + $0 } ?? "")"
    }

    /// What the counted sources (queries, commands) read, for the provenance line; nil when there are none.
    static func inventoryLine(_ plan: Plan) -> String? {
        let counted = (plan.inventory ?? []).compactMap { record -> String? in
            guard let rows = record.rows else { return nil }
            let left = record.excluded.flatMap { $0 > 0 ? " (\(formatCount($0)) left out by exclude_if)" : nil } ?? ""
            let digest = record.identity.count == 64 ? " sha256:\(record.identity.prefix(12))" : ""
            return "\(record.source) \(formatCount(rows)) device\(rows == 1 ? "" : "s")\(left)\(digest)"
        }
        return counted.isEmpty ? nil : "Inventory read: \(counted.joined(separator: ", "))."
    }
}

/// Notes that several topics or groups share, said once at the end and referred to by number.
struct Legend {
    /// The shared notes, in order of first appearance.
    let entries: [String]
    private let numbers: [String: Int]

    init(_ plan: Plan) {
        var seen: [String: Int] = [:]
        var order: [String] = []
        for note in plan.topics.flatMap(\.notes) + plan.groups.flatMap(\.notes) {
            if seen[note] == nil { order.append(note) }
            seen[note, default: 0] += 1
        }
        entries = order.filter { seen[$0]! > 1 }
        numbers = Dictionary(uniqueKeysWithValues: entries.enumerated().map { ($0.element, $0.offset + 1) })
    }

    /// A row's notes: shared ones as "[N]", the rest in full.
    func inline(_ notes: [String]) -> [String] {
        let shared = notes.compactMap { numbers[$0] }.map { "[\($0)]" }
        let own = notes.filter { numbers[$0] == nil }
        return own + (shared.isEmpty ? [] : [shared.joined(separator: " ")])
    }

    /// The same, for a table cell.
    func cell(_ notes: [String], escape: (String) -> String) -> String {
        inline(notes).map(escape).joined(separator: "; ")
    }
}
