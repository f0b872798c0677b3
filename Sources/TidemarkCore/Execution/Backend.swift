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

/// A failure of a device-group call, with FCM's error text.
public struct GroupError: TidemarkError, Equatable {
    /// The failures FCM's group API answers with, by their text.
    public enum Kind: String, Sendable {
        case alreadyExists = "notification_key already exists"
        case noValidRegistrationIDs = "no valid registration ids"
        case nameMismatch = "notification_key_name doesn't match the group name of the notification_key"
        case notFound = "notification_key not found"
        case tooManyMembers = "maximum number of members exceeded"
    }

    /// Which failure it was.
    public var kind: Kind

    /// A failure of `kind`.
    public init(_ kind: Kind) { self.kind = kind }

    /// FCM's text for the failure.
    public var description: String { kind.rawValue }
    /// `group_already_exists`, `group_not_found`, `group_too_many_members`…
    public var reason: FailureReason {
        switch kind {
        case .alreadyExists: "group_already_exists"
        case .noValidRegistrationIDs: "group_no_valid_registrations"
        case .nameMismatch: "group_name_mismatch"
        case .notFound: "group_not_found"
        case .tooManyMembers: "group_too_many_members"
        }
    }
}

/// An FCM: the embedded engine, the HTTP emulator or the real service.
///
/// The same planner and executor run against every conformer, and one conformance suite checks them.
public protocol Backend: Sendable {
    var identity: BackendIdentity { get }

    /// Where the backend's answers come from, for messages: the identity and, over HTTP, the address
    /// and the setting that chose it.
    var location: String { get }

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

    /// Every registration token of the group, through FCM's export call (until 29 September 2027);
    /// nil when FCM knows no such group.
    func exportGroup(name: String, key: String) async throws -> [String]?

    /// Requests sent to FCM so far (retries included), or nil when the backend does not count them
    /// and one call is one request.
    func requestCount() -> Int?

    /// Of those, the requests that repeated an earlier one (after a 429, a 5xx or a lost connection).
    func retryCount() -> Int?

    /// The requests an apply of `operations` sends, at least: what the plan tells its reviewer.
    func requests(for operations: [PlannedOperation]) -> Int

    /// How many tokens of a subscribe or unsubscribe an apply sends between journal entries, or nil for
    /// the whole operation at once. A transport with one request per token (v1) journals in steps, so a
    /// killed apply re-sends at most a step of each operation in flight; a batch call is all or nothing.
    var journalStep: Int? { get }
}

extension Backend {
    /// Where the backend is, by its identity unless it says more (a URL).
    public var location: String { identity.description }
    /// Not counted: the executor counts the calls it made.
    public func requestCount() -> Int? { nil }
    /// Not counted: a backend without its own retries repeats nothing.
    public func retryCount() -> Int? { nil }

    /// One call per operation that reaches FCM (state-only steps send nothing): what the embedded
    /// engine and a batch API need.
    public func requests(for operations: [PlannedOperation]) -> Int { operations.count { !$0.kind.isStateOnly } }

    /// A batch API: each operation is journaled whole.
    public var journalStep: Int? { nil }
}

/// A backend failure that says whether trying the same call again may help.
///
/// Backends that retry on their own (the HTTP client, per `RetryPolicy`) throw only what retries
/// could not fix, and say so; the executor then does not retry it a second time.
public protocol RetryableError: Error {
    /// Whether trying the same call again may succeed.
    var isRetryable: Bool { get }
}

/// The backend of a command that reads nothing from FCM (`plan --no-refresh`): it knows the
/// backend's identity and how its transport counts requests, and refuses every call. Such a plan
/// needs no credential, so pull-request jobs can plan without the key.
public struct DetachedBackend: Backend {
    /// The backend a real run would reach.
    public let identity: BackendIdentity
    /// How a real apply would reach FCM, which decides the requests a plan reports.
    public let transport: TopicTransport

    /// A backend that stands for `identity`, reached through `transport`, and calls nothing.
    public init(identity: BackendIdentity, transport: TopicTransport) {
        self.identity = identity
        self.transport = transport
    }

    /// What every call of a detached backend throws.
    public struct Refused: TidemarkError {
        /// `fcm_not_read`.
        public var reason: FailureReason { "fcm_not_read" }

        /// Why the call was refused, and which flag said so.
        public var description: String {
            "this run was told not to read FCM (--refresh none), so it holds no credential and makes no call."
        }
    }

    /// Refused: the run reads nothing.
    public func refresh(_ tokens: [String]) async throws -> [RegistrationStatus] { throw Refused() }
    /// Refused: the run changes nothing.
    public func subscribe(topic: String, tokens: [String]) async throws -> [TokenOutcome] { throw Refused() }
    /// Refused: the run changes nothing.
    public func unsubscribe(topic: String, tokens: [String]) async throws -> [TokenOutcome] { throw Refused() }
    /// Refused: the run reads nothing.
    public func groupKey(name: String) async throws -> String? { throw Refused() }
    /// Refused: the run changes nothing.
    public func createGroup(name: String, tokens: [String]) async throws -> String { throw Refused() }
    /// Refused: the run changes nothing.
    public func addToGroup(name: String, key: String, tokens: [String]) async throws -> String { throw Refused() }
    /// Refused: the run changes nothing.
    public func removeFromGroup(name: String, key: String, tokens: [String]) async throws { throw Refused() }
    /// Refused: the run reads nothing.
    public func exportGroup(name: String, key: String) async throws -> [String]? { throw Refused() }

    /// The requests the transport would send for `operations`, as a plan reports them.
    public func requests(for operations: [PlannedOperation]) -> Int { transport.requests(for: operations) }
}
