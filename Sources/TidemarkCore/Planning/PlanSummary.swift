import Foundation

/// The counts a script needs from a plan without walking its operations (`summary` in
/// `plan --format json` and in saved plans). Derived from the plan, never trusted from a file:
/// `Plan.summarized()` computes it again.
public struct PlanSummary: Sendable, Codable, Equatable {
    /// A topic or group whose change calls for a careful review, and why.
    public struct Flagged: Sendable, Codable, Equatable {
        /// "topic", "group" or "audience".
        public var kind: String
        /// Its name.
        public var name: String
        /// Members it loses (rotated tokens not counted).
        public var removes: Int
        /// Why it is flagged: "authoritative topic", "14% of its 466 subscribers, over …".
        public var reasons: [String]
    }

    /// Whether applying the plan changes anything in FCM or state.
    public var hasChanges: Bool
    /// Whether the plan can be applied (no errors).
    public var applicable: Bool
    /// The one-line verdict, as the text plan's first line.
    public var verdict: String
    /// Errors and warnings in `diagnostics`.
    public var errors: Int
    /// Warnings in `diagnostics`.
    public var warnings: Int
    /// Topics with changes (as the verdict counts them).
    public var topics: Int
    /// Device groups with changes (as the verdict counts them).
    public var groups: Int
    /// Audiences with changes (as the verdict counts them).
    public var audiences: Int
    /// Memberships the plan adds.
    public var subscribes: Int
    /// Memberships the plan removes, rotated tokens included.
    public var unsubscribes: Int
    /// Of `unsubscribes`, the old tokens of rotated devices (their memberships move to the new token).
    public var rotatedUnsubscribes: Int
    /// Devices whose token rotated.
    public var rotatedDevices: Int
    /// Devices that left the inventory whose memberships the plan removes.
    public var departedDevices: Int
    /// Calls to FCM's device-group API.
    public var groupCalls: Int
    /// Requests applying the plan sends to FCM, when known.
    public var requests: Int?
    /// Registrations the plan read from FCM, when it read any.
    public var registrationsRead: Int?
    /// Requests the plan sent to FCM while it was made, when the backend counts them.
    public var readRequests: Int?
    /// What calls for a careful review; empty when nothing does.
    public var destructive: [Flagged]

    /// The summary of `plan`.
    public init(_ plan: Plan) {
        hasChanges = plan.hasChanges
        applicable = !plan.diagnostics.hasErrors
        verdict = PlanRenderer().verdict(plan)
        errors = plan.diagnostics.count { $0.severity == .error }
        warnings = plan.diagnostics.count { $0.severity == .warning }
        (topics, groups, audiences) = plan.changedCounts
        subscribes = plan.subscribeCount
        unsubscribes = plan.unsubscribeCount
        rotatedUnsubscribes = plan.rotatedUnsubscribeCount
        rotatedDevices = plan.rotations?.count ?? 0
        departedDevices = Set((plan.departed ?? []).map(\.device)).count
        groupCalls = plan.operations.count { $0.kind.isGroupCall }
        requests = plan.requests
        registrationsRead = plan.coverage.flatMap { $0.mode == .none ? nil : $0.read }
        readRequests = plan.reads
        destructive = PlanRenderer.flagged(plan)
    }
}

extension Plan {
    /// The plan with its `summary` computed from what it holds now.
    public func summarized() -> Plan {
        var plan = self
        plan.summary = nil
        plan.summary = PlanSummary(plan)
        return plan
    }
}
