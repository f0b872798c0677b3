/// Renders a plan as pull-request comments: the verdict first, destructive changes on top, a summary
/// table, per-topic detail (collapsed when long), tokens redacted, split into parts that each fit
/// one comment.
public struct MarkdownPlanRenderer: Sendable {
    /// Full tokens instead of redacted ones (`--show-tokens`).
    public var showTokens: Bool
    /// Tokens listed per topic (or group) and direction before "… and N more".
    public var tokensPerSection: Int
    /// Detail longer than this many lines goes into a collapsed `<details>` block.
    public var collapseAfter: Int
    /// Where the whole plan can be read, named in the last part when not everything fit.
    public var fullPlanHint: String?
    /// The saved plan the comment is about: its next step is said.
    public var planFile: String?
    /// How the comment is split into parts.
    public var packer: MarkdownPacker
    /// Names a token's device, when the inventory knows it.
    public var deviceName: @Sendable (String) -> String?
    /// Where the plan was made (workspace, environment, commit), said under the verdict.
    public var context: PlanContext?

    /// A renderer with these limits; tokens redacted by default.
    public init(
        showTokens: Bool = false, tokensPerSection: Int = 50, collapseAfter: Int = 12,
        fullPlanHint: String? = nil, packer: MarkdownPacker = MarkdownPacker(),
        deviceName: @escaping @Sendable (String) -> String? = { _ in nil }
    ) {
        self.showTokens = showTokens
        self.tokensPerSection = tokensPerSection
        self.collapseAfter = collapseAfter
        self.fullPlanHint = fullPlanHint
        self.packer = packer
        self.deviceName = deviceName
    }

    /// The comment parts, in order; one part for most plans.
    public func render(_ plan: Plan) -> [String] {
        var renderer = self
        renderer.deviceName = PlanRenderer.naming(plan, deviceName)
        return renderer.renderParts(plan).map(\.escapingControlCharacters)
    }

