import Foundation

/// What moved in FCM since tidemark last looked, that nobody planned: a refresh classified against
/// the manifests and state. `tidemark apply` corrects every kind.
public struct DriftReport: Sendable, Codable {
    /// The kinds of drift a refresh can find.
    public enum Kind: String, Sendable, Codable, CaseIterable {
        /// A device subscribed itself to an authoritative topic it is not declared in.
        case selfSubscribed = "self_subscribed"
        /// A device declared in a topic, and seen subscribed before, is no longer subscribed.
        case dropped
        /// FCM no longer knows the token (app uninstalled, token rotated or expired).
        case deadToken = "dead_token"
        /// A declared device unsubscribed itself from a topic that respects opt-outs: a user's choice,
        /// reported, not undone, and not counted as drift.
        case optedOut = "opted_out"
        /// A device group tidemark made no longer exists. (A group's key is not compared: FCM may
        /// answer a look-up with any of a group's key aliases.)
        case vanishedGroup = "vanished_group"

        /// The heading of the kind's section in a report.
        public var heading: String {
            switch self {
            case .selfSubscribed: "Devices that subscribed themselves to authoritative topics"
            case .dropped: "Devices that dropped declared topics"
            case .deadToken: "Dead tokens"
            case .optedOut: "Devices that opted out in the app"
            case .vanishedGroup: "Vanished device groups"
            }
        }

        /// What `apply` does about it.
        public var correction: String {
            switch self {
            case .selfSubscribed: "apply unsubscribes them"
            case .dropped: "apply subscribes them again"
            case .deadToken: "apply records them as dead and skips them; update or remove them in the inventory"
            case .optedOut: "respected: apply leaves them unsubscribed; opt_outs: restore subscribes them again"
            case .vanishedGroup: "apply creates the group again"
            }
        }
    }

    /// One drifted membership, token or group.
    public struct Item: Sendable, Codable, Equatable {
        /// What drifted.
        public var kind: Kind
        /// The topic, for a membership.
        public var topic: String?
        /// The group, for a vanished group.
        public var group: String?
        /// The token concerned (redacted in human output unless asked for).
        public var token: String?
        /// The inventory's device id of the token, when known.
        public var device: String?

        /// An item of `kind`.
        public init(kind: Kind, topic: String? = nil, group: String? = nil, token: String? = nil, device: String? = nil)
        {
            self.kind = kind
            self.topic = topic
            self.group = group
            self.token = token
            self.device = device
        }
    }

    /// The report's format (1).
    public var formatVersion = 1
    /// The tidemark version that made it.
    public var tidemarkVersion: String
    /// When the check ran.
    public var checkedAt: Date
    /// The lineage of the state it checked against.
    public var lineage: String
    /// That state's serial.
    public var serial: Int
    /// The FCM project and backend it read.
    public var backend: BackendIdentity
    /// Registrations read.
    public var registrationsRead: Int
    /// What drifted, in report order.
    public var items: [Item]
    /// Changes a plan made now would carry out (drift corrections and unapplied manifest edits), in tokens and group calls.
    public var pendingChanges: Int
    /// How far the refresh looked (absent in reports before refresh modes).
    public var coverage: RefreshCoverage? = nil
    /// For a sample: how much of the fleet not read has likely drifted, from the sweep's slice.
    public var estimate: DriftEstimate? = nil
    /// Warnings of the run, such as FCM's deadlines for device groups and the iid transport (absent when none).
    public var warnings: [Diagnostic]? = nil

    /// A report of what a refresh found.
    public init(
        tidemarkVersion: String, checkedAt: Date, lineage: String, serial: Int, backend: BackendIdentity,
        registrationsRead: Int, items: [Item], pendingChanges: Int
    ) {
        self.tidemarkVersion = tidemarkVersion
        self.checkedAt = checkedAt
        self.lineage = lineage
        self.serial = serial
        self.backend = backend
        self.registrationsRead = registrationsRead
        self.items = items
        self.pendingChanges = pendingChanges
    }

