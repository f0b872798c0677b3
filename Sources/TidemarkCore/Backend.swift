/// Which FCM a plan was made against.
public struct BackendIdentity: Sendable, Codable, Equatable, CustomStringConvertible {
    /// `embedded`, `emulator` or `fcm`.
    public var kind: String
    public var project: String

    public init(kind: String, project: String) {
        self.kind = kind
        self.project = project
    }

    public var description: String { "\(kind) (project \(project))" }
}

/// What a backend knows of one registration token.
public enum RegistrationStatus: Sendable, Equatable {
    /// Live, subscribed to these topics.
    case active(topics: [String])
    /// FCM does not know the token (uninstalled app, expired token).
    case notFound
}

/// The result for one token of a subscribe or unsubscribe.
public enum TokenOutcome: Sendable, Equatable, Codable {
    case ok
    case failed(TokenError)

    public var isOK: Bool { self == .ok }
}

/// Per-token error codes as FCM reports them.
public struct TokenError: Error, Sendable, Hashable, Codable, CustomStringConvertible {
    public var code: String

    public init(_ code: String) { self.code = code }

    public static let notFound = TokenError("NOT_FOUND")
    public static let invalidArgument = TokenError("INVALID_ARGUMENT")
    public static let tooManyTopics = TokenError("TOO_MANY_TOPICS")
    public static let internalError = TokenError("INTERNAL")
    public static let resourceExhausted = TokenError("RESOURCE_EXHAUSTED")
    public static let unavailable = TokenError("UNAVAILABLE")

    /// Errors worth trying again for the same token.
    public var isRetryable: Bool {
        ["INTERNAL", "RESOURCE_EXHAUSTED", "UNAVAILABLE", "DEADLINE_EXCEEDED"].contains(code)
    }

    public var description: String { code }
}

/// A failure of a device-group call, with FCM's error text.
public struct GroupError: Error, Sendable, Equatable, CustomStringConvertible {
    public enum Kind: String, Sendable {
        case alreadyExists = "notification_key already exists"
        case noValidRegistrationIDs = "no valid registration ids"
        case nameMismatch = "notification_key_name doesn't match the group name of the notification_key"
        case notFound = "notification_key not found"
        case tooManyMembers = "maximum number of members exceeded"
    }

    public var kind: Kind

    public init(_ kind: Kind) { self.kind = kind }

    public var description: String { kind.rawValue }
}

/// An FCM: the embedded engine, the HTTP emulator or the real service.
///
/// The same planner and executor run against every conformer, and one conformance suite checks them.
public protocol Backend: Sendable {
    var identity: BackendIdentity { get }

    /// The status of each token, in the order given.
    func refresh(_ tokens: [String]) async throws -> [RegistrationStatus]

    /// Subscribes up to 1000 tokens to `topic`; one outcome per token, in order.
    func subscribe(topic: String, tokens: [String]) async throws -> [TokenOutcome]

    /// Unsubscribes up to 1000 tokens from `topic`; one outcome per token, in order.
    func unsubscribe(topic: String, tokens: [String]) async throws -> [TokenOutcome]

    /// The notification key of a group, or nil when no group has that name.
    func groupKey(name: String) async throws -> String?

    /// Creates a group; returns its key. Invalid tokens are dropped as FCM does.
    func createGroup(name: String, tokens: [String]) async throws -> String

    /// Adds members; returns the key.
    func addToGroup(name: String, key: String, tokens: [String]) async throws -> String

    /// Removes members; removing the last one deletes the group.
    func removeFromGroup(name: String, key: String, tokens: [String]) async throws

    /// Requests sent to FCM so far (retries included), or nil when the backend does not count them
    /// and one call is one request.
    func requestCount() -> Int?
}

extension Backend {
    public func requestCount() -> Int? { nil }
}

/// A backend failure that says whether trying the same call again may help.
///
/// Backends that retry on their own (the HTTP client, per `RetryPolicy`) throw only what retries
/// could not fix, and say so; the executor then does not retry it a second time.
public protocol RetryableError: Error {
    var isRetryable: Bool { get }
}
