import Foundation

/// What a backend knows of one registration token.
public enum RegistrationStatus: Sendable, Equatable {
    /// Live, subscribed to these topics.
    case active(topics: [String])
    /// FCM does not know the token (uninstalled app, expired token).
    case notFound
}

/// The result for one token of a subscribe or unsubscribe.
public enum TokenOutcome: Sendable, Equatable, Codable {
    /// FCM made the change (or it was made already).
    case ok
    /// FCM refused the change for this token, with its error.
    case failed(TokenError)

    /// Whether the change was made.
    public var isOK: Bool { self == .ok }
}

/// A per-token error as FCM reports it.
public struct TokenError: Error, Sendable, Hashable, Codable, CustomStringConvertible {
    /// FCM's error codes that tidemark acts on; any other is kept by name.
    public enum Code: Sendable, Hashable, Comparable, CustomStringConvertible {
        /// `NOT_FOUND`: FCM does not know the registration.
        case notFound
        /// `INVALID_ARGUMENT`: not a registration token, or a bad topic name.
        case invalidArgument
        /// `TOO_MANY_TOPICS`: the device holds 2000 topics already.
        case tooManyTopics
        /// `INTERNAL`: FCM failed; worth trying again.
        case `internal`
        /// `RESOURCE_EXHAUSTED`: over the quota; worth trying again later.
        case resourceExhausted
        /// `UNAVAILABLE`: FCM could not answer now; worth trying again.
        case unavailable
        /// `DEADLINE_EXCEEDED`: FCM ran out of time; worth trying again.
        case deadlineExceeded
        /// A code tidemark does not act on, kept by name.
        case other(String)

        static let known: [Code] = [
            .notFound, .invalidArgument, .tooManyTopics, .internal, .resourceExhausted,
            .unavailable, .deadlineExceeded,
        ]

        /// The code FCM names `rawValue` (`NOT_FOUND`, …), or `.other` for one tidemark does not know.
        public init(_ rawValue: String) {
            self = Self.known.first { $0.rawValue == rawValue } ?? .other(rawValue)
        }

        /// The code as FCM spells it.
        public var rawValue: String {
            switch self {
            case .notFound: "NOT_FOUND"
            case .invalidArgument: "INVALID_ARGUMENT"
            case .tooManyTopics: "TOO_MANY_TOPICS"
            case .internal: "INTERNAL"
            case .resourceExhausted: "RESOURCE_EXHAUSTED"
            case .unavailable: "UNAVAILABLE"
            case .deadlineExceeded: "DEADLINE_EXCEEDED"
            case .other(let code): code
            }
        }

        /// The code as FCM spells it.
        public var description: String { rawValue }

        /// Codes sort by their names, for stable summaries.
        public static func < (a: Code, b: Code) -> Bool { a.rawValue < b.rawValue }
    }

    /// FCM's code for the error.
    public var code: Code

    /// An error with `code`.
    public init(_ code: Code) { self.code = code }
    /// An error with the code FCM names `code`.
    public init(_ code: String) { self.code = Code(code) }

    /// The token is unknown to FCM.
    public static let notFound = TokenError(.notFound)
    /// Not a registration token, or a bad topic name.
    public static let invalidArgument = TokenError(.invalidArgument)
    /// The device holds 2000 topics already.
    public static let tooManyTopics = TokenError(.tooManyTopics)
    /// FCM failed on its side.
    public static let internalError = TokenError(.internal)
    /// Over the quota.
    public static let resourceExhausted = TokenError(.resourceExhausted)
    /// FCM could not answer now.
    public static let unavailable = TokenError(.unavailable)

    /// Errors worth trying again for the same token.
    public var isRetryable: Bool {
        switch code {
        case .internal, .resourceExhausted, .unavailable, .deadlineExceeded: true
        default: false
        }
    }

    /// The token is unknown to FCM: recorded as dead and skipped from then on.
    public var meansUnregistered: Bool { code == .notFound }

    /// What the error means for the person reading an apply's summary.
    public var advice: String {
        switch code {
        case .notFound: "unregistered in FCM; recorded and skipped from now on"
        case .tooManyTopics: "the device holds 2000 topics already"
        default: "not retried"
        }
    }

    /// The code as FCM spells it.
    public var description: String { code.rawValue }

    private enum CodingKeys: String, CodingKey { case code }

    /// Decodes `{"code": "NOT_FOUND"}`, as plans and reports store it.
    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        code = Code(try container.decode(String.self, forKey: .code))
    }

    /// Encodes `{"code": "NOT_FOUND"}`.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(code.rawValue, forKey: .code)
    }
}

/// A backend failure that says whether trying the same call again may help.
///
/// Backends that retry on their own (the HTTP client, per `RetryPolicy`) throw only what retries
/// could not fix, and say so; the executor then does not retry it a second time.
public protocol RetryableError: Error {
    /// Whether trying the same call again may succeed.
    var isRetryable: Bool { get }
}
