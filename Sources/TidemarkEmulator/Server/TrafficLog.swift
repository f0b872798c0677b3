import Foundation
import Synchronization

/// What reached the emulator: counters of FCM requests, 429s and injected faults, and, when switched
/// on, every subscription change it carried out, in order. Test harnesses read it through the admin
/// API to check that a client sent the minimum of requests and never replayed finished work.
public final class TrafficLog: Sendable {
    /// One request that changed subscriptions (or would have: an unsubscribe of a missing membership).
    public struct Change: Sendable, Codable, Equatable {
        /// Its place in the order the emulator received changes.
        public var sequence: Int
        /// The project it changed.
        public var project: String
        /// `subscribe` or `unsubscribe`.
        public var operation: String
        /// The topic it changed.
        public var topic: String
        /// The registration tokens it named.
        public var tokens: [String]
        /// `v1` or `iid`.
        public var api: String
    }

    /// Request counts by surface, and the window the changes arrived in.
    public struct Counters: Sendable, Codable, Equatable {
        /// Authenticated requests to FCM's surfaces (the admin API and the token endpoint excluded).
        public var requests = 0
        /// Of `requests`, those to the v1 API.
        public var v1Requests = 0
        /// Of `requests`, those to the Instance ID API.
        public var iidRequests = 0
        /// Of `requests`, those to the device-group API.
        public var groupRequests = 0
        /// Requests answered 429 by the rate limit.
        public var rateLimited = 0
        /// Requests answered with an injected fault (status, dropped connection or per-token INTERNAL).
        public var faults = 0
        /// Subscription changes that reached the engine, in tokens.
        public var tokensChanged = 0
        /// Access tokens granted by the token endpoints (OAuth2, STS, IAM credentials, the metadata
        /// server): how often callers fetched one.
        public var tokenGrants = 0
        /// TCP connections that carried requests to FCM's surfaces or the token endpoints (the admin
        /// API's excluded), each counted once while it stays open: a client that keeps its
        /// connections open between calls opens few.
        public var connections = 0
        /// When the first and the last of them arrived (Unix seconds): the window to measure a rate over.
        public var firstChangeAt: Double?
        /// When the last change arrived (Unix seconds).
        public var lastChangeAt: Double?

        enum CodingKeys: String, CodingKey {
            case requests
            case v1Requests = "v1_requests"
            case iidRequests = "iid_requests"
            case groupRequests = "group_requests"
            case rateLimited = "rate_limited"
            case faults
            case tokensChanged = "tokens_changed"
            case tokenGrants = "token_grants"
            case connections
            case firstChangeAt = "first_change_at"
            case lastChangeAt = "last_change_at"
        }
    }

    private struct Inner {
        var counters = Counters()
        var recording = false
        var changes: [Change] = []
        var sequence = 0
        var open: Set<ObjectIdentifier> = []
    }

    private let inner = Mutex(Inner())

    /// An empty log.
    public init() {}

    /// The counts so far.
    public var counters: Counters { inner.withLock { $0.counters } }

    /// Whether changes are recorded (off by default: a million-change apply would keep them all).
    public var recording: Bool {
        get { inner.withLock { $0.recording } }
        set { inner.withLock { $0.recording = newValue } }
    }

    func count(_ update: (inout Counters) -> Void) { inner.withLock { update(&$0.counters) } }

    /// Counts the connection `id` if it carries its first request; false when it was counted already.
    func noteConnection(_ id: ObjectIdentifier) -> Bool {
        inner.withLock { inner in
            guard inner.open.insert(id).inserted else { return false }
            inner.counters.connections += 1
            return true
        }
    }

    /// The connection `id` closed: an identifier used again later is a new connection.
    func connectionClosed(_ id: ObjectIdentifier) {
        _ = inner.withLock { $0.open.remove(id) }
    }

    func recordChange(project: String, operation: String, topic: String, tokens: [String], api: String) {
        inner.withLock { inner in
            inner.counters.tokensChanged += tokens.count
            let now = Date().timeIntervalSince1970
            if inner.counters.firstChangeAt == nil { inner.counters.firstChangeAt = now }
            inner.counters.lastChangeAt = now
            guard inner.recording else { return }
            inner.sequence += 1
            inner.changes.append(
                Change(
                    sequence: inner.sequence, project: project, operation: operation, topic: topic,
                    tokens: tokens, api: api))
        }
    }

    /// Recorded changes of `project` after `sequence`.
    public func changes(project: String, after sequence: Int) -> [Change] {
        inner.withLock { inner in inner.changes.filter { $0.sequence > sequence && $0.project == project } }
    }

    /// Zeroes the counters and forgets recorded changes; recording stays as it was.
    public func reset() {
        inner.withLock { inner in
            inner.counters = Counters()
            inner.changes = []
            inner.open = []
        }
    }
}
