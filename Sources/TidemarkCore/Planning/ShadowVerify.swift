import Foundation

/// A shadow verify: a plan that reads FCM through another topic API than the one the project is
/// configured for (`plan --transport v1 --refresh all` on a project on `iid`), compared with state,
/// which applies over the configured API wrote. No difference over the whole fleet is the evidence a
/// team needs to switch transports; each difference is listed, and the plan re-asserts it as usual.
public struct ShadowVerify: Sendable, Codable, Equatable {
    /// One way the other API's view differs from state.
    public struct Difference: Sendable, Codable, Equatable {
        /// How it differs.
        public enum Kind: String, Sendable, Codable {
            /// State holds the membership; the other API reads it absent.
            case absent
            /// The other API reads a membership state does not hold.
            case unexpected
            /// The other API does not know a registration state holds alive.
            case unregistered
            /// The other API knows a registration state holds dead.
            case registered
        }

        /// How it differs.
        public var kind: Kind
        /// The topic, for a membership.
        public var topic: String?
        /// The registration token concerned.
        public var token: String

        /// A difference of `kind` for `token` (in `topic`, for a membership).
        public init(kind: Kind, topic: String?, token: String) {
            self.kind = kind
            self.topic = topic
            self.token = token
        }
    }

    /// The API this plan read through.
    public var reads: TopicTransport
    /// The API the project is configured for, over which state was written.
    public var against: TopicTransport
    /// Registrations read through `reads`, of `fleet`.
    public var registrationsRead: Int
    /// Registrations state knows and holds alive.
    public var fleet: Int
    /// Every registration state knows was read (`--refresh all`): only then is "no difference" evidence.
    public var complete: Bool
    /// Every difference found, up to `listLimit` (`differenceCount` counts them all).
    public var differences: [Difference]
    /// How many differences were found.
    public var differenceCount: Int

    /// The most differences listed in a plan.
    public static let listLimit = 1000

    /// The differences are what the refresh saw that state did not remember (`observations`).
    public init(
        reads: TopicTransport, against: TopicTransport, observations: Observations, coverage: RefreshCoverage?
    ) {
        self.reads = reads
        self.against = against
        registrationsRead = coverage?.read ?? 0
        fleet = coverage?.fleet ?? 0
        complete = coverage.map { $0.mode == .all && $0.read >= $0.fleet } ?? false
        var all: [Difference] = []
        for delta in observations.topics {
            all += delta.unsubscribed.map { Difference(kind: .absent, topic: delta.topic, token: $0) }
            all += delta.subscribed.map { Difference(kind: .unexpected, topic: delta.topic, token: $0) }
        }
        all += observations.dead.map { Difference(kind: .unregistered, topic: nil, token: $0) }
        all += observations.revived.map { Difference(kind: .registered, topic: nil, token: $0) }
        differenceCount = all.count
        differences = Array(all.prefix(Self.listLimit))
    }

    /// The verdict, one line: whether the other API reads what state holds, and over how much.
    public var verdict: String {
        let scope =
            complete
            ? "all \(PlanRenderer.formatCount(registrationsRead)) registrations"
            : "\(PlanRenderer.formatCount(registrationsRead)) of \(PlanRenderer.formatCount(fleet)) registrations (not the whole fleet: use --refresh all for evidence)"
        if differenceCount == 0 {
            return
                "Shadow verify: the \(reads) API reads exactly what state holds from applies over \(against), across \(scope)\(complete ? "; switching transports changes nothing" : "")."
        }
        return
            "Shadow verify: the \(reads) API reads \(PlanRenderer.formatCount(differenceCount)) difference\(differenceCount == 1 ? "" : "s") from what state holds from applies over \(against), across \(scope); the plan re-asserts them."
    }

    /// One line per difference, tokens shown by `show`.
    public func lines(show: (String) -> String) -> [String] {
        var result = differences.map { d -> String in
            switch d.kind {
            case .absent: "\(d.topic ?? ""): \(show(d.token)) subscribed per state, not per \(reads)"
            case .unexpected: "\(d.topic ?? ""): \(show(d.token)) subscribed per \(reads), not per state"
            case .unregistered: "\(show(d.token)) unknown to \(reads), alive per state"
            case .registered: "\(show(d.token)) known to \(reads), dead per state"
            }
        }
        if differenceCount > differences.count {
            result.append("… and \(PlanRenderer.formatCount(differenceCount - differences.count)) more")
        }
        return result
    }
}
