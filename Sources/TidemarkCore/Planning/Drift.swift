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
