import Foundation

/// Renders a drift report for people (text and markdown) and for log pipelines (NDJSON events).
public struct DriftRenderer: Sendable {
    /// Whether tokens are shown whole (`--show-tokens`); redacted by default.
    public var showTokens: Bool
    /// Items listed per kind and topic before "… and N more".
    public var itemsPerSection: Int
    /// How Markdown is split into comments that fit a pull request.
    public var packer: MarkdownPacker

    /// A renderer; `itemsPerSection` bounds each list.
    public init(showTokens: Bool = false, itemsPerSection: Int = 20, packer: MarkdownPacker = MarkdownPacker()) {
        self.showTokens = showTokens
        self.itemsPerSection = itemsPerSection
        self.packer = packer
    }

    /// "Drift: 3 devices subscribed themselves to authoritative topics, 1 dead token."
    public func verdict(_ report: DriftReport) -> String {
        guard report.hasDrift else {
            let read = PlanRenderer.formatCount(report.registrationsRead)
            let optedOut = report.count(.optedOut)
            let note =
                optedOut == 0
                ? ""
                : "; \(PlanRenderer.formatCount(optedOut)) opt-out\(optedOut == 1 ? "" : "s") in the app, respected"
            if let coverage = report.coverage, coverage.read < coverage.fleet {
                let share = PlanRenderer.formatShare(Double(coverage.read) / Double(max(coverage.fleet, 1)))
                return
                    "No drift among the \(read) registration\(report.registrationsRead == 1 ? "" : "s") read (\(share) of the fleet)\(note)."
            }
            return
                "No drift: FCM matches what tidemark last saw (\(read) registration\(report.registrationsRead == 1 ? "" : "s") read)\(note)."
        }
        var parts: [String] = []
        for kind in DriftReport.Kind.allCases {
            let n = report.count(kind)
            guard n > 0 else { continue }
            let count = PlanRenderer.formatCount(n)
            let part =
                switch kind {
                case .selfSubscribed: "\(count) self-subscription\(n == 1 ? "" : "s") to authoritative topics"
                case .dropped: "\(count) declared membership\(n == 1 ? "" : "s") dropped"
                case .deadToken: "\(count) dead token\(n == 1 ? "" : "s")"
                case .vanishedGroup: "\(count) vanished group\(n == 1 ? "" : "s")"
                case .optedOut: "\(count) opt-out\(n == 1 ? "" : "s") in the app (respected)"
                }
            parts.append(part)
        }
        return "Drift: " + parts.joined(separator: ", ") + "."
    }

    private func advice(_ report: DriftReport) -> String {
        guard report.pendingChanges > 0 else {
            return report.hasDrift
                ? "Nothing for apply to change; the drift is recorded at the next apply." : "Nothing to apply."
        }
        if !report.hasDrift {
            let n = report.pendingChanges
            return
                "The manifests have \(PlanRenderer.formatCount(n)) change\(n == 1 ? "" : "s") not yet applied; 'tidemark plan' shows them."
        }
        return
            "Run 'tidemark apply' to correct it: a plan now makes \(PlanRenderer.formatCount(report.pendingChanges)) change\(report.pendingChanges == 1 ? "" : "s") (unapplied manifest edits included)."
    }

    /// Per kind, the affected items grouped by topic or group, capped.
    private func sections(_ report: DriftReport) -> [(kind: DriftReport.Kind, lines: [String])] {
        var result: [(DriftReport.Kind, [String])] = []
        for kind in DriftReport.Kind.allCases {
            let items = report.items.filter { $0.kind == kind }
            guard !items.isEmpty else { continue }
            var lines: [String] = []
            let byPlace = Dictionary(grouping: items, by: { $0.topic ?? $0.group ?? "" })
            for place in byPlace.keys.sorted() {
                let entries = byPlace[place]!
                if !place.isEmpty, kind != .vanishedGroup {
                    lines.append("\(place): \(PlanRenderer.formatCount(entries.count))")
                }
                for item in entries.prefix(itemsPerSection) {
                    if let token = item.token {
                        lines.append("  \(show(token))\(item.device.map { " (device \($0))" } ?? "")")
                    } else if let group = item.group {
                        lines.append("  \(group)")
                    }
                }
                if entries.count > itemsPerSection {
                    lines.append("  … and \(PlanRenderer.formatCount(entries.count - itemsPerSection)) more")
                }
            }
            result.append((kind, lines))
        }
        return result
    }

    /// How far the refresh looked and, for a sample, what the rest likely holds; nil for a full read.
    func coverageLines(_ report: DriftReport) -> [String] {
        guard let coverage = report.coverage, coverage.mode != .all, coverage.read < coverage.fleet else { return [] }
        var lines = [PlanRenderer.coverageSentence(coverage)]
        if let e = report.estimate {
            let rest = PlanRenderer.formatCount(e.unread)
            lines.append(
                "Estimated drift among the \(rest) registrations not read: about \(PlanRenderer.formatCount(e.expected)) (95% between \(PlanRenderer.formatCount(e.low)) and \(PlanRenderer.formatCount(e.high))), from \(PlanRenderer.formatCount(e.drifted)) of the \(PlanRenderer.formatCount(e.sampled)) sampled. Only --refresh all reads them all."
            )
        }
        return lines
    }

