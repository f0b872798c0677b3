import Synchronization
import TidemarkCore

/// What a reconcile in flight has done so far and how FCM answers it, for the workspace's machine
/// (the `degraded` phase, the progress line every 30 s) and the metrics.
///
/// Fed by the reconcile's workflows (their progress events) and by every attempt of every request
/// to FCM (`FCMAttempt`); read by the runner every few seconds while the reconcile runs. FCM is
/// "retrying" from the first attempt that failed and was retried after the last answer FCM gave (a
/// success, or an answer it does not retry, such as an unregistered token's 404) until the next one:
/// with a hundred requests in flight, one answer means FCM answers.
public final class ReconcileWatch: Sendable {
    /// The watch read at one moment.
    public struct Snapshot: Sendable, Equatable {
        /// When the reconcile started, on the runner's monotonic clock (which reconcile this is).
        public var started: Duration
        /// What it does now: `reading FCM` (a refresh or drift check), `applying`; nil before either.
        public var step: String?
        /// Registrations read or token changes sent so far, of `total`, in the current step.
        public var done = 0
        /// Registrations to read or token changes to send in the current step.
        public var total = 0
        /// Seconds until the current step is done, at the rate so far (nil: too early to tell).
        public var etaSeconds: Double?
        /// Since when every request to FCM has failed and been retried (nil: FCM answers).
        public var retryingSince: Duration?
        /// What the last of those failures was (`HTTP 503 (UNAVAILABLE)`).
        public var answer: String?

        /// A snapshot of the reconcile started at `started`.
        public init(started: Duration) { self.started = started }
    }

    private struct State {
        var snapshot: Snapshot
        /// When the current step's first progress came, and how much was done then (the rate's origin).
        var origin: (at: Duration, done: Int)?
    }

    private let state = Mutex(State(snapshot: Snapshot(started: .zero)))
    private let timing: Timing

    /// A watch on `timing`'s clock.
    public init(timing: Timing) { self.timing = timing }

    /// A reconcile starts at `started`: what the last one left is forgotten.
    public func begin(at started: Duration) {
        state.withLock { $0 = State(snapshot: Snapshot(started: started)) }
    }

    /// The watch now, with the current step's ETA.
    public func snapshot() -> Snapshot {
        let now = timing.now()
        return state.withLock { state in
            var snapshot = state.snapshot
            if let origin = state.origin, snapshot.done > origin.done, snapshot.total > snapshot.done {
                let seconds = Timing.seconds(now - origin.at)
                if seconds >= 1 {
                    let rate = Double(snapshot.done - origin.done) / seconds
                    snapshot.etaSeconds = Double(snapshot.total - snapshot.done) / rate
                }
            }
            return snapshot
        }
    }

    /// An attempt of a request to FCM ended.
    public func observe(_ attempt: FCMAttempt) {
        let now = timing.now()
        state.withLock { state in
            switch attempt.outcome {
            case .retried:
                if state.snapshot.retryingSince == nil {
                    state.snapshot.retryingSince = now - .milliseconds(Int64(attempt.elapsed * 1000))
                }
                state.snapshot.answer = attempt.cause
            case .success:
                state.snapshot.retryingSince = nil
                state.snapshot.answer = nil
            case .failed:
                // An answer FCM does not retry is an answer; a failure the retries gave up on is not.
                guard attempt.code == "4xx" else { return }
                state.snapshot.retryingSince = nil
                state.snapshot.answer = nil
            }
        }
    }

    /// A workflow of the reconcile reported progress.
    func progressed(_ event: WorkflowEvent) {
        let now = timing.now()
        let step: String
        let done: Int
        let total: Int
        switch event {
        case .refreshProgress(let read, let of):
            (step, done, total) = ("reading FCM", read, of)
        case .applyProgress(let progress):
            (step, done, total) = ("applying", progress.tokensDone, progress.tokensTotal)
        default:
            return
        }
        state.withLock { state in
            if state.snapshot.step != step || state.origin == nil || done < state.snapshot.done {
                state.origin = (now, done)
            }
            state.snapshot.step = step
            state.snapshot.done = done
            state.snapshot.total = total
        }
    }
}
