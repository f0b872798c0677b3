import TidemarkCore

/// The `embedded` backend: the engine in process, speaking the `Backend` protocol for one project.
public struct EmbeddedBackend: Backend {
    public let engine: FCMEngine
    public let project: String

    public init(engine: FCMEngine, project: String) {
        self.engine = engine
        self.project = project
    }

    public var identity: BackendIdentity { BackendIdentity(kind: .embedded, project: project) }

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

    public func subscribe(topic: String, tokens: [String]) async throws -> [TokenOutcome] {
        try await delay()
        return try await engine.batchAdd(project: project, topic: topic, tokens: tokens)
    }

    public func unsubscribe(topic: String, tokens: [String]) async throws -> [TokenOutcome] {
        try await delay()
        return try await engine.batchRemove(project: project, topic: topic, tokens: tokens)
    }

    /// Waits outside the engine's actor, so concurrent calls overlap as they would over a network.
    private func delay() async throws {
        if engine.configuration.latency > .zero { try await Task.sleep(for: engine.configuration.latency) }
    }

    public func groupKey(name: String) async throws -> String? {
        do {
            return try await engine.groupKey(project: project, name: name)
        } catch let error as GroupError where error.kind == .notFound {
            return nil
        }
    }

    public func exportGroup(name: String, key: String) async throws -> [String]? {
        await engine.groupMembers(project: project, key: key)
    }

    public func createGroup(name: String, tokens: [String]) async throws -> String {
        try await engine.createGroup(project: project, name: name, tokens: tokens)
    }

    public func addToGroup(name: String, key: String, tokens: [String]) async throws -> String {
        try await engine.addToGroup(project: project, name: name, key: key, tokens: tokens)
    }

    public func removeFromGroup(name: String, key: String, tokens: [String]) async throws {
        _ = try await engine.removeFromGroup(project: project, name: name, key: key, tokens: tokens)
    }
}
