import Synchronization
import TidemarkCore

/// Wraps a backend to count its calls and to fail chosen ones, for tests of what the core does
/// when FCM misbehaves half-way.
public final class ScriptedBackend: Backend {
    /// The backend calls that can be counted and failed.
    public enum Call: Sendable, Equatable {
        case refresh, subscribe, unsubscribe, groupKey, createGroup, addToGroup, removeFromGroup
    }

    /// A failure no retry fixes, as a dead network would give after the client's own retries.
    public struct Failure: RetryableError, Equatable, CustomStringConvertible {
        /// The call that failed.
        public var call: Call
        /// Never retried.
        public var isRetryable: Bool { false }
        /// "scripted failure of CALL".
        public var description: String { "scripted failure of \(call)" }
    }

    /// The backend that carries out the calls that do not fail.
    public let base: any Backend
    private let log = Mutex<[Call]>([])
    private let failing = Mutex<[Call: Int]>([:])
    private let failingAfter = Mutex<[Call: Int]>([:])
    private let readLog = Mutex<[String]>([])

    /// Tokens per journal step; the base backend's when nil.
    public let step: Int?

    /// Wraps `base`; `journalStep` overrides the base's.
    public init(_ base: any Backend, journalStep: Int? = nil) {
        self.base = base
        self.step = journalStep
    }

    /// The base's identity.
    public var identity: BackendIdentity { base.identity }
    /// The base's location.
    public var location: String { base.location }

    /// The override, else the base's.
    public var journalStep: Int? { step ?? base.journalStep }

    /// The base's count.
    public func requests(for operations: [PlannedOperation]) -> Int { base.requests(for: operations) }
    /// The base's count.
    public func requestCount() -> Int? { base.requestCount() }
    /// The base's count.
    public func retryCount() -> Int? { base.retryCount() }

    /// Every call so far, in order.
    public var calls: [Call] { log.withLock { $0 } }

    /// Makes the `nth` (1-based) call of `call` from now on fail with `Failure`.
    public func fail(_ call: Call, nth: Int = 1) { failing.withLock { $0[call] = nth } }

    /// Makes the `nth` (1-based) call of `call` from now on reach the base backend, which carries it
    /// out, and then fail with `Failure`: a kill or a lost connection after FCM acted on the request.
    public func failAfter(_ call: Call, nth: Int = 1) { failingAfter.withLock { $0[call] = nth } }

    private func noteAfter(_ call: Call) throws { try Self.countDown(failingAfter, call) }

    private func note(_ call: Call) throws {
        log.withLock { $0.append(call) }
        try Self.countDown(failing, call)
    }

    /// Counts `call` down in `schedule`; throws `Failure` when its turn to fail has come.
    private static func countDown(_ schedule: borrowing Mutex<[Call: Int]>, _ call: Call) throws {
        let fails = schedule.withLock { failing -> Bool in
            guard let n = failing[call] else { return false }
            if n <= 1 {
                failing[call] = nil
                return true
            }
            failing[call] = n - 1
            return false
        }
        if fails { throw Failure(call: call) }
    }

    /// Every registration read so far, in order (a token read twice is listed twice).
    public var tokensRead: [String] { readLog.withLock { $0 } }

    /// Logs the call and the tokens read, then reads through the base unless scripted to fail.
    public func refresh(_ tokens: [String]) async throws -> [RegistrationStatus] {
        try note(.refresh)
        readLog.withLock { $0 += tokens }
        return try await base.refresh(tokens)
    }

    /// Logs the call and subscribes through the base, unless scripted to fail before it (`fail`) or
    /// after it (`failAfter`).
    public func subscribe(topic: String, tokens: [String]) async throws -> [TokenOutcome] {
        try note(.subscribe)
        let outcomes = try await base.subscribe(topic: topic, tokens: tokens)
        try noteAfter(.subscribe)
        return outcomes
    }

    /// Logs the call and unsubscribes through the base, unless scripted to fail before it or after it.
    public func unsubscribe(topic: String, tokens: [String]) async throws -> [TokenOutcome] {
        try note(.unsubscribe)
        let outcomes = try await base.unsubscribe(topic: topic, tokens: tokens)
        try noteAfter(.unsubscribe)
        return outcomes
    }

    /// Logs the call, then looks the group up through the base unless scripted to fail.
    public func groupKey(name: String) async throws -> String? {
        try note(.groupKey)
        return try await base.groupKey(name: name)
    }

    /// Logs the call, then creates the group through the base unless scripted to fail.
    public func createGroup(name: String, tokens: [String]) async throws -> String {
        try note(.createGroup)
        return try await base.createGroup(name: name, tokens: tokens)
    }

    /// Logs the call, then adds through the base unless scripted to fail.
    public func addToGroup(name: String, key: String, tokens: [String]) async throws -> String {
        try note(.addToGroup)
        return try await base.addToGroup(name: name, key: key, tokens: tokens)
    }

    /// Exports through the base (never scripted to fail).
    public func exportGroup(name: String, key: String) async throws -> [String]? {
        try await base.exportGroup(name: name, key: key)
    }

    /// Logs the call, then removes through the base unless scripted to fail.
    public func removeFromGroup(name: String, key: String, tokens: [String]) async throws {
        try note(.removeFromGroup)
        try await base.removeFromGroup(name: name, key: key, tokens: tokens)
    }
}