    /// The report for a terminal.
    public func text(_ report: DriftReport) -> String {
        var out = [verdict(report)]
        out += coverageLines(report)
        for (kind, lines) in sections(report) {
            out.append("")
            out.append("\(kind.heading) (\(kind.correction)):")
            out += lines.map { "  " + $0 }
        }
        out.append("")
        out.append(advice(report))
        if let warnings = report.warnings, !warnings.isEmpty {
            out.append("")
            out += warnings.map(\.description)
        }
        out.append(provenance(report))
        return (out.joined(separator: "\n") + "\n").escapingControlCharacters
    }

    /// The report as Markdown comments, each within the packer's size.
    public func markdown(_ report: DriftReport) -> [String] { markdownParts(report).map(\.escapingControlCharacters) }

    private func markdownParts(_ report: DriftReport) -> [String] {
        let icon = report.hasDrift ? "🌊" : "✅"
        let head = "### \(icon) tidemark drift: \(MarkdownPlanRenderer.escape(verdict(report)))"
        var blocks: [MarkdownBlock] = []
        if report.hasDrift {
            let rows = DriftReport.Kind.allCases.filter { report.count($0) > 0 }.map {
                "| \($0.heading) | \(PlanRenderer.formatCount(report.count($0))) | \($0.correction) |"
            }
            blocks.append(MarkdownBlock(open: "| Drift | Count | Correction |\n|---|--:|---|", lines: rows))
        }
        for (kind, lines) in sections(report) {
            let title = "\(kind.heading): \(PlanRenderer.formatCount(report.count(kind)))"
            blocks.append(
                MarkdownBlock(
                    open: "<details><summary>\(title)</summary>\n\n```", lines: lines,
                    close: "```\n\n</details>", reopen: "<details><summary>\(title) (continued)</summary>\n\n```"))
        }
        for line in coverageLines(report) { blocks.append(.text(MarkdownPlanRenderer.escape(line))) }
        blocks.append(.text(MarkdownPlanRenderer.escape(advice(report))))
        if let warnings = report.warnings, !warnings.isEmpty {
            blocks.append(
                MarkdownBlock(
                    open: "**Warnings**\n", lines: warnings.map { "- " + MarkdownPlanRenderer.escape($0.description) }))
        }
        blocks.append(.text("<sub>\(MarkdownPlanRenderer.escape(provenance(report)))</sub>"))
        return packer.pack(
            head: head, blocks: blocks,
            continued: { part, count in "### tidemark drift (continued, part \(part) of \(count))" },
            truncated: { omitted in
                "**Truncated:** \(omitted) more section\(omitted == 1 ? "" : "s") did not fit; `tidemark drift --format json` has everything."
            })
    }

    /// One JSON object per line: a `drift` event per item, then a `summary` event. Tokens are redacted
    /// unless `showTokens`, as logs are read by people.
    public func ndjson(_ report: DriftReport) -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        encoder.dateEncodingStrategy = .iso8601
        struct Event: Encodable {
            var event: String
            var time: Date
            var kind: String?
            var topic: String?
            var group: String?
            var token: String?
            var device: String?
            var counts: [String: Int]?
            var drift: Bool?
            var registrationsRead: Int?
            var pendingChanges: Int?
            var backend: String?
            var refresh: String?
            var fleet: Int?
            var estimate: DriftEstimate?

            enum CodingKeys: String, CodingKey {
                case event, time, kind, topic, group, token, device, counts, drift, backend, refresh, fleet, estimate
                case registrationsRead = "registrations_read"
                case pendingChanges = "pending_changes"
            }
        }
        var lines: [String] = []
        func emit(_ event: Event) {
            if let data = try? encoder.encode(event) { lines.append(String(decoding: data, as: UTF8.self)) }
        }
        for item in report.items {
            emit(
                Event(
                    event: "drift", time: report.checkedAt, kind: item.kind.rawValue, topic: item.topic,
                    group: item.group, token: item.token.map(show), device: item.device))
        }
        var counts: [String: Int] = [:]
        for kind in DriftReport.Kind.allCases { counts[kind.rawValue] = report.count(kind) }
        emit(
            Event(
                event: "summary", time: report.checkedAt, counts: counts, drift: report.hasDrift,
                registrationsRead: report.registrationsRead, pendingChanges: report.pendingChanges,
                backend: report.backend.description, refresh: report.coverage?.mode.rawValue,
                fleet: report.coverage?.fleet, estimate: report.estimate))
        return lines.joined(separator: "\n") + "\n"
    }

    private func show(_ token: String) -> String { showTokens ? token : Redaction.redact(token) }

    private func provenance(_ report: DriftReport) -> String {
        let state =
            report.lineage.isEmpty ? "no state yet" : "state \(report.lineage.prefix(8)) serial \(report.serial)"
        return "Checked \(ISO8601DateFormatter().string(from: report.checkedAt)) against \(report.backend); \(state)."
    }
}