    private func renderParts(_ plan: Plan) -> [String] {
        let text = PlanRenderer()
        let flagged = PlanRenderer.flagged(plan)
        let icon = plan.diagnostics.hasErrors ? "❌" : !flagged.isEmpty ? "⚠️" : plan.hasChanges ? "📝" : "✅"
        let head = "### \(icon) tidemark: \(Self.escape(text.verdict(plan)))"
        var blocks: [MarkdownBlock] = [.text(Self.contextLine(plan, context, flagged: flagged.count))]
        // What calls for review, by name: its table row is marked and its detail shown open.
        let riskyTopics = Set(flagged.filter { $0.kind == "topic" }.map(\.name))
        let riskyGroups = Set(flagged.filter { $0.kind != "topic" }.map(\.name))
        if let line = PlanRenderer.driftOnlyLine(plan) { blocks.append(.text("> " + Self.escape(line))) }
        if let shadow = plan.shadowVerify {
            blocks.append(.text("> **" + Self.escape(shadow.verdict) + "**"))
            let lines = shadow.lines(show: show)
            if !lines.isEmpty { blocks.append(detailBlock(title: "Shadow verify differences", lines: lines)) }
        }
        if plan.isPartial {
            blocks.append(
                .text(
                    "> **Partial plan** (\(Self.escape(plan.selectionSummary))): topics and groups outside the selection are not planned and may have changes of their own."
                ))
        }
        let held = PlanRenderer.heldLines(plan).dropFirst()
        if let title = held.first {
            blocks.append(
                MarkdownBlock(
                    open: "**\(Self.escape(title))**\n",
                    lines: held.dropFirst().map {
                        "- "
                            + Self.escape(
                                $0.trimmingCharacters(in: .whitespaces).replacingOccurrences(of: "‖ ", with: ""))
                    }))
        }
        let errors = plan.diagnostics.filter { $0.severity == .error }
        if !errors.isEmpty {
            blocks.append(
                MarkdownBlock(
                    open: "**Errors** (this plan cannot be applied):\n",
                    lines: errors.map { "- " + Self.escape($0.description) }))
        }
        let destructive = PlanRenderer.destructiveLines(flagged)
        if !destructive.isEmpty {
            var lines = destructive.prefix(25).map { "- " + Self.escape($0) }
            if destructive.count > 25 { lines.append("- … and \(destructive.count - 25) more (see the table)") }
            blocks.append(MarkdownBlock(open: "**⚠️ Destructive changes**\n", lines: lines))
        }
        let removals = Self.removalsByCause(plan)
        if !removals.isEmpty {
            blocks.append(
                MarkdownBlock(open: "**Removals by cause** (rotated tokens not counted):\n", lines: removals))
        }
        let rotated = PlanRenderer(showTokens: false).rotationLines(plan)
        if !rotated.isEmpty {
            let title =
                "Rotated tokens: \(PlanRenderer.counted(rotated.count, "device")) with a new token (\(rotated.count == 1 ? "its" : "their") memberships move; nothing is lost)"
            blocks.append(
                MarkdownBlock(
                    open: "<details><summary>\(title)</summary>\n", lines: rotated.map { "- " + Self.escape($0) },
                    close: "\n</details>", reopen: "<details><summary>\(title) (continued)</summary>\n"))
        }
        let legend = Legend(plan)
        if !plan.topics.isEmpty || !plan.groups.isEmpty {
            var rows: [String] = []
            for change in plan.topics {
                var mode = change.mode.rawValue
                if change.released == true {
                    mode += ", released"
                } else if change.removedFromManifests {
                    mode += ", removed"
                }
                if let previous = change.previousMode { mode = "**\(previous.rawValue) → \(change.mode.rawValue)**" }
                var why = (change.reasons ?? []).map(Self.reason)
                if let previous = change.previousMode {
                    let effect = PlanRenderer.modeChangeNote(previous, change.mode).trimmingCharacters(in: .whitespaces)
                    why.insert("mode change \(Self.escape(effect))", at: 0)
                }
                let notes = legend.cell(change.notes, escape: Self.escape)
                if !notes.isEmpty { why.append(notes) }
                let size =
                    PlanRenderer.size(change).map { $0.replacingOccurrences(of: " → ", with: "&nbsp;→&nbsp;") } ?? ""
                let mark = riskyTopics.contains(change.topic) ? "⚠️ " : ""
                rows.append(
                    "| \(mark)`\(change.topic)` | topic | \(mode) | \(size) | +\(PlanRenderer.formatCount(change.subscribe)) | −\(PlanRenderer.formatCount(change.unsubscribe)) | \(why.joined(separator: "<br>")) |"
                )
            }
            for change in plan.groups {
                let mark = riskyGroups.contains(change.group) ? "⚠️ " : ""
                rows.append(
                    "| \(mark)`\(change.group)` | \(change.audience == true ? "audience" : "group") | \(change.action.rawValue) | | +\(change.add) | −\(change.remove) | \(legend.cell(change.notes, escape: Self.escape)) |"
                )
            }
            let header =
                "| Topic / group | Kind | Mode | Subscribers before → after | Adds | Removes | Why |\n|---|---|---|--:|--:|--:|---|"
            blocks.append(MarkdownBlock(open: header, lines: rows))
            if !legend.entries.isEmpty {
                blocks.append(
                    MarkdownBlock(
                        open: "**Notes**\n",
                        lines: legend.entries.enumerated().map { "\($0.offset + 1). \(Self.escape($0.element))" }))
            }
        }
        let index = OperationIndex(plan)
        for change in plan.topics {
            let lines =
                detailLines(index.tokens(.unsubscribe, change.topic), "-")
                + detailLines(index.tokens(.subscribe, change.topic), "+")
            guard !lines.isEmpty else { continue }
            let risky = riskyTopics.contains(change.topic)
            let title =
                "\(risky ? "⚠️ " : "")<code>\(Self.escape(change.topic))</code>: +\(PlanRenderer.formatCount(change.subscribe)) −\(PlanRenderer.formatCount(change.unsubscribe))"
            blocks.append(detailBlock(title: title, lines: lines, expanded: risky))
        }
        for change in plan.groups {
            var lines: [String] = []
            for op in index.groupOperations(change.group) {
                let sign = op.kind == .groupRemove ? "-" : "+"
                let verb =
                    switch op.kind {
                    case .groupCreate: "create with"
                    case .groupAdd: "add"
                    default: "remove"
                    }
                lines.append("# \(verb) \(op.tokens.count)")
                lines += op.tokens.map { "\(sign) \(show($0))" }
            }
            guard !lines.isEmpty else { continue }
            let risky = riskyGroups.contains(change.group)
            blocks.append(
                detailBlock(
                    title:
                        "\(risky ? "⚠️ " : "")\(change.audience == true ? "audience" : "group") <code>\(Self.escape(change.group))</code>: \(change.action.rawValue) +\(change.add) −\(change.remove)",
                    lines: lines, expanded: risky))
        }
        if plan.hasChanges {
            blocks.append(
                .text(
                    "<sub>In the lists, `+` joins and `-` leaves; ⚠️ marks what calls for a careful review (removals from authoritative or protected topics, past a topic's `max_unsubscribes` or 10% of its subscribers, group deletions; never a rotated token).</sub>"
                ))
        }
        let warnings = Self.commentWarnings(plan)
        if !warnings.isEmpty {
            blocks.append(
                MarkdownBlock(open: "**Warnings**\n", lines: warnings.map { "- " + Self.escape($0.description) }))
        }
        blocks.append(.text(Self.nextStep(plan, file: planFile)))
        var footer = "<sub>\(Self.escape(text.provenance(plan)))"
        if let fullPlanHint { footer += " Full plan: \(Self.escape(fullPlanHint))." }
        blocks.append(.text(footer + "</sub>"))
        let hint =
            fullPlanHint.map { " — the full plan is in \(Self.escape($0))" }
            ?? " — save it with `tidemark plan --out plan.json` and read it with `tidemark show plan.json --format json`"
        return packer.pack(
            head: head, blocks: blocks,
            continued: { part, count in "### tidemark plan (continued, part \(part) of \(count))" },
            truncated: { omitted in
                "**Truncated:** \(omitted) more section\(omitted == 1 ? "" : "s") did not fit in these comments\(hint)."
            })
    }

