import Foundation

/// `--max-unsubscribes N|P%` (or `max_unsubscribes` in tidemark.yaml, or on a topic in the manifests):
/// the blast radius past which a plan is refused.
public struct UnsubscribeLimit: Sendable, Equatable, CustomStringConvertible {
    /// A number of unsubscriptions, or a share of the known memberships.
    public enum Bound: Sendable, Equatable {
        case count(Int)
        /// A share of the memberships tidemark knows of (observed, over every topic, or the topic's own).
        case percent(Double)
        /// `none`, said out loud: no limit (and no default rail of `serve` either).
        case unlimited
    }

    /// The limit.
    public var bound: Bound
    /// Where it was set, as the person wrote it: "--max-unsubscribes", "max_unsubscribes".
    public var setting: String

    /// A limit of `bound`, set by `setting`.
    public init(_ bound: Bound, setting: String) {
        self.bound = bound
        self.setting = setting
    }

    /// Parses "500", "5%" or "none" (no limit, said out loud).
    public init(parsing text: String, setting: String = "--max-unsubscribes") throws(TargetError) {
        self.setting = setting
        let trimmed = text.trimmingCharacters(in: .whitespaces)
        if trimmed == "none" {
            bound = .unlimited
        } else if trimmed.hasSuffix("%") {
            guard let value = Double(trimmed.dropLast()), value >= 0, value <= 100 else {
                throw TargetError("\(setting) '\(text)' is not a percentage between 0% and 100%.")
            }
            bound = .percent(value)
        } else {
            guard let value = Int(trimmed), value >= 0 else {
                throw TargetError(
                    "\(setting) '\(text)' is neither a number of unsubscriptions (e.g. 500), a percentage (e.g. 5%) nor 'none'."
                )
            }
            bound = .count(value)
        }
    }

    /// Whether it limits anything (not `none`).
    public var limits: Bool { bound != .unlimited }

    /// The limit as written: "500", "5%" or "none".
    public var description: String {
        switch bound {
        case .count(let n): "\(n)"
        case .percent(let p): p == p.rounded() ? "\(Int(p))%" : "\(p)%"
        case .unlimited: "none"
        }
    }

    /// How many of `known` memberships it allows to go.
    public func allowed(of known: Int) -> Int {
        switch bound {
        case .count(let n): n
        case .percent(let p): Int((Double(known) * p / 100).rounded(.down))
        case .unlimited: Int.max
        }
    }

    /// Why `unsubscribes` out of `known` memberships crosses the limit, or nil when it does not.
    public func violation(unsubscribes: Int, known: Int) -> String? {
        let allowed = allowed(of: known)
        guard unsubscribes > allowed else { return nil }
        let percent = known > 0 ? String(format: "%.1f", Double(unsubscribes) * 100 / Double(known)) : ""
        let share =
            known > 0 ? " (\(percent)% of the \(PlanRenderer.formatCount(known)) memberships tidemark knows)" : ""
        return
            "the plan would unsubscribe \(PlanRenderer.formatCount(unsubscribes)) memberships\(share), more than \(setting) \(self) allows (\(PlanRenderer.formatCount(allowed))); rotated tokens are not counted. Check the manifests, narrow the plan with --target, or raise the limit."
    }
}

/// A `--target`, `--exclude` or `--max-unsubscribes` value that cannot be used.
public struct TargetError: TidemarkError {
    /// `invalid_selector`.
    public var reason: FailureReason { "invalid_selector" }

    /// The reason, as a sentence naming the value.
    public var description: String
    /// An error saying `description`.
    public init(_ description: String) { self.description = description }
}
