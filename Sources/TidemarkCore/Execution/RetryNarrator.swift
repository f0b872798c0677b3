import Synchronization

/// One retry of a call that failed, as a person waiting on it should read it.
public struct RetryNotice: Sendable, Equatable {
    /// The call (`GET https://…/topicSubscriptions`, tokens redacted).
    public var call: String
    /// What went wrong with the last attempt, in words (`HTTP 503 (UNAVAILABLE)`, `the connection was
    /// refused …`).
    public var cause: String
    /// The attempt that failed (1-based).
    public var attempt: Int
    /// Seconds until the next attempt.
    public var nextIn: Double
    /// Seconds this call has spent so far.
    public var waited: Double
    /// Seconds the call may spend before it gives up (its retry budget).
    public var budget: Double
    /// The setting that decides where the call goes, with its value, for the person to check.
    public var setting: String
    /// Other retries (of any call) since the last notice, not said one by one.
    public var othersRetried = 0
    /// Whether the failure was FCM's own answer (an error in FCM's JSON): the address is right and
    /// FCM itself is failing or limiting, so `setting` is not the thing to check.
    public var answeredByFCM = false

    /// What to look at if the retries do not mend: the setting that chose the address, or, when FCM
    /// itself answered, FCM's health (a 429: the project's quota).
    public var advice: String {
        guard answeredByFCM else { return "check \(setting)" }
        if cause.hasPrefix("HTTP 429") {
            return "FCM itself is limiting this project: lower 'qps' in tidemark.yaml or the other senders' rate"
        }
        return "FCM itself is failing (its own answer, so the address is right): see status.firebase.google.com"
    }

    /// A notice of the `attempt`-th failure of `call`.
    public init(
        call: String, cause: String, attempt: Int, nextIn: Double, waited: Double, budget: Double, setting: String
    ) {
        self.call = call
        self.cause = cause
        self.attempt = attempt
        self.nextIn = nextIn
        self.waited = waited
        self.budget = budget
        self.setting = setting
    }

    /// A notice of the `attempt`-th failure of `call`, `elapsed` into it, as `policy` decided to try
    /// again after `delay`.
    public init(
        call: String, cause: String, attempt: Int, retryingAfter delay: Duration, elapsed: Duration,
        policy: RetryPolicy, setting: String
    ) {
        self.init(
            call: call, cause: cause, attempt: attempt, nextIn: Timing.seconds(delay), waited: Timing.seconds(elapsed),
            budget: Timing.seconds(policy.budget), setting: setting)
    }
}

/// Says when calls are being retried for longer than a few seconds, so a wait is never silent: one
/// notice when a retry will have taken `quiet` seconds, then at most one every `every` seconds while
/// retries go on (however many calls retry at once), and one line when a call that was narrated
/// is answered again. Retries that end sooner say nothing.
public final class RetryNarrator: Sendable {
    private struct Episode {
        /// When the first retry not yet followed by an answer began.
        var started: Duration?
        /// Retries since the last notice.
        var retries = 0
        /// Whether a notice was said since retries began.
        var said = false
        /// When the last retry notice was said: never more often than `every`.
        var lastSaid: Duration?
        /// When the last "answers came back" was said: never more often than `every` either.
        var lastRecovered: Duration?
    }

    private let output: any WorkflowOutput
    private let timing: Timing
    private let quiet: Duration
    private let every: Duration
    private let episode = Mutex(Episode())

    /// A narrator that reports to `output`, on `timing`'s clock.
    public init(
        output: any WorkflowOutput, timing: Timing, quiet: Duration = .seconds(3), every: Duration = .seconds(10)
    ) {
        self.output = output
        self.timing = timing
        self.quiet = quiet
        self.every = every
    }

    /// A call failed and will be tried again after `notice.nextIn` seconds.
    public func retrying(_ notice: RetryNotice) {
        let now = timing.now()
        let say = episode.withLock { episode -> RetryNotice? in
            if episode.started == nil { episode.started = now - .seconds(notice.waited) }
            episode.retries += 1
            guard notice.waited + notice.nextIn >= Timing.seconds(quiet) else { return nil }
            if let last = episode.lastSaid, now - last < every { return nil }
            var said = notice
            said.othersRetried = episode.retries - 1
            episode.lastSaid = now
            episode.said = true
            episode.retries = 0
            return said
        }
        if let say { output.emit(.retrying(say)) }
    }

    /// A call was answered on its `attempt`-th try. After a notice of retries, says that answers came
    /// back (at most every `every` seconds: under steady faults, one retry notice and one of these).
    public func answered(attempt: Int) {
        guard attempt > 1 else { return }
        let now = timing.now()
        let recovered = episode.withLock { episode -> Double? in
            guard episode.said, let started = episode.started else { return nil }
            let quietSince = episode.lastRecovered.map { now - $0 >= every } ?? true
            episode = Episode(lastSaid: episode.lastSaid, lastRecovered: quietSince ? now : episode.lastRecovered)
            return quietSince ? Timing.seconds(now - started) : nil
        }
        if let recovered { output.emit(.answeringAgain(afterSeconds: recovered)) }
    }
}