    /// "+120 selector {locale: en-GB} at `manifests/weather.yaml:14`", for the table's Why column.
    static func reason(_ reason: ChangeReason) -> String {
        let sign = reason.direction == .join ? "+" : "−"
        let at = reason.at.map { " at `\($0)`" } ?? ""
        return "\(sign)\(PlanRenderer.formatCount(reason.count)) \(escape(reason.why))\(at)"
    }

    /// What the reviewer does next; `file` is the saved plan, when there is one.
    static func nextStep(_ plan: Plan, file: String?) -> String {
        if plan.diagnostics.hasErrors {
            return "**Next:** fix the errors above and push; this plan cannot be applied."
        }
        guard let file else {
            if !plan.hasChanges { return "**Next:** nothing to apply; FCM already matches what this plan looked at." }
            return
                "**Next:** review the changes above, then apply them: save the plan with `tidemark plan --out plan.json` and run `tidemark apply plan.json` (exactly this plan, or refused if anything moved), or run `tidemark apply`, which plans again and asks."
        }
        if !plan.hasChanges {
            return "**Next:** nothing to apply. Merging is safe: applying `\(escape(file))` changes nothing in FCM."
        }
        return
            "**Next:** review the changes above; merging applies exactly this plan (`tidemark apply \(escape(file))`). If state or these topics move first, the apply is refused and the plan must be made again; it is never changed."
    }

    /// "Workspace `prod` · FCM project `my-app` (fcm) · commit `1a2b3c4`": where the plan was made.
    /// `flagged`: how many changes call for a careful review.
    static func contextLine(_ plan: Plan, _ context: PlanContext?, flagged: Int) -> String {
        var parts: [String] = []
        if let workspace = context?.workspace { parts.append("Workspace `\(escape(workspace))`") }
        if let environment = context?.environment { parts.append("environment `\(escape(environment))`") }
        parts.append("FCM project `\(escape(plan.backend.project))` (\(escape(plan.backend.kind.rawValue)))")
        if let commit = context?.commit { parts.append("commit `\(escape(String(commit.prefix(12))))`") }
        let verdict =
            plan.diagnostics.hasErrors
            ? "cannot be applied"
            : flagged > 0
                ? "\(PlanRenderer.counted(flagged, "change")) to review with care"
                : plan.hasChanges ? "changes, none destructive" : "no changes"
        parts.append("**\(verdict)**")
        return parts.joined(separator: " · ")
    }

    /// Removals grouped by why they happen, across topics, largest first ("−65 device left the
    /// inventory: `tide-alerts-baltic` −65, …"); rotations are left out (nothing is lost).
    static func removalsByCause(_ plan: Plan) -> [String] {
        var totals: [String: Int] = [:]
        var topics: [String: [(String, Int)]] = [:]
        for change in plan.topics {
            for reason in change.reasons ?? [] where reason.direction == .leave {
                guard !reason.why.hasPrefix("token rotated") else { continue }
                let cause = reason.why + (reason.at.map { " at `\($0)`" } ?? "")
                totals[cause, default: 0] += reason.count
                topics[cause, default: []].append((change.topic, reason.count))
            }
        }
        return totals.sorted { $0.value != $1.value ? $0.value > $1.value : $0.key < $1.key }.map { cause, total in
            let list = (topics[cause] ?? []).sorted { $0.1 > $1.1 }
            var named = list.prefix(8).map { "`\($0.0)` −\(PlanRenderer.formatCount($0.1))" }
            if list.count > 8 { named.append("… and \(PlanRenderer.counted(list.count - 8, "more topic"))") }
            return "- −\(PlanRenderer.formatCount(total)) \(escape(cause)): \(named.joined(separator: ", "))"
        }
    }

