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

/// The backend of a command that reads nothing from FCM (`plan --no-refresh`): it knows the
/// backend's identity and how its transport counts requests, and refuses every call. Such a plan
/// needs no credential, so pull-request jobs can plan without the key.
public struct DetachedBackend: Backend {
    /// The backend a real run would reach.
    public let identity: BackendIdentity
    /// How a real apply would reach FCM.
    public let transport: TopicTransport
    /// How that transport counts requests, which decides the requests a plan reports.
    public let counted: TopicTransport.Requests

    /// A backend that stands for `identity`, reached through `transport` (whose requests are counted
    /// `counted`), and calls nothing.
    public init(identity: BackendIdentity, transport: TopicTransport, counted: TopicTransport.Requests) {
        self.identity = identity
        self.transport = transport
        self.counted = counted
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
    public func requests(for operations: [PlannedOperation]) -> Int {
        TopicTransport.requests(for: operations, counted: counted)
    }
}
