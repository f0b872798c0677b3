import Foundation

/// A topic or group a rail holds: its changes wait while the rest of the plan is applied
/// (`tidemark apply --skip-held`, and `serve` always). Re-planned at every plan; released as soon as
/// its own plan passes the rail.
public struct HeldChange: Sendable, Codable, Equatable {
    /// The topic or group (audiences count as groups).
    public var subject: Targets.Subject
    /// The rail, in its stable word: `rail.max_unsubscribes`, `rail.protect`, `rail.allow_empty`,
    /// `rail.unattended`.
    public var rail: String
    /// The rail's message, as the plan said it (no token in the clear).
    public var message: String
    /// Where the manifests set what the rail refuses (`file:line:column`), when they do.
    public var at: String?
    /// Since when it is held, as `serve` first saw it held (nil in a plan).
    public var since: Date?

    /// `subject` held by `rail`, saying `message`.
    public init(subject: Targets.Subject, rail: String, message: String, at: String? = nil, since: Date? = nil) {
        self.subject = subject
        self.rail = rail
        self.message = message
        self.at = at
        self.since = since
    }

    /// The holds of `diagnostics`: their errors that are a rail about one topic or group, once per
    /// subject (the first rail that refused it); nil when an error is about something else (the
    /// global `max_unsubscribes`, a problem in the input): then nothing can be held, the whole plan
    /// is refused.
    public static func holds(in diagnostics: [Diagnostic]) -> [HeldChange]? {
        var held: [HeldChange] = []
        var seen = Set<Targets.Subject>()
        for diagnostic in diagnostics where diagnostic.severity == .error {
            guard let code = diagnostic.code, code.hasPrefix("rail."), let subject = diagnostic.subject else {
                return nil
            }
            guard seen.insert(subject).inserted else { continue }
            held.append(
                HeldChange(
                    subject: subject, rail: code, message: diagnostic.message, at: diagnostic.location?.description))
        }
        return held
    }
}

/// The rail `serve` puts on a topic whose manifests set no `max_unsubscribes` when tidemark.yaml sets
/// none either: it does not unsubscribe more than a share of a topic's known members on its own (as
/// Argo CD's automated sync does not prune unless told). Small topics may lose a few devices.
public struct UnattendedRail: Sendable, Equatable {
    /// The share of a topic's known subscribers a plan may take (0.10: 10%).
    public var share: Double
    /// Devices a plan may always take from a topic, whatever its size.
    public var minimum: Int

    /// `serve`'s default: 10% of a topic's known subscribers, and at least 10 devices.
    public static let serveDefault = UnattendedRail(share: 0.10, minimum: 10)

    /// A rail of `share`, never below `minimum` devices.
    public init(share: Double, minimum: Int) {
        self.share = share
        self.minimum = minimum
    }

    /// Devices a plan may take from a topic of `before` known subscribers.
    public func allowed(of before: Int) -> Int { max(minimum, Int((Double(before) * share).rounded(.down))) }

    /// "serve's default rail allows (10% of its subscribers, at least 10: 50)".
    public func describe(allowed: Int) -> String {
        "serve's default rail allows (\(PlanRenderer.formatShare(share)) of its subscribers, at least \(minimum): \(PlanRenderer.formatCount(allowed)))"
    }
}

/// What a plan beside held topics would do: counts for the reader of a refused plan.
public struct BesideHeld: Sendable, Codable, Equatable {
    /// Its operations.
    public var operations: Int
    /// Memberships it adds.
    public var subscribes: Int
    /// Memberships it removes.
    public var unsubscribes: Int
    /// Topics it changes.
    public var topics: Int
    /// Device groups and audiences it changes.
    public var groups: Int
    /// Its own errors: a rail about the whole workspace, still refusing what is left (absent when none).
    public var errors: [String]? = nil

    /// The counts of `plan`.
    public init(_ plan: Plan) {
        operations = plan.operations.count
        subscribes = plan.subscribeCount
        unsubscribes = plan.unsubscribeCount
        let counts = plan.changedCounts
        topics = counts.topics
        groups = counts.groups + counts.audiences
        let errors = plan.diagnostics.filter { $0.severity == .error }.map(\.message)
        self.errors = errors.isEmpty ? nil : errors
    }
}
