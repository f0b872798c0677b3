import Foundation
import TidemarkCore

/// FCM's topic and device-group semantics, in process: the embedded backend, and the core of the emulator.
///
/// Holds app instances (registration tokens), their topic subscriptions and device groups, and
/// answers as FCM does: per-token results for batches, the 2000-topic cap, 20-member groups that
/// vanish when emptied, several valid keys per group. Every change is written through to the
/// optional store before the call returns.
public actor FCMEngine {
    /// Which FCM the engine plays: its limits, and whether any token counts as registered.
    public struct Configuration: Sendable {
        /// Treat any well-formed token as a registered app instance of the calling project on first use.
        /// The embedded backend sets it, since there are no real devices to register themselves.
        public var autoRegister: Bool
        /// The most topics an instance may be in (2000).
        public var maxTopicsPerToken: Int
        /// The most members a device group may have (20).
        public var maxGroupMembers: Int
        /// The most tokens in one batch call (1000).
        public var maxBatchTokens: Int
        /// Added to every subscription-changing call, to rehearse slow networks and interrupted applies.
        public var latency: Duration

        /// FCM's limits, auto-registering tokens.
        public init(
            autoRegister: Bool = true, maxTopicsPerToken: Int = FCMLimits.maxTopicsPerToken,
            maxGroupMembers: Int = FCMLimits.maxGroupMembers, maxBatchTokens: Int = FCMLimits.maxBatchTokens,
            latency: Duration = .zero
        ) {
            self.autoRegister = autoRegister
            self.maxTopicsPerToken = maxTopicsPerToken
            self.maxGroupMembers = maxGroupMembers
            self.maxBatchTokens = maxBatchTokens
            self.latency = latency
        }
    }

    /// An app instance, as FCM knows it.
    public struct Registration: Sendable, Equatable {
        /// The project it is registered to.
        public var project: String
        /// "ANDROID", "IOS" or "WEB".
        public var platform: String
        /// The app's id (package name or bundle id).
        public var app: String
        /// When it was registered.
        public var registeredAt: Date
        /// Topic → when the subscription was made.
        public var topics: [String: Date]
        /// The app was uninstalled (or its token rotated): FCM answers NOT_FOUND for it.
        public var unregistered: Bool
    }

    struct Group: Sendable {
        var members: [String]
        var keys: [String]
    }

    /// The limits and behaviour it was made with.
    public let configuration: Configuration
    let store: (any EngineStore)?
    let timing: Timing
    private var registrations: [String: Registration]
    var groups: [GroupID: Group]
    var groupByKey: [String: GroupID]
    /// One-shot per-token errors, for fault tests: the next call touching the token fails with it.
    private var injectedErrors: [String: TokenError] = [:]
    var keyCounter: UInt64 = 0
    /// Starts as `configuration.autoRegister`; the emulator's admin API can switch it.
    public private(set) var autoRegister: Bool

    struct GroupID: Hashable, Sendable {
        var project: String
        var name: String
    }

    /// An engine with `configuration`, loading its world from `store` when given.
    public init(
        configuration: Configuration = Configuration(), store: (any EngineStore)? = nil,
        timing: Timing = .live
    ) throws {
        self.configuration = configuration
        self.store = store
        self.timing = timing
        autoRegister = configuration.autoRegister
        let snapshot = try store?.load() ?? EngineSnapshot()
        registrations = snapshot.registrations
        groups = [:]
        groupByKey = [:]
        for group in snapshot.groups {
            let id = GroupID(project: group.project, name: group.name)
            groups[id] = Group(members: group.members, keys: group.keys)
            for key in group.keys { groupByKey[key] = id }
        }
    }

    // MARK: - App instances

    /// Registers an app instance (what a device does when the app starts).
    public func register(
        token: String, project: String, platform: String = "ANDROID", app: String = "com.example.app"
    )
        throws
    {
        guard FCMLimits.tokenProblem(token) == nil else { throw EngineError(.invalidArgument, "malformed token") }
        let registration = Registration(
            project: project, platform: platform, app: app, registeredAt: timing.wallClock(),
            topics: registrations[token]?.topics ?? [:], unregistered: false)
        registrations[token] = registration
        try store?.persist([.registration(token, registration)])
    }

    /// Marks an app instance as gone (the app was uninstalled): later calls for it get NOT_FOUND.
    public func unregister(token: String) throws {
        var registration =
            registrations[token]
            ?? Registration(
                project: "", platform: "ANDROID", app: "",
                registeredAt: timing.wallClock(), topics: [:], unregistered: true)
        registration.unregistered = true
        registration.topics = [:]
        registrations[token] = registration
        try store?.persist([.registration(token, registration), .clearTopics(token)])
    }

    /// An app instance to register in bulk.
    public struct Instance: Sendable {
        /// Its registration token.
        public var token: String
        /// "ANDROID", "IOS" or "WEB".
        public var platform: String
        /// The app's id.
        public var app: String

        /// An Android instance of `com.example.app` by default.
        public init(token: String, platform: String = "ANDROID", app: String = "com.example.app") {
            self.token = token
            self.platform = platform
            self.app = app
        }
    }

    /// Registers many app instances in one write; a token already registered keeps its topics.
    /// Throws before changing anything when a token is malformed.
    public func register(_ instances: [Instance], project: String) throws {
        for instance in instances where FCMLimits.tokenProblem(instance.token) != nil {
            throw EngineError(.invalidArgument, "malformed token '\(instance.token.prefix(40))'")
        }
        let at = timing.wallClock()
        var changes: [EngineChange] = []
        changes.reserveCapacity(instances.count)
        for instance in instances {
            let previous = registrations[instance.token]
            let keepTopics = previous.map { !$0.unregistered && $0.project == project } ?? false
            let registration = Registration(
                project: project, platform: instance.platform, app: instance.app,
                registeredAt: at, topics: keepTopics ? previous!.topics : [:], unregistered: false)
            registrations[instance.token] = registration
            changes.append(.registration(instance.token, registration))
            if previous != nil && !keepTopics { changes.append(.clearTopics(instance.token)) }
        }
        try store?.persist(changes)
    }

    /// Switches whether unknown well-formed tokens count as registered.
    public func setAutoRegister(_ on: Bool) { autoRegister = on }

    /// What the engine knows of `token`, live or unregistered.
    public func registration(_ token: String) -> Registration? { registrations[token] }

    /// The live registrations of a project, by token.
    public func registrations(project: String) -> [(token: String, registration: Registration)] {
        registrations.filter { $0.value.project == project && !$0.value.unregistered }
            .map { ($0.key, $0.value) }.sorted { $0.token < $1.token }
    }

    /// The live app instances of `project` that `condition` selects, sorted.
    public func recipients(project: String, condition: FCMCondition) -> [String] {
        registrations.compactMap { token, registration in
            guard registration.project == project, !registration.unregistered,
                condition.matches({ registration.topics[$0] != nil })
            else { return nil }
            return token
        }.sorted()
    }

    /// Forgets everything: app instances, subscriptions, groups.
    public func reset() throws {
        registrations.removeAll()
        groups.removeAll()
        groupByKey.removeAll()
        injectedErrors.removeAll()
        try store?.reset()
    }

    /// The next call that touches `token` answers `error` for it, once.
    public func injectError(_ error: TokenError, forToken token: String) {
        injectedErrors[token] = error
    }

    /// The registration of `token`, creating it when auto-registration applies.
    func liveRegistration(
        _ token: String, project: String, create: Bool, changes: inout [EngineChange]
    )
        -> Result<Registration, TokenError>
    {
        if FCMLimits.tokenProblem(token) != nil { return .failure(.invalidArgument) }
        if let existing = registrations[token] {
            if existing.unregistered { return .failure(.notFound) }
            if existing.project != project { return .failure(.invalidArgument) }
            return .success(existing)
        }
        guard autoRegister else { return .failure(.notFound) }
        let registration = Registration(
            project: project, platform: "ANDROID", app: "com.example.app",
            registeredAt: timing.wallClock(), topics: [:], unregistered: false)
        if create {
            registrations[token] = registration
            changes.append(.registration(token, registration))
        }
        return .success(registration)
    }

    /// Why `token` is not a live registration of `project`, or nil. Returns no copy of the
    /// registration, so callers can mutate `registrations[token]` in place without copying its topics.
    private func liveError(_ token: String, project: String, create: Bool, changes: inout [EngineChange]) -> TokenError?
    {
        if case .failure(let error) = liveRegistration(token, project: project, create: create, changes: &changes) {
            return error
        }
        return nil
    }

    // MARK: - Topics

    /// IID `batchAdd`: per-token results in order.
    public func batchAdd(project: String, topic: String, tokens: [String]) throws -> [TokenOutcome] {
        try checkBatch(topic: topic, tokens: tokens)
        var changes: [EngineChange] = []
        let at = timing.wallClock()
        let outcomes = tokens.map { token -> TokenOutcome in
            if let injected = injectedErrors.removeValue(forKey: token) { return .failed(injected) }
            if let error = liveError(token, project: project, create: true, changes: &changes) { return .failed(error) }
            if registrations[token]?.topics[topic] != nil { return .ok }
            if (registrations[token]?.topics.count ?? 0) >= configuration.maxTopicsPerToken {
                return .failed(.tooManyTopics)
            }
            registrations[token]?.topics[topic] = at
            changes.append(.subscribe(token, topic, at))
            return .ok
        }
        try store?.persist(changes)
        return outcomes
    }

    /// IID `batchRemove`: per-token results in order; removing a missing subscription succeeds.
    public func batchRemove(project: String, topic: String, tokens: [String]) throws -> [TokenOutcome] {
        try checkBatch(topic: topic, tokens: tokens)
        var changes: [EngineChange] = []
        let outcomes = tokens.map { token -> TokenOutcome in
            if let injected = injectedErrors.removeValue(forKey: token) { return .failed(injected) }
            if let error = liveError(token, project: project, create: false, changes: &changes) {
                return .failed(error)
            }
            if registrations[token]?.topics.removeValue(forKey: topic) != nil {
                changes.append(.unsubscribe(token, topic))
            }
            return .ok
        }
        try store?.persist(changes)
        return outcomes
    }

    private func checkBatch(topic: String, tokens: [String]) throws {
        guard FCMLimits.topicNameProblem(topic) == nil else { throw EngineError(.invalidTopicName, topic) }
        guard !tokens.isEmpty else { throw EngineError(.missingTokens) }
        guard tokens.count <= configuration.maxBatchTokens else {
            throw EngineError(
                .tooManyTokens, "\(tokens.count) tokens; at most \(configuration.maxBatchTokens) per call")
        }
    }

    /// v1 create: one subscription; ALREADY_EXISTS when present.
    public func createSubscription(project: String, registration token: String, topic: String) throws -> Date {
        guard FCMLimits.topicNameProblem(topic) == nil else {
            throw EngineError(.invalidArgument, "invalid topic name")
        }
        if let registration = registrations[token], !registration.unregistered, registration.project == project,
            registration.topics[topic] != nil
        {
            throw EngineError(.alreadyExists, "topic subscription already exists")
        }
        let outcome = try batchAdd(project: project, topic: topic, tokens: [token])[0]
        switch outcome {
        case .ok: return registrations[token]?.topics[topic] ?? timing.wallClock()
        case .failed(let error): throw EngineError(EngineError.Code(rawValue: error.code.rawValue) ?? .internalError)
        }
    }

    /// v1 get: when the subscription was made; NOT_FOUND when the registration or the subscription is missing.
    public func subscription(project: String, registration token: String, topic: String) throws -> Date {
        var ignored: [EngineChange] = []
        switch liveRegistration(token, project: project, create: false, changes: &ignored) {
        case .failure(let error):
            throw EngineError(EngineError.Code(rawValue: error.code.rawValue) ?? .notFound, "registration")
        case .success(let registration):
            guard let since = registration.topics[topic] else {
                throw EngineError(.notFound, "topic subscription not found")
            }
            return since
        }
    }

    /// v1 delete: with `allowMissing`, a missing subscription succeeds; without, NOT_FOUND.
    public func deleteSubscription(
        project: String, registration token: String, topic: String, allowMissing: Bool
    ) throws {
        var changes: [EngineChange] = []
        if let injected = injectedErrors.removeValue(forKey: token) {
            throw EngineError(EngineError.Code(rawValue: injected.code.rawValue) ?? .internalError)
        }
        if let error = liveError(token, project: project, create: false, changes: &changes) {
            throw EngineError(EngineError.Code(rawValue: error.code.rawValue) ?? .notFound, "registration not found")
        }
        guard registrations[token]?.topics.removeValue(forKey: topic) != nil else {
            if allowMissing { return }
            throw EngineError(.notFound, "topic subscription not found")
        }
        try store?.persist([.unsubscribe(token, topic)])
    }

    /// The topics of a live registration, sorted; nil when FCM would answer NOT_FOUND.
    public func topics(of token: String, project: String) -> [(topic: String, since: Date)]? {
        var ignored: [EngineChange] = []
        guard
            case .success(let registration) = liveRegistration(
                token, project: project, create: false, changes: &ignored)
        else { return nil }
        return registration.topics.sorted { $0.key < $1.key }.map { ($0.key, $0.value) }
    }

    /// What the admin API shows and real FCM cannot: the tokens subscribed to a topic.
    public func subscribers(of topic: String, project: String) -> [String] {
        registrations.filter { $0.value.project == project && !$0.value.unregistered && $0.value.topics[topic] != nil }
            .map(\.key).sorted()
    }

    /// Every live subscription of a project, for tests and the admin API.
    public func allSubscriptions(project: String) -> [String: Set<String>] {
        var result: [String: Set<String>] = [:]
        for (token, registration) in registrations where registration.project == project && !registration.unregistered {
            for topic in registration.topics.keys { result[topic, default: []].insert(token) }
        }
        return result
    }
}
