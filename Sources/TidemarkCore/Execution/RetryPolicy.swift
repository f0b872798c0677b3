import Foundation

/// When to try an FCM call again, and how long to wait: one policy for every call, HTTP requests
/// and per-token retries alike.
///
/// 429 and 503 (and 500, 502, 504, 408, and network errors) are retried with exponential backoff
/// and full jitter, never sooner than a `Retry-After` the server sent; so are tokens that came back
/// `RESOURCE_EXHAUSTED`, `INTERNAL` or `UNAVAILABLE`. Everything stops once the retry budget (wall
/// time spent on one call or operation) would be exceeded. Pure: the caller passes the attempt
/// number, the time already spent and the random source, so tests are deterministic.
public struct RetryPolicy: Sendable, Equatable {
    /// The first backoff; each retry doubles it, up to `maxDelay`.
    public var baseDelay: Duration
    /// The longest single wait.
    public var maxDelay: Duration
    /// Total time one call may spend waiting to retry.
    public var budget: Duration

    /// A policy with these delays and budget (500 ms, 60 s and 300 s by default).
    public init(
        baseDelay: Duration = .milliseconds(500), maxDelay: Duration = .seconds(60),
        budget: Duration = .seconds(300)
    ) {
        self.baseDelay = baseDelay
        self.maxDelay = maxDelay
        self.budget = budget
    }

    /// What went wrong with one attempt.
    public enum Failure: Sendable, Equatable {
        /// An HTTP status, with the parsed `Retry-After` if there was one.
        case status(Int, retryAfter: Duration?)
        /// The connection failed or was dropped before an answer.
        case network
        /// Some tokens of a call came back with a retryable per-token error.
        case tokens
    }

    /// What to do after a failure.
    public enum Decision: Sendable, Equatable {
        /// Try again after the wait.
        case retry(after: Duration)
        /// Stop, saying why (the budget is spent, or the failure is final).
        case giveUp(reason: String)
    }

    /// Whether an HTTP status is worth trying again: 408, 429, 500, 502, 503, 504.
    package static func isRetryable(status: Int) -> Bool { [408, 429, 500, 502, 503, 504].contains(status) }

    /// The decision after the `attempt`-th failure (1-based), with `elapsed` already spent on this call.
    public func decide(
        _ failure: Failure, attempt: Int, elapsed: Duration,
        using random: inout some RandomNumberGenerator
    ) -> Decision {
        var floor = Duration.zero
        switch failure {
        case .status(let status, let retryAfter):
            guard Self.isRetryable(status: status) else { return .giveUp(reason: "HTTP \(status) is not retryable") }
            floor = retryAfter ?? .zero
        case .network, .tokens: break
        }
        let ceiling = min(maxDelay, baseDelay * (1 << min(attempt - 1, 30)))
        let jitter = Duration.nanoseconds(Int64.random(in: 0...max(0, ceiling.nanoseconds), using: &random))
        let delay = max(floor, jitter)
        guard elapsed + delay <= budget else {
            return .giveUp(reason: "the retry budget of \(budget.seconds) s is spent")
        }
        return .retry(after: delay)
    }

    /// The same decision, drawing jitter from `timing`.
    public func decide(_ failure: Failure, attempt: Int, elapsed: Duration, timing: Timing) -> Decision {
        var random = timing.generator
        return decide(failure, attempt: attempt, elapsed: elapsed, using: &random)
    }

    /// Parses a `Retry-After` value: delay-seconds or an HTTP date (RFC 9110 §10.2.3).
    public static func parseRetryAfter(_ value: String, now: Date) -> Duration? {
        let trimmed = value.trimmingCharacters(in: .whitespaces)
        if let seconds = Int(trimmed), seconds >= 0 { return .seconds(seconds) }
        for format in ["EEE, dd MMM yyyy HH:mm:ss zzz", "EEEE, dd-MMM-yy HH:mm:ss zzz", "EEE MMM d HH:mm:ss yyyy"] {
            let formatter = DateFormatter()
            formatter.locale = Locale(identifier: "en_US_POSIX")
            formatter.timeZone = TimeZone(identifier: "GMT")
            formatter.dateFormat = format
            if let date = formatter.date(from: trimmed) {
                return .milliseconds(max(0, Int64((date.timeIntervalSince(now) * 1000).rounded(.up))))
            }
        }
        return nil
    }
}

extension Duration {
    /// The duration in whole nanoseconds.
    public var nanoseconds: Int64 {
        components.seconds * 1_000_000_000 + components.attoseconds / 1_000_000_000
    }

    /// The whole seconds of the duration.
    public var seconds: Int64 { components.seconds }
}
