import TidemarkCore

/// The `embedded` backend: the engine in process, speaking the `Backend` protocol for one project.
public struct EmbeddedBackend: Backend {
    /// The engine the calls go to.
    public let engine: FCMEngine
    /// The FCM project the calls are made as.
    public let project: String

    /// The backend of `project` on `engine`.
    public init(engine: FCMEngine, project: String) {
        self.engine = engine
        self.project = project
    }

    /// `embedded`, and the project.
    public var identity: BackendIdentity { BackendIdentity(kind: .embedded, project: project) }

    /// Each token's topics, as the engine holds them (`notFound` for one it does not know).
    public func refresh(_ tokens: [String]) async throws -> [RegistrationStatus] {
        try await delay()
        var statuses: [RegistrationStatus] = []
        statuses.reserveCapacity(tokens.count)
        for token in tokens {
            if let topics = await engine.topics(of: token, project: project) {
                statuses.append(.active(topics: topics.map(\.topic)))
            } else {
                statuses.append(.notFound)
            }
        }
        return statuses
    }

    /// Subscribes `tokens` to `topic`; one outcome per token, as FCM answers a batch.
    public func subscribe(topic: String, tokens: [String]) async throws -> [TokenOutcome] {
        try await delay()
        return try await engine.batchAdd(project: project, topic: topic, tokens: tokens)
    }

    /// Unsubscribes `tokens` from `topic`; one outcome per token.
    public func unsubscribe(topic: String, tokens: [String]) async throws -> [TokenOutcome] {
        try await delay()
        return try await engine.batchRemove(project: project, topic: topic, tokens: tokens)
    }

    /// Waits outside the engine's actor, so concurrent calls overlap as they would over a network.
    private func delay() async throws {
        if engine.configuration.latency > .zero { try await Task.sleep(for: engine.configuration.latency) }
    }

    /// The key of group `name`, or nil when there is no such group.
    public func groupKey(name: String) async throws -> String? {
        do {
            return try await engine.groupKey(project: project, name: name)
        } catch let error as GroupError where error.kind == .notFound {
            return nil
        }
    }

    /// Every member of the group with `key`, or nil when there is none.
    public func exportGroup(name: String, key: String) async throws -> [String]? {
        await engine.groupMembers(project: project, key: key)
    }

    /// Creates group `name` with `tokens`; returns its key.
    public func createGroup(name: String, tokens: [String]) async throws -> String {
        try await engine.createGroup(project: project, name: name, tokens: tokens)
    }

    /// Adds `tokens` to the group; returns its key.
    public func addToGroup(name: String, key: String, tokens: [String]) async throws -> String {
        try await engine.addToGroup(project: project, name: name, key: key, tokens: tokens)
    }

    /// Removes `tokens` from the group (an emptied group is deleted, as FCM does).
    public func removeFromGroup(name: String, key: String, tokens: [String]) async throws {
        _ = try await engine.removeFromGroup(project: project, name: name, key: key, tokens: tokens)
    }
}
