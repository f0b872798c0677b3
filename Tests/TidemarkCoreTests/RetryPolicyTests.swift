import Foundation
import Testing
import TidemarkCore
import TidemarkTesting

@Suite struct RetryPolicyTests {
    let policy = RetryPolicy(baseDelay: .milliseconds(500), maxDelay: .seconds(60), budget: .seconds(120))

    @Test func backoffIsExponentialWithFullJitterAndCapped() {
        var random = SeededGenerator(seed: 1)
        for attempt in 1...12 {
            let ceiling = min(Duration.seconds(60), .milliseconds(500) * (1 << (attempt - 1)))
            guard
                case .retry(let delay) = policy.decide(
                    .status(503, retryAfter: nil), attempt: attempt,
                    elapsed: .zero, using: &random)
            else {
                Issue.record("503 must be retried")
                return
            }
            #expect(delay >= .zero && delay <= ceiling, "attempt \(attempt): \(delay)")
        }
        // Same seed, same delays.
        var a = SeededGenerator(seed: 9)
        var b = SeededGenerator(seed: 9)
        #expect(
            policy.decide(.network, attempt: 3, elapsed: .zero, using: &a)
                == policy.decide(.network, attempt: 3, elapsed: .zero, using: &b))
    }

    @Test func retryAfterIsAFloorAndTheBudgetStopsRetries() {
        var random = SeededGenerator(seed: 2)
        #expect(
            policy.decide(.status(429, retryAfter: .seconds(30)), attempt: 1, elapsed: .zero, using: &random)
                == .retry(after: .seconds(30)))
        guard
            case .giveUp = policy.decide(
                .status(429, retryAfter: .seconds(30)), attempt: 1, elapsed: .seconds(100),
                using: &random)
        else {
            Issue.record("the budget must stop retries")
            return
        }
        for status in [400, 401, 403, 404, 409] {
            guard
                case .giveUp = policy.decide(
                    .status(status, retryAfter: nil), attempt: 1, elapsed: .zero, using: &random)
            else {
                Issue.record("\(status) must not be retried")
                continue
            }
        }
    }

    @Test func parsesRetryAfterInSecondsAndHTTPDates() {
        let now = Date(timeIntervalSince1970: 784_111_777)  // Sun, 06 Nov 1994 08:49:37 GMT
        #expect(RetryPolicy.parseRetryAfter("120", now: now) == .seconds(120))
        #expect(RetryPolicy.parseRetryAfter("Sun, 06 Nov 1994 08:50:07 GMT", now: now) == .seconds(30))
        #expect(RetryPolicy.parseRetryAfter("Sunday, 06-Nov-94 08:50:07 GMT", now: now) == .seconds(30))
        #expect(RetryPolicy.parseRetryAfter("Sun Nov  6 08:50:07 1994", now: now) == .seconds(30))
        #expect(RetryPolicy.parseRetryAfter("soon", now: now) == nil)
        #expect(RetryPolicy.parseRetryAfter("-5", now: now) == nil)
    }

    @Test func virtualWallClockMovesWithSleeps() {
        let clock = ManualClock(epoch: Date(timeIntervalSince1970: 1_000))
        clock.advance(.milliseconds(2_500))
        #expect(clock.timing.wallClock() == Date(timeIntervalSince1970: 1_002.5))
        // An HTTP-date Retry-After (whole seconds) is measured from the virtual now: 1,006 − 1,002.5.
        let later = Date(timeIntervalSince1970: 1_006)
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "GMT")
        formatter.dateFormat = "EEE, dd MMM yyyy HH:mm:ss zzz"
        #expect(
            RetryPolicy.parseRetryAfter(formatter.string(from: later), now: clock.timing.wallClock())
                == .milliseconds(3_500))
    }
}
