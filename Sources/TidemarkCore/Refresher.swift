/// Reads the backend's view of every known token and group, in batches and in parallel.
public struct Refresher: Sendable {
    public var backend: any Backend
    public var parallelism: Int
    public var chunkSize: Int

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
        let all = ids.ids
        var subscribed: [String: [UInt32]] = [:]
        var dead: [UInt32] = []
        let chunks = stride(from: 0, to: all.count, by: chunkSize).map { all[$0..<min($0 + chunkSize, all.count)] }
        var done = 0
        try await BoundedConcurrency.forEach(chunks.count, width: parallelism) { [backend] i in
            try await backend.refresh(chunks[i].map { table[$0] })
        } each: { i, statuses in
            let chunk = chunks[i]
            guard statuses.count == chunk.count else {
                throw RefreshError(
                    message:
                        "the backend answered \(statuses.count) statuses for \(chunk.count) tokens; refusing to plan on a partial read."
                )
            }
            for (id, status) in zip(chunk, statuses) {
                switch status {
                case .notFound: dead.append(id)
                case .active(let topics):
                    for topic in topics { subscribed[topic, default: []].append(id) }
                }
            }
            done += chunk.count
            progress?(done, all.count)
        }
        var keys: [String: String?] = [:]
        for name in groups {
            keys[name] = .some(try await backend.groupKey(name: name))
        }
        return RefreshResult(
            at: at, refreshed: ids, subscribed: subscribed.mapValues { TokenSet($0) },
            dead: TokenSet(dead), groupKeys: keys)
    }
}

/// A refresh that could not read everything; a plan is never built on it.
public struct RefreshError: Error, CustomStringConvertible {
    public var message: String
    public var description: String { message }
}