    /// Estimates the drift among the registrations not read from the share found in `sampled` (the
    /// sweep's slice, spread over the fleet): every kind but opt-outs and vanished groups counts.
    public mutating func estimate(sampled: Set<String>) {
        guard let coverage, !sampled.isEmpty, coverage.read < coverage.fleet else { return }
        let drifted = Set(items.filter { $0.kind != .optedOut && $0.kind != .vanishedGroup }.compactMap(\.token))
            .intersection(sampled).count
        estimate = DriftEstimate(drifted: drifted, sampled: sampled.count, unread: coverage.fleet - coverage.read)
    }

    /// Opt-outs a topic respects are reported, never counted as drift: they are users' choices.
    public var hasDrift: Bool { items.contains { $0.kind != .optedOut } }

    /// How many items are of `kind`.
    public func count(_ kind: Kind) -> Int { items.reduce(0) { $0 + ($1.kind == kind ? 1 : 0) } }

    /// Drifted memberships among `counts` (by kind's raw value), opt-outs aside: they are a user's
    /// choice, not drift.
    public static func found(in counts: [String: Int]?) -> Int {
        (counts ?? [:]).filter { $0.key != Kind.optedOut.rawValue }.values.reduce(0, +)
    }

    /// Sorts what a refresh saw into kinds of drift. `state` is state before the refresh, sharing
    /// its token table with `desired`.
    public static func classify(
        _ observations: Observations, desired: DesiredState, state: State,
        inventory: Inventory
    ) -> [Item] {
        func device(_ token: String) -> String? { inventory.index(ofToken: token).map { inventory.deviceIDs[$0] } }
        var items: [Item] = []
        let topics = Dictionary(desired.topics.map { ($0.name, $0) }, uniquingKeysWith: { first, _ in first })
        for delta in observations.topics {
            guard let spec = topics[delta.topic] else { continue }
            if spec.mode == .authoritative {
                for token in delta.subscribed {
                    guard let id = state.tokens.id(token), !spec.members.contains(id) else { continue }
                    items.append(Item(kind: .selfSubscribed, topic: delta.topic, token: token, device: device(token)))
                }
            }
            for token in delta.unsubscribed {
                guard let id = state.tokens.id(token), spec.members.contains(id) else { continue }
                // A token that died is reported once, as dead, not in every topic it was in.
                if observations.dead.contains(token) { continue }
                let kind: Kind = spec.optOuts == .respect ? .optedOut : .dropped
                items.append(Item(kind: kind, topic: delta.topic, token: token, device: device(token)))
            }
        }
        for token in observations.dead {
            items.append(Item(kind: .deadToken, token: token, device: device(token)))
        }
        for entry in observations.groupKeys where entry.key == nil {
            guard let known = state.groups[entry.group], known.key != nil else { continue }
            items.append(Item(kind: .vanishedGroup, group: entry.group))
        }
        return items
    }
}

/// How many of the registrations a sample did not read have likely drifted: the share found in the
/// sample, with a 95% Wilson score interval, scaled to the rest.
public struct DriftEstimate: Sendable, Codable, Equatable {
    /// Registrations of the sample found drifted, and the sample's size.
    public var drifted: Int
    /// Registrations the sample read.
    public var sampled: Int
    /// Registrations of the fleet not read.
    public var unread: Int
    /// The estimate for the registrations not read, and its 95% bounds.
    public var expected: Int
    /// The lower 95% bound of drifted registrations among those not read.
    public var low: Int
    /// The upper 95% bound.
    public var high: Int

    /// The estimate from `drifted` of `sampled`, scaled to `unread` registrations.
    public init(drifted: Int, sampled: Int, unread: Int) {
        self.drifted = drifted
        self.sampled = sampled
        self.unread = unread
        let n = Double(max(sampled, 1))
        let p = Double(drifted) / n
        let z = 1.96
        let denominator = 1 + z * z / n
        let center = (p + z * z / (2 * n)) / denominator
        let half = z / denominator * (p * (1 - p) / n + z * z / (4 * n * n)).squareRoot()
        let rest = Double(unread)
        expected = Int((p * rest).rounded())
        low = Int((max(0, center - half) * rest).rounded(.down))
        high = Int((min(1, center + half) * rest).rounded(.up))
    }
}

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
