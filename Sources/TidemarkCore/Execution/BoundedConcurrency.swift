/// Runs work items with a bounded number in flight: the one loop behind refresh, apply and the HTTP
/// client's per-token calls.
public enum BoundedConcurrency {
    /// Runs `work` for items `0..<count`, at most `width` at once; `each` sees every result in
    /// completion order, on the caller's task, and may start no work of its own. The first error
    /// (from `work` or `each`) cancels the rest and is rethrown.
    public static func forEach<T: Sendable>(
        _ count: Int, width: Int, _ work: @escaping @Sendable (Int) async throws -> T,
        each: (Int, T) async throws -> Void
    ) async throws {
        guard count > 0 else { return }
        try await withThrowingTaskGroup(of: (Int, T).self) { group in
            var next = 0
            while next < min(max(1, width), count) {
                let i = next
                group.addTask { (i, try await work(i)) }
                next += 1
            }
            while let (i, value) = try await group.next() {
                try await each(i, value)
                if next < count {
                    let j = next
                    group.addTask { (j, try await work(j)) }
                    next += 1
                }
            }
        }
    }

    /// Runs `work` for items `0..<count`, at most `width` at once; the results in input order.
    public static func map<T: Sendable>(
        _ count: Int, width: Int, _ work: @escaping @Sendable (Int) async throws -> T
    )
        async throws -> [T]
    {
        var results = [T?](repeating: nil, count: count)
        try await forEach(count, width: width, work) { i, value in results[i] = value }
        return results.map { $0! }
    }
}
