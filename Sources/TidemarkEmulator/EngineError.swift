import TidemarkCore

/// A whole-request failure of the engine, with the FCM error text a server would send.
public struct EngineError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The error texts FCM sends for whole-request failures.
    public enum Code: String, Sendable {
        /// IID: `{"error":"Topic name format is invalid"}`; v1: 400 INVALID_ARGUMENT.
        case invalidTopicName = "Topic name format is invalid"
        /// IID: `{"error":"MissingIIdToken"}`.
        case missingTokens = "MissingIIdToken"
        /// More than 1000 tokens in one batch call.
        case tooManyTokens = "Too many registration tokens"
        /// v1 create of an existing subscription: 409 ALREADY_EXISTS.
        case alreadyExists = "ALREADY_EXISTS"
        /// v1 get/delete of a missing subscription, or an unknown registration.
        case notFound = "NOT_FOUND"
        case invalidArgument = "INVALID_ARGUMENT"
        case tooManyTopics = "TOO_MANY_TOPICS"
        case unavailable = "UNAVAILABLE"
        case internalError = "INTERNAL"
        case resourceExhausted = "RESOURCE_EXHAUSTED"
        case permissionDenied = "PERMISSION_DENIED"
    }

    /// Which failure.
    public var code: Code
    /// More about it, for messages.
    public var detail: String

    /// A failure of `code`.
    public init(_ code: Code, _ detail: String = "") {
        self.code = code
        self.detail = detail
    }

    /// The code's text, and the detail when there is one.
    public var description: String { detail.isEmpty ? code.rawValue : "\(code.rawValue): \(detail)" }
}

extension EngineError: RetryableError {
    /// Overload and internal failures may pass; a malformed request never will.
    public var isRetryable: Bool { [.unavailable, .internalError, .resourceExhausted].contains(code) }
}
