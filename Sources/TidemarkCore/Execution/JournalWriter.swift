import Synchronization

/// Where an apply's journal is written: work handed to it runs one item at a time, in order, in a
/// child task of the task group `run(_:)` opens around the apply.
///
/// The apply runs inside that group and stops at a graceful shutdown (SIGTERM, a replica told to
/// stop); the writer does not: it is not cancelled with the apply, so every step that finished is
/// saved before the run ends. It stops once the apply has ended and its queue is empty. It waits for
/// work without heeding cancellation, so a waiter of a queued save is never left hanging: cancelled,
/// the saves still run (and fail if the store heeds cancellation).
public final class JournalWriter: Sendable {
    private struct Queue: Sendable {
        var items: [@Sendable () async -> Void] = []
        var idle: CheckedContinuation<Void, Never>?
        /// `run`'s body ended: stop once the queue is empty.
        var closing = false
        /// Stopped: nothing more is taken.
        var stopped = false
    }

    private let queue = Mutex(Queue())

    /// A writer that runs nothing until `run(_:)` starts it.
    public init() {}

    /// Queues `item` behind what is queued; false when the writer has stopped (the caller does the work
    /// itself).
    func schedule(_ item: @escaping @Sendable () async -> Void) -> Bool {
        let (taken, wake) = queue.withLock { queue -> (Bool, CheckedContinuation<Void, Never>?) in
            guard !queue.stopped else { return (false, nil) }
            queue.items.append(item)
            defer { queue.idle = nil }
            return (true, queue.idle)
        }
        wake?.resume()
        return taken
    }

    /// Runs `body` with the writer beside it, and returns once both have ended: the writer drains what
    /// `body` queued before it stops. Call it once.
    public func run<T: Sendable>(_ body: () async throws -> T) async throws -> T {
        let outcome = await withTaskGroup(of: Void.self) { group -> Result<T, any Error> in
            group.addTask { [self] in
                while let item = await next() { await item() }
            }
            defer { close() }
            do {
                return .success(try await body())
            } catch {
                return .failure(error)
            }
        }
        return try outcome.get()
    }

    /// The next item, waiting for one; nil once `body` ended and nothing is queued.
    private func next() async -> (@Sendable () async -> Void)? {
        while true {
            enum Step {
                case run(@Sendable () async -> Void)
                case stop
                case wait
            }
            let step = queue.withLock { queue -> Step in
                if !queue.items.isEmpty { return .run(queue.items.removeFirst()) }
                if queue.closing {
                    queue.stopped = true
                    return .stop
                }
                return .wait
            }
            switch step {
            case .run(let item): return item
            case .stop: return nil
            case .wait:
                await withCheckedContinuation { (idle: CheckedContinuation<Void, Never>) in
                    let now = queue.withLock { queue -> Bool in
                        guard queue.items.isEmpty, !queue.closing else { return true }
                        queue.idle = idle
                        return false
                    }
                    if now { idle.resume() }
                }
            }
        }
    }

    private func close() {
        let wake = queue.withLock { queue -> CheckedContinuation<Void, Never>? in
            queue.closing = true
            defer { queue.idle = nil }
            return queue.idle
        }
        wake?.resume()
    }
}
