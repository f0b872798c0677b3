import Synchronization

/// Bounds work in time even when the work does not heed cancellation (opening a connection, a query
/// on a connection lost in silence, a server that drips its answer).
///
/// A task group cannot do this: it waits for every child, so a child that ignores cancellation keeps
/// the group, and its caller, for as long as it runs. `race` returns as soon as the work ends or the
/// limit passes, whichever is first; what is given up on is cancelled and runs on detached, and if
/// it still produces a value, `late` disposes of it (closes the connection it opened).
package enum TimeLimit {
    /// The work's value, or nil once `limit` passes first. The caller's cancellation cancels the work
    /// and throws `CancellationError` at once.
    package static func race<T: Sendable>(
        _ limit: Duration, _ work: @Sendable @escaping () async throws -> T,
        late: @Sendable @escaping (T) async -> Void = { _ in }
    ) async throws -> T? {
        try await race(limit, movedBy: nil, work, late: late)
    }

    /// As `race(_:_:late:)`, but the limit counts from the work's last move when `progress` is given:
    /// work that keeps moving (a transaction whose statements each answer) runs as long as it moves,
    /// and nil comes once it has not moved for `limit`.
    package static func race<T: Sendable>(
        _ limit: Duration, movedBy progress: Progress?, _ work: @Sendable @escaping () async throws -> T,
        late: @Sendable @escaping (T) async -> Void = { _ in }
    ) async throws -> T? {
        let claim = Claim<T>()
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (done: CheckedContinuation<T?, any Error>) in
                let worker = Task {
                    do {
                        let value = try await work()
                        if !claim.settle(.success(value)) { await late(value) }
                    } catch {
                        claim.settle(.failure(error))
                    }
                }
                let clock = Task {
                    guard let progress else {
                        try? await Task.sleep(for: limit)
                        if !Task.isCancelled { claim.settle(.success(nil)) }
                        return
                    }
                    while !Task.isCancelled {
                        let deadline = progress.last + limit
                        if deadline <= ContinuousClock.now {
                            claim.settle(.success(nil))
                            return
                        }
                        try? await Task.sleep(until: deadline, clock: .continuous)
                    }
                }
                claim.start(done, worker: worker, clock: clock)
            }
        } onCancel: {
            claim.settle(.failure(CancellationError()))
        }
    }

    /// When some work last moved (began, or got an answer), for `race(_:movedBy:_:late:)`.
    package final class Progress: Sendable {
        private let instant = Mutex(ContinuousClock.now)

        package init() {}

        /// The work moved now.
        package func moved() { instant.withLock { $0 = ContinuousClock.now } }

        /// When it last moved.
        package var last: ContinuousClock.Instant { instant.withLock { $0 } }
    }

    /// Who answers first: the work, the clock or the caller's cancellation. The first to settle
    /// resumes the caller and cancels the other two.
    final class Claim<T: Sendable>: Sendable {
        private struct Fields {
            var done: CheckedContinuation<T?, any Error>?
            var worker: Task<Void, Never>?
            var clock: Task<Void, Never>?
            /// Settled before the continuation was handed over (cancelled before it started).
            var early: Result<T?, any Error>?
            var settled = false
        }
        private let fields = Mutex(Fields())

        func start(_ done: CheckedContinuation<T?, any Error>, worker: Task<Void, Never>, clock: Task<Void, Never>) {
            let early = fields.withLock { fields -> Result<T?, any Error>? in
                fields.worker = worker
                fields.clock = clock
                if let early = fields.early { return early }
                fields.done = done
                return nil
            }
            if let early {
                worker.cancel()
                clock.cancel()
                done.resume(with: early)
            }
        }

        /// true when this outcome is the one the caller gets.
        @discardableResult
        func settle(_ outcome: Result<T?, any Error>) -> Bool {
            let won = fields.withLock { fields -> (CheckedContinuation<T?, any Error>?, [Task<Void, Never>])? in
                guard !fields.settled else { return nil }
                fields.settled = true
                guard let done = fields.done else {
                    fields.early = outcome
                    return (nil, [])
                }
                fields.done = nil
                return (done, [fields.worker, fields.clock].compactMap { $0 })
            }
            guard let (done, others) = won else { return false }
            for task in others { task.cancel() }
            done?.resume(with: outcome)
            return true
        }
    }
}
