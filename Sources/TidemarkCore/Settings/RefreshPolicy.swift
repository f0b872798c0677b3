import Foundation

/// `refresh_budget`: how many registrations a `sample` refresh reads beyond the touched ones.
public enum RefreshBudget: Sendable, Equatable, CustomStringConvertible {
    /// This many reads a run.
    case reads(Int)
    /// This share of the fleet a run (0.05 = 5%), at least `RefreshBudget.minimumShareReads`.
    case share(Double)

    /// 2% of the fleet (at least 1,000 reads): the fleet is swept in at most 50 applies.
    public static let `default` = RefreshBudget.share(0.02)
    /// A share never reads fewer than this (small fleets are swept quickly).
    public static let minimumShareReads = 1000

    /// "10000" or "5%".
    public init(parsing text: String) throws(RefreshPolicyError) {
        let trimmed = text.trimmingCharacters(in: .whitespaces)
        if trimmed.hasSuffix("%") {
            guard let percent = Double(trimmed.dropLast()), percent > 0, percent <= 100 else {
                throw RefreshPolicyError(
                    "refresh budget '\(text)' is not a share of the fleet: write a percentage above 0 and at most 100, like 5%."
                )
            }
            self = .share(percent / 100)
        } else {
            guard let reads = Int(trimmed), reads >= 0 else {
                throw RefreshPolicyError(
                    "refresh budget '\(text)' is not a number of reads: write a whole number (10000) or a share (5%).")
            }
            self = .reads(reads)
        }
    }

    /// The reads a run may spend on the sweep, for a fleet of `fleet` registrations.
    public func reads(fleet: Int) -> Int {
        switch self {
        case .reads(let n): return n
        case .share(let share):
            return min(fleet, max(Self.minimumShareReads, Int((Double(fleet) * share).rounded(.up))))
        }
    }

    /// "5,000 reads" or "1% of the fleet", for messages.
    public var description: String {
        switch self {
        case .reads(let n): return "\(n) reads"
        case .share(let share): return "\(PlanRenderer.formatShare(share)) of the fleet"
        }
    }
}

/// A `--refresh`, `refresh_budget` or `refresh_max_age` that cannot be used.
public struct RefreshPolicyError: TidemarkError {
    /// `invalid_refresh_policy`.
    public var reason: FailureReason { "invalid_refresh_policy" }

    /// The reason, as a sentence naming the setting.
    public var description: String
    /// An error saying `description`.
    public init(_ description: String) { self.description = description }
}

/// What a command reads before it plans: the mode, the sweep's budget and the oldest read trusted.
public struct RefreshPolicy: Sendable, Equatable {
    /// Which registrations are read.
    public var mode: RefreshMode
    /// How many registrations the sweep reads per run (`sample`).
    public var budget: RefreshBudget
    /// Registrations last read longer ago than this many seconds are read again (touched and sample).
    public var maxAge: Int64?

    /// A policy of `mode`.
    public init(mode: RefreshMode, budget: RefreshBudget = .default, maxAge: Int64? = nil) {
        self.mode = mode
        self.budget = budget
        self.maxAge = maxAge
    }

    /// Read every registration.
    public static let all = RefreshPolicy(mode: .all)
    /// Read nothing (`--no-refresh`).
    public static let none = RefreshPolicy(mode: .none)
    /// Read what the plan changes and a slice of the rest (the default budget).
    public static let sample = RefreshPolicy(mode: .sample)

    /// Whether the policy reads FCM at all.
    public var reads: Bool { mode != .none }
}
