import Foundation
import Synchronization
import TidemarkCore

/// Faults the emulator injects into FCM calls, to rehearse a bad day. Seeded, so runs repeat.
public struct FaultSettings: Codable, Sendable, Equatable {
    /// Share of FCM calls answered 429 RESOURCE_EXHAUSTED.
    public var http429: Double = 0
    /// Share answered 500 INTERNAL.
    public var http500: Double = 0
    /// Share answered 503 UNAVAILABLE.
    public var http503: Double = 0
    /// Share of tokens in a topic call that fail with INTERNAL (per-token result in IID, 500 in v1).
    public var tokenInternal: Double = 0
    /// Milliseconds added to every FCM call.
    public var latencyMs: Int = 0
    /// Share of FCM calls whose connection is closed without an answer.
    public var dropConnection: Double = 0
    /// The seed of the random draws that decide which calls a fault hits, so a run can be repeated.
    public var seed: UInt64 = 1

    /// No faults.
    public init() {}

    enum CodingKeys: String, CodingKey {
        case http429 = "http_429"
        case http500 = "http_500"
        case http503 = "http_503"
        case tokenInternal = "token_internal"
        case latencyMs = "latency_ms"
        case dropConnection = "drop_connection"
        case seed
    }

    /// Decodes the admin API's JSON; absent fields keep their defaults.
    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        let d = FaultSettings()
        http429 = try c.decodeIfPresent(Double.self, forKey: .http429) ?? d.http429
        http500 = try c.decodeIfPresent(Double.self, forKey: .http500) ?? d.http500
        http503 = try c.decodeIfPresent(Double.self, forKey: .http503) ?? d.http503
        tokenInternal = try c.decodeIfPresent(Double.self, forKey: .tokenInternal) ?? d.tokenInternal
        latencyMs = try c.decodeIfPresent(Int.self, forKey: .latencyMs) ?? d.latencyMs
        dropConnection = try c.decodeIfPresent(Double.self, forKey: .dropConnection) ?? d.dropConnection
        seed = try c.decodeIfPresent(UInt64.self, forKey: .seed) ?? d.seed
    }

    /// The first setting outside its range, described, or nil.
    public var problem: String? {
        for (name, share) in [
            ("http_429", http429), ("http_500", http500), ("http_503", http503),
            ("token_internal", tokenInternal), ("drop_connection", dropConnection),
        ] where !(0...1).contains(share) {
            return "\(name) is a share between 0 and 1, not \(share)"
        }
        if http429 + http500 + http503 + dropConnection > 1 {
            return "http_429 + http_500 + http_503 + drop_connection must not exceed 1"
        }
        return latencyMs < 0 ? "latency_ms must not be negative" : nil
    }
}

/// The per-project limit on subscription changes (reference §5: 3000/s, 429 RESOURCE_EXHAUSTED).
public struct RateLimitSettings: Codable, Sendable, Equatable {
    /// What a call costs against the limit.
    public enum Unit: String, Codable, Sendable {
        /// Each token in a call counts (a 1000-token batchAdd costs 1000).
        case tokens
        /// Each request counts once.
        case requests
    }

    /// Changes per second per project; 0 turns the limit off.
    /// How an IID batch over the limit is answered (FCM documents both places, reference §1.4).
    public enum Answer: String, Codable, Sendable {
        /// The whole call: HTTP 429.
        case http
        /// Inside a 200: `{"error": "RESOURCE_EXHAUSTED"}` for every token of the call.
        case perToken = "per_token"
    }

    /// Changes (or requests, per `unit`) allowed per second and project.
    public var perSecond: Double = Double(FCMLimits.defaultQuota)
    /// What counts against `perSecond`.
    public var unit: Unit = .tokens
    /// How a call over the limit is answered.
    public var answer: Answer = .http

    /// A limit of `perSecond` per project, counted in `unit`, answered as `answer` says.
    public init(perSecond: Double = Double(FCMLimits.defaultQuota), unit: Unit = .tokens, answer: Answer = .http) {
        self.perSecond = perSecond
        self.unit = unit
        self.answer = answer
    }

    enum CodingKeys: String, CodingKey {
        case perSecond = "per_second"
        case unit, answer
    }

    /// Decodes the admin API's JSON; absent fields keep their defaults.
    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        perSecond = try c.decodeIfPresent(Double.self, forKey: .perSecond) ?? Double(FCMLimits.defaultQuota)
        unit = try c.decodeIfPresent(Unit.self, forKey: .unit) ?? .tokens
        answer = try c.decodeIfPresent(Answer.self, forKey: .answer) ?? .http
    }
}

/// The emulator's run-time switches: faults, rate limits, per-project API availability.
public final class EmulatorControl: Sendable {
    /// A fault injected into one call: the connection dropped, or an HTTP status.
    public enum Fault: Sendable, Equatable {
        case drop
        case status(Int)
    }

    struct State {
        var faults = FaultSettings()
        var rateLimit = RateLimitSettings()
        var iidDisabled: Set<String> = []
        var buckets: [String: TokenBucket] = [:]
        var random = SeededGenerator(seed: 1)
        var baseURL = "http://127.0.0.1:9099"
        var tokenEndpointFailures = 0
        var echoTokenRequests = false
        /// The date FCM's deadline rules see (`--as-of`); nil applies none.
        var asOf: Date?
        /// When each project was created (`--created`), for the rules on new projects.
        var created: [String: Date] = [:]
    }

    private let state = Mutex(State())
    private let timing: Timing

    /// `timing` is the clock rate limits run on; tests pass a manual one.
    public init(timing: Timing = .live) {
        self.timing = timing
    }