    /// The plan's warnings for a pull request: a deadline notice only when the plan touches what the
    /// deadline ends (a device-group call; a topic change sent through the iid transport).
    static func commentWarnings(_ plan: Plan) -> [Diagnostic] {
        let touchesGroups = plan.operations.contains { $0.kind.isGroupCall }
        let sendsTopics = plan.operations.contains { !$0.kind.isGroup && !$0.kind.isStateOnly }
        return plan.diagnostics.filter { diagnostic in
            guard diagnostic.severity == .warning else { return false }
            switch diagnostic.code {
            case "deadline.device_groups": return touchesGroups
            case "deadline.iid_transport": return sendsTopics
            default: return true
            }
        }
    }

    /// A section: a `diff` code block, inside `<details>` unless `expanded` (what calls for review is
    /// shown open, however long) or it is at most `collapseAfter` lines.
    private func detailBlock(title: String, lines: [String], expanded: Bool = false) -> MarkdownBlock {
        if !expanded {
            return MarkdownBlock(
                open: "<details><summary>\(title)</summary>\n\n```diff", lines: lines,
                close: "```\n\n</details>", reopen: "<details><summary>\(title) (continued)</summary>\n\n```diff")
        }
        return MarkdownBlock(
            open: "\(title)\n\n```diff", lines: lines, close: "```", reopen: "\(title) (continued)\n\n```diff")
    }

    private func detailLines(_ tokens: [String], _ sign: String) -> [String] {
        var lines = tokens.prefix(tokensPerSection).map { "\(sign) \(show($0))" }
        if tokens.count > tokensPerSection {
            lines.append(
                "\(sign) … and \(PlanRenderer.formatCount(tokens.count - tokensPerSection)) more (all are in the JSON plan)"
            )
        }
        return lines
    }

    private func show(_ token: String) -> String {
        let shown = showTokens ? token : Redaction.redact(token)
        if let device = deviceName(token) { return "\(shown) (\(device))" }
        return shown
    }

    /// Keeps user text from being read as markup: table pipes, HTML and backtick runs.
    static func escape(_ text: String) -> String {
        var out = ""
        out.reserveCapacity(text.count)
        for c in text {
            switch c {
            case "|": out += "\\|"
            case "<": out += "&lt;"
            case ">": out += "&gt;"
            case "\n": out += " "
            default: out.append(c)
            }
        }
        return out
    }
}

/// Where a plan was made, for the top of a pull-request comment.
public struct PlanContext: Sendable, Equatable {
    /// The state workspace.
    public var workspace: String?
    /// The deployment environment the pipeline names (`TIDEMARK_ENVIRONMENT`).
    public var environment: String?
    /// The commit the manifests were read at.
    public var commit: String?

    /// A context naming what is known.
    public init(workspace: String? = nil, environment: String? = nil, commit: String? = nil) {
        self.workspace = workspace
        self.environment = environment
        self.commit = commit
    }
}

/// The plan's operations grouped by target, so rendering is linear in the plan's size.
struct OperationIndex {
    private var topicOperations: [String: [PlannedOperation.Kind: [PlannedOperation]]] = [:]
    private var groups: [String: [PlannedOperation]] = [:]

    init(_ plan: Plan) {
        for op in plan.operations {
            if op.kind.isStateOnly {
                // An audience's members are in its change's counts; the step lists them all, not what moved.
                continue
            } else if op.kind.isGroup {
                groups[op.target, default: []].append(op)
            } else {
                topicOperations[op.target, default: [:]][op.kind, default: []].append(op)
            }
        }
    }

    /// A topic's batches of one kind, in plan order.
    func operations(_ kind: PlannedOperation.Kind, _ topic: String) -> [PlannedOperation] {
        topicOperations[topic]?[kind] ?? []
    }

    func tokens(_ kind: PlannedOperation.Kind, _ topic: String) -> [String] {
        operations(kind, topic).flatMap(\.tokens)
    }
    func groupOperations(_ group: String) -> [PlannedOperation] { groups[group] ?? [] }
}
