/// Renders a plan for people: the verdict first, destructive changes called out, tokens redacted.
public struct PlanRenderer: Sendable {
    public var showTokens: Bool
    /// Tokens listed per topic and operation before "… and N more".
    public var tokensPerSection: Int
    /// Names a token's device, when the inventory knows it.
    public var deviceName: @Sendable (String) -> String?

    public init(
        showTokens: Bool = false, tokensPerSection: Int = 5,
        deviceName: @escaping @Sendable (String) -> String? = { _ in nil }
    ) {
        self.showTokens = showTokens
        self.tokensPerSection = tokensPerSection
        self.deviceName = deviceName
    }

    public static func formatCount(_ n: Int) -> String {
        let digits = String(abs(n))
        var result = ""
        for (i, c) in digits.enumerated() {
            if i > 0, (digits.count - i) % 3 == 0 { result.append(",") }
            result.append(c)
        }
        return (n < 0 ? "-" : "") + result
    }

    /// "Plan: 3 topics and 1 group change: +1,204 subscriptions, −37 unsubscriptions".
    public func verdict(_ plan: Plan) -> String {
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
            return
                "No changes. FCM matches the manifests\(respected)\(plan.refreshed ? "" : " (as recorded in state; not refreshed)")."
        }
        let topics = Set(plan.operations.filter { !$0.kind.isGroup }.map(\.target)).count
        let groups = Set(plan.operations.filter { $0.kind.isGroup }.map(\.target)).count
        var parts: [String] = []
        if topics > 0 { parts.append("\(Self.formatCount(topics)) topic\(topics == 1 ? "" : "s")") }
        if groups > 0 { parts.append("\(Self.formatCount(groups)) group\(groups == 1 ? "" : "s")") }
        let change = topics + groups == 1 ? "changes" : "change"
        var counts: [String] = []
        counts.append("+\(Self.formatCount(plan.subscribeCount)) subscription\(plan.subscribeCount == 1 ? "" : "s")")
        counts.append(
            "−\(Self.formatCount(plan.unsubscribeCount)) unsubscription\(plan.unsubscribeCount == 1 ? "" : "s")")
        let groupCalls = plan.operations.filter { $0.kind.isGroup }.count
        if groupCalls > 0 { counts.append("\(groupCalls) group call\(groupCalls == 1 ? "" : "s")") }
        let rotated = plan.rotations?.count ?? 0
        let rotation =
            rotated == 0
            ? ""
            : " (\(Self.formatCount(rotated)) device\(rotated == 1 ? "" : "s") rotated \(rotated == 1 ? "its token" : "their tokens"))"
        return "Plan: \(parts.joined(separator: " and ")) \(change): \(counts.joined(separator: ", "))\(rotation)."
    }

    public func render(_ plan: Plan) -> String {
        var out: [String] = []
        let errors = plan.diagnostics.filter { $0.severity == .error }.count
        if errors > 0 {
            out.append("Error: this plan cannot be applied (\(errors) error\(errors == 1 ? "" : "s"), listed below).")
        }
        out.append(verdict(plan))
        if plan.isPartial {
            out.append("")
            out.append(
                "Partial plan (\(plan.selectionSummary)): topics and groups outside the selection are not planned and may have changes of their own."
            )
        }
        let destructive = destructiveLines(plan)
        if !destructive.isEmpty {
            out.append("")
            out.append("Destructive changes:")
            out += destructive.map { "  ! " + $0 }
        }
        let rotated = rotationLines(plan)
        if !rotated.isEmpty {
            out.append("")
            out.append("Rotated tokens (the same device with a new token; its memberships move):")
            out += rotated.map { "  ~ " + $0 }
        }
        let index = OperationIndex(plan)
        if !plan.topics.isEmpty {
            out.append("")
            out.append("Topics:")
            let width = min(40, plan.topics.map(\.topic.count).max() ?? 0)
            for change in plan.topics {
                let symbol = change.removedFromManifests ? "-" : (change.unsubscribe > 0 ? "~" : "+")
                let name = change.topic.padding(toLength: max(width, change.topic.count), withPad: " ", startingAt: 0)
                out.append(
                    "  \(symbol) \(name)  \(change.mode.rawValue.padding(toLength: 13, withPad: " ", startingAt: 0))  +\(Self.formatCount(change.subscribe))  −\(Self.formatCount(change.unsubscribe))"
                )
                for note in change.notes { out.append("      note: \(note)") }
                out += tokenLines(index, topic: change.topic)
            }
        }
        if !plan.groups.isEmpty {
            out.append("")
            out.append("Device groups:")
            for change in plan.groups {
                let symbol =
                    switch change.action {
                    case .create: "+"
                    case .delete: "-"
                    case .update, .adopt: "~"
                    }
                out.append("  \(symbol) \(change.group)  \(change.action.rawValue)  +\(change.add)  −\(change.remove)")
                for note in change.notes { out.append("      note: \(note)") }
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
        let notable = plan.diagnostics.filter { $0.severity >= .warning }
        if !notable.isEmpty {
            out.append("")
            out += notable.map(\.description)
        }
        out.append("")
        out.append(provenance(plan))
        return out.joined(separator: "\n") + "\n"
    }

    func destructiveLines(_ plan: Plan) -> [String] {
        var lines: [String] = []
        for change in plan.topics
        where change.unsubscribe > 0 && (change.mode == .authoritative || change.removedFromManifests) {
            let why = change.removedFromManifests ? "topic removed from the manifests" : "authoritative topic"
            lines.append(
                "\(Self.formatCount(change.unsubscribe)) unsubscription\(change.unsubscribe == 1 ? "" : "s") from '\(change.topic)' (\(why))"
            )
        }
        for change in plan.groups where change.action == .delete {
            lines.append("device group '\(change.group)' will be deleted (all \(change.remove) members removed)")
        }
        return lines
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
        if rotations.count > 20 { lines.append("… and \(rotations.count - 20) more rotated device(s)") }
        return lines
    }

    func provenance(_ plan: Plan) -> String {
        let refresh = plan.refreshed ? "after reading the backend" : "from state only (--no-refresh)"
        let state = plan.lineage.isEmpty ? "no state yet" : "state \(plan.lineage.prefix(8)) serial \(plan.serial)"
        return
            "Computed \(refresh); \(state); manifests sha256:\(plan.manifestsDigest.prefix(12)); backend \(plan.backend); \(plan.requests.map { "\(Self.formatCount($0)) request\($0 == 1 ? "" : "s") to FCM" } ?? "\(plan.operations.count) operation\(plan.operations.count == 1 ? "" : "s")").\(Self.inventoryLine(plan).map { " " + $0 } ?? "")"
    }

    /// What the counted sources (queries, commands) read, for the provenance line; nil when there are none.
    static func inventoryLine(_ plan: Plan) -> String? {
        let counted = (plan.inventory ?? []).compactMap { record -> String? in
            guard let rows = record.rows else { return nil }
            let left = record.excluded.flatMap { $0 > 0 ? " (\(formatCount($0)) left out by exclude_if)" : nil } ?? ""
            return "\(record.source) \(formatCount(rows)) device\(rows == 1 ? "" : "s")\(left)"
        }
        return counted.isEmpty ? nil : "Inventory read: \(counted.joined(separator: ", "))."
    }
}
