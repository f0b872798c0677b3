import Foundation

/// How much of FCM a command reads before it plans: `--refresh`.
public enum RefreshMode: String, Sendable, Codable, CaseIterable {
    /// Only the registrations the plan would change, and those read longer ago than `refresh_max_age`.
    case touched
    /// `touched`, plus a slice of the rest within the read budget, oldest read first: successive
    /// applies sweep the whole fleet.
    case sample
    /// Every registration tidemark knows.
    case all
    /// Nothing: plan from state alone (`--no-refresh`).
    case none
}