    /// The faults injected into FCM calls now.
    public var faults: FaultSettings {
        get { state.withLock { $0.faults } }
        set {
            state.withLock {
                $0.faults = newValue
                $0.random = SeededGenerator(seed: newValue.seed)
            }
        }
    }

    /// The rate limit applied now.
    public var rateLimit: RateLimitSettings {
        get { state.withLock { $0.rateLimit } }
        set {
            state.withLock {
                $0.rateLimit = newValue
                $0.buckets.removeAll()
            }
        }
    }

    /// Turns the Instance ID API on or off for `project` (as FCM did for projects created after the cut-off).
    public func setIIDEnabled(_ enabled: Bool, project: String) {
        state.withLock { state in
            if enabled { state.iidDisabled.remove(project) } else { state.iidDisabled.insert(project) }
        }
    }

    /// Makes the next `count` calls of the token endpoint answer 503, as an outage of Google's would.
    public func failTokenEndpoint(times count: Int) { state.withLock { $0.tokenEndpointFailures = count } }

    /// Makes the token endpoint refuse every request quoting the request's whole body back, as some
    /// servers and proxies do: what a client prints from such an answer must not show its credentials.
    public func echoTokenRequests(_ on: Bool) { state.withLock { $0.echoTokenRequests = on } }

    var echoesTokenRequests: Bool { state.withLock { $0.echoTokenRequests } }

    /// Whether this token request is one of those told to fail.
    func drawTokenEndpointFailure() -> Bool {
        state.withLock { state in
            guard state.tokenEndpointFailures > 0 else { return false }
            state.tokenEndpointFailures -= 1
            return true
        }
    }

    /// Whether `project` may use the Instance ID API.
    public func isIIDEnabled(project: String) -> Bool { state.withLock { !$0.iidDisabled.contains(project) } }

    /// The date FCM's 2027 deadline rules see, apart from the clock that checks tokens; nil applies
    /// none (the default, so the emulator keeps serving groups and IID after 2027 unless told).
    public var asOf: Date? {
        get { state.withLock { $0.asOf } }
        set { state.withLock { $0.asOf = newValue } }
    }

    /// Records when `project` was created: projects created on or after 1 December 2026 cannot create
    /// device groups, and on or after 1 October 2026 cannot use the Instance ID API.
    public func setCreated(_ date: Date, project: String) {
        state.withLock { $0.created[project] = date }
        if date >= FCMDeadlines.iidClosedToNewProjects { setIIDEnabled(false, project: project) }
    }

    /// When `project` was created (`--created`), if the emulator was told.
    public func created(project: String) -> Date? { state.withLock { $0.created[project] } }

    /// Whether device groups (and the call that lists their tokens) are turned down at `asOf`.
    public var groupsTurnedDown: Bool { asOf.map { $0 >= FCMDeadlines.deviceGroupsTurnedDown } ?? false }

    /// Whether the Instance ID API is turned down at `asOf`.
    public var iidTurnedDown: Bool { asOf.map { $0 >= FCMDeadlines.iidTurnedDown } ?? false }

    /// Whether `project` may create device groups: not when created on or after 1 December 2026.
    public func mayCreateGroups(project: String) -> Bool {
        guard let created = created(project: project) else { return true }
        return created < FCMDeadlines.deviceGroupsClosedToNewProjects
    }

    /// The projects whose Instance ID API is off, sorted.
    public var iidDisabledProjects: [String] { state.withLock { $0.iidDisabled.sorted() } }

    /// Admits a subscription change of `tokens` tokens, or returns the seconds to wait (for `Retry-After`).
    public func admit(project: String, tokens: Int) -> Double? {
        let time = Timing.seconds(timing.now())
        return state.withLock { state in
            let settings = state.rateLimit
            guard settings.perSecond > 0 else { return nil }
            let cost = settings.unit == .tokens ? Double(tokens) : 1
            // A bucket holds one second of quota, and at least one full batch, so any legal call can pass.
            var bucket =
                state.buckets[project]
                ?? TokenBucket(rate: settings.perSecond, capacity: max(settings.perSecond, cost), at: time)
            bucket.capacity = max(bucket.capacity, cost)
            let wait = bucket.take(cost, at: time)
            state.buckets[project] = bucket
            return wait
        }
    }

    /// Draws the fault for one FCM call, if any.
    public func drawFault() -> Fault? {
        state.withLock { state in
            let f = state.faults
            guard f.http429 + f.http500 + f.http503 + f.dropConnection > 0 else { return nil }
            let x = Double.random(in: 0..<1, using: &state.random)
            var edge = f.dropConnection
            if x < edge { return .drop }
            edge += f.http429
            if x < edge { return .status(429) }
            edge += f.http500
            if x < edge { return .status(500) }
            edge += f.http503
            if x < edge { return .status(503) }
            return nil
        }
    }

    /// Whether one token of a topic call fails with INTERNAL.
    public func drawTokenFault() -> Bool {
        state.withLock { state in
            guard state.faults.tokenInternal > 0 else { return false }
            return Double.random(in: 0..<1, using: &state.random) < state.faults.tokenInternal
        }
    }

    /// The delay added to every FCM call (`latency_ms` of the faults).
    public var latency: Duration { .milliseconds(state.withLock { $0.faults.latencyMs }) }

    /// Where the emulator listens, for the `token_uri` of the key files it writes.
    public var baseURL: String {
        get { state.withLock { $0.baseURL } }
        set { state.withLock { $0.baseURL = newValue } }
    }

    /// Back to defaults: no faults, the documented rate limit, IID on everywhere.
    public func reset() {
        state.withLock { state in
            let baseURL = state.baseURL
            state = State()
            state.baseURL = baseURL
        }
    }
}
