/// The one shape of every error tidemark throws on purpose, in every target: a public struct around
/// its own code, whose message is a sentence that says what to do.
///
/// `reason` names the kind of failure in a few stable words (`stale_plan`, `state_locked`,
/// `inventory_shrank`): what `serve` shows as a workspace's reason and sends in its events, and what
/// an alert may match. The message may change between releases; the reason does not.
public protocol TidemarkError: Error, Sendable, CustomStringConvertible {
    /// The kind of failure, in snake case.
    var reason: String { get }
}
