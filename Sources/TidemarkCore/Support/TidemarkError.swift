/// The one shape of every error tidemark throws on purpose, in every target: a public struct around
/// its own code, whose message is a sentence that says what to do.
///
/// `reason` names the kind of failure in a few stable words (`stale_plan`, `state_locked`,
/// `inventory_shrank`): what `serve` shows as a workspace's reason and sends in its events, and what
/// an alert may match. The message may change between releases; the reason does not.
public protocol TidemarkError: Error, Sendable, CustomStringConvertible {
    /// The kind of failure.
    var reason: FailureReason { get }
}

/// The kind of a failure, by a stable name in snake case (`state_locked`): a typed value code
/// matches on (`error.reason == .stateLocked`), never the message's text. Each error type names
/// its own reasons where it is declared (`"journal_damaged"`); those that code outside it decides
/// on are named here too.
public struct FailureReason: RawRepresentable, Hashable, Sendable, Codable, CustomStringConvertible,
    ExpressibleByStringLiteral
{
    /// The stable name: what `/status`, the events, the logs and the metrics show.
    public let rawValue: String

    /// The reason named `rawValue`.
    public init(rawValue: String) { self.rawValue = rawValue }

    /// The reason named by the literal.
    public init(stringLiteral value: String) { rawValue = value }

    /// The stable name.
    public var description: String { rawValue }

    /// An error tidemark did not throw on purpose.
    public static let unexpected: Self = "unexpected"
    /// The manifests (or tidemark.yaml) have errors; the diagnostics name each file and line.
    public static let invalidInput: Self = "invalid_input"
    /// A plan has errors (a rail refused it).
    public static let planHasErrors: Self = "plan_has_errors"
    /// Nothing was applied yet: there is no state.
    public static let noState: Self = "no_state"
    /// The inventory shrank past the shrink guard.
    public static let inventoryShrank: Self = "inventory_shrank"
    /// More of the inventory's tokens are dead than the dead-token guard allows.
    public static let tooManyDead: Self = "too_many_dead"
    /// Another run holds the state's lock.
    public static let stateLocked: Self = "state_locked"
    /// This run's lease on the state's lock lapsed and another run took the lock (a stall).
    public static let leaseLost: Self = "lease_lost"
    /// The state store cannot be reached (down, a lost connection, a timeout).
    public static let stateUnreachable: Self = "state_unreachable"
    /// Token changes FCM refused for a reason other than the token being unregistered.
    public static let tokenFailures: Self = "token_failures"
}
