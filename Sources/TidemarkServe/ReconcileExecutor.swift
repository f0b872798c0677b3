import CShims
import Dispatch
import Foundation
import NIOCore
import Synchronization

/// The threads reconciles run on, apart from Swift's shared pool of cooperative threads.
///
/// A reconcile at a million memberships keeps its threads busy for seconds at a time (planning,
/// encoding the journal, reading state). On the shared pool, which has one thread per core, it would
/// leave `/livez` and `/readyz` waiting that long for a thread; on threads of its own, the kernel
/// shares the cores between them and the endpoints answer at once (`scripts/bench-serve.sh` shows it).
/// The threads run at a lower CPU priority (nice +5), so that on a busy machine a probe is served
/// before a reconcile's next slice. Every task a reconcile starts in a task group, or with
/// `async let`, runs here too.
final class ReconcileExecutor: TaskExecutor, Sendable {
    /// The one executor of the process: as many threads as cores.
    static let shared = ReconcileExecutor(threads: max(1, ProcessInfo.processInfo.activeProcessorCount))

    private let jobs = Mutex(CircularBuffer<UnownedJob>(initialCapacity: 64))
    private let ready = DispatchSemaphore(value: 0)

    private init(threads: Int) {
        for index in 0..<threads {
            let thread = Thread { [self] in work() }
            thread.name = "tidemark-reconcile-\(index)"
            thread.start()
        }
    }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        jobs.withLock { $0.append(job) }
        ready.signal()
    }

    private func work() {
        _ = tidemark_lower_thread_priority(5)
        while true {
            ready.wait()
            guard let job = jobs.withLock({ $0.popFirst() }) else { continue }
            job.runSynchronously(on: asUnownedTaskExecutor())
        }
    }
}
