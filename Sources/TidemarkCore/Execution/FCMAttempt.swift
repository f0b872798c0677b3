/// One attempt of a request to FCM, as it ended: what `serve` counts in
/// `tidemark_fcm_requests_total` and watches to tell a reconcile that FCM keeps failing.
public struct FCMAttempt: Sendable, Equatable {
    /// Whether the request reads FCM or changes it.
    public enum Kind: String, Sendable, CaseIterable {
        /// A `GET`: a registration's topics, a group's key (the plans' refresh, the drift check).
        case read
        /// Anything else: subscriptions, device-group calls.
        case write
    }

    /// How the attempt ended.
    public enum Outcome: String, Sendable, CaseIterable {
        /// Answered with a 2xx status.
        case success
        /// Failed (a retryable status, a network error, an expired access token) and is tried again.
        case retried
        /// Ended the request without success: an answer that is not retried (a 4xx such as an
        /// unregistered token's 404), or the last failure once the retries gave up.
        case failed
    }

    /// The request's kind.
    public var kind: Kind
    /// How the attempt ended.
    public var outcome: Outcome
    /// The answer's status class (`2xx`, `4xx`, `429`, `5xx`), or `network` when nothing answered.
    public var code: String
    /// What came back, in words (`HTTP 503 (UNAVAILABLE)`, `the connection was refused`).
    public var cause: String
    /// Seconds the request had spent, its earlier attempts included, when this one ended.
    public var elapsed: Double

    /// An attempt.
    public init(kind: Kind, outcome: Outcome, code: String, cause: String, elapsed: Double) {
        self.kind = kind
        self.outcome = outcome
        self.code = code
        self.cause = cause
        self.elapsed = elapsed
    }

    /// The class `code` names for an HTTP `status` (nil: no answer, `network`).
    public static func code(of status: Int?) -> String {
        guard let status else { return "network" }
        if status == 429 { return "429" }
        return "\(status / 100)xx"
    }

    /// Every (outcome, code) pair a request can end with, for declaring counters at 0.
    public static let outcomes: [(outcome: Outcome, code: String)] = [
        (.success, "2xx"), (.retried, "429"), (.retried, "5xx"), (.retried, "network"), (.retried, "4xx"),
        (.failed, "4xx"), (.failed, "429"), (.failed, "5xx"), (.failed, "network"),
    ]
}

/// Told of every attempt of every request to FCM (`FCMAttempt`); called on the request's task, so it
/// must not block.
public typealias FCMAttemptObserver = @Sendable (FCMAttempt) -> Void
