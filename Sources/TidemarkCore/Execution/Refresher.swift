/// Reads the backend's view of every known token and group, in batches and in parallel.
public struct Refresher: Sendable {
    /// Where registrations and groups are read from.
    public var backend: any Backend
    /// How many reads are in flight at once.
    public var parallelism: Int
    /// How many registrations one read asks for (1000 on the IID batch API).
    public var chunkSize: Int

    /// A refresher of `backend`, `parallelism` reads at a time.
    public init(backend: any Backend, parallelism: Int = 8, chunkSize: Int = 1000) {
        self.backend = backend
        self.parallelism = max(1, parallelism)
        self.chunkSize = chunkSize
    }

    /// Refreshes `ids` (token ids of `table`) and looks up the keys of `groups`.
    public func refresh(
        _ ids: TokenSet, table: TokenTable, groups: [String], at: Int64,
        progress: (@Sendable (Int, Int) -> Void)? = nil
    ) async throws -> RefreshResult {
        let statuses = try await read(ids.ids.map { table[$0] }, progress: progress)
        return try await result(ids.ids, statuses, groups: groups, at: at)
    }

    /// Reads the registrations of `tokens`: their statuses, in order. Needs no state, so a saved plan's
    /// registrations can be read while state and the inventory load.
    public func read(
        _ tokens: [String], progress: (@Sendable (Int, Int) -> Void)? = nil
    ) async throws
        -> [RegistrationStatus]
    {
        let chunks = stride(from: 0, to: tokens.count, by: chunkSize).map {
            tokens[$0..<min($0 + chunkSize, tokens.count)]
        }
        var statuses = [RegistrationStatus](repeating: .notFound, count: tokens.count)
        var done = 0
        try await BoundedConcurrency.forEach(chunks.count, width: parallelism) { [backend] i in
            try await backend.refresh(Array(chunks[i]))
        } each: { i, answered in
            let chunk = chunks[i]
            guard answered.count == chunk.count else {
                throw RefreshError(
                    message:
                        "the backend answered \(answered.count) statuses for \(chunk.count) tokens; refusing to plan on a partial read."
                )
            }
            statuses.replaceSubrange(chunk.indices, with: answered)
            done += chunk.count
            progress?(done, tokens.count)
        }
        return statuses
    }

    /// What `read` found for the tokens of `ids` (in the same order), with the keys of `groups` looked up.
    public func result(
        _ ids: [UInt32], _ statuses: [RegistrationStatus], groups: [String], at: Int64
    )
        async throws -> RefreshResult
    {
        var subscribed: [String: [UInt32]] = [:]
        var dead: [UInt32] = []
        for (id, status) in zip(ids, statuses) {
            switch status {
            case .notFound: dead.append(id)
            case .active(let topics):
                for topic in topics { subscribed[topic, default: []].append(id) }
            }
        }
        var keys: [String: String?] = [:]
        for name in groups {
            keys[name] = .some(try await backend.groupKey(name: name))
        }
        return RefreshResult(
            at: at, refreshed: TokenSet(ids), subscribed: subscribed.mapValues { TokenSet($0) },
            dead: TokenSet(dead), groupKeys: keys)
    }
}

/// A refresh that could not read everything; a plan is never built on it.
public struct RefreshError: TidemarkError {
    /// `refresh_failed`.
    public var reason: FailureReason { "refresh_failed" }

    /// What could not be read, and what to check.
    public var message: String
    /// The message.
    public var description: String { message }
}
