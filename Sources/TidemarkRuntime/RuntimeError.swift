import TidemarkCore

/// A setting, a file or an environment variable that stops a run before it starts: one sentence that
/// names what is wrong and what to change.
public struct RuntimeError: TidemarkError {
    /// `settings`.
    public var reason: FailureReason { "settings" }

    /// The message, a sentence that says what to do.
    public let description: String

    /// An error with `description` as its whole message.
    public init(_ description: String) { self.description = description }
}
