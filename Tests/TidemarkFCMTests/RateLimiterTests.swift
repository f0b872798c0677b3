import Foundation
import Testing
import TidemarkCore
import TidemarkTesting

@testable import TidemarkFCM

@Suite struct RateLimiterTests {
    /// On a manual clock: a burst passes at once, then callers are held to the rate, to the millisecond.
    @Test func holdsCallersToTheRate() async throws {
        let clock = ManualClock()
        let limiter = RateLimiter(rate: 200, burst: 20, timing: clock.timing)
        for _ in 0..<20 { try await limiter.acquire() }
        #expect(clock.sleeps.isEmpty, "the burst needs no wait")
        for _ in 0..<100 { try await limiter.acquire() }
        let waited = Timing.seconds(clock.now)
        #expect(abs(waited - 0.5) < 0.001, "100 more at 200/s take half a second, not \(waited)")
        #expect(await limiter.charged == 120)
    }

    /// A cost above the burst (a 1000-token batch under a small quota) waits until the bucket filled to it.
    @Test func aBatchLargerThanTheBurstWaitsForItsShare() async throws {
        let clock = ManualClock()
        let limiter = RateLimiter(rate: 100, burst: 100, timing: clock.timing)
        try await limiter.acquire(1000)
        #expect(abs(Timing.seconds(clock.now) - 9) < 0.001)
    }

    @Test func bucketTakesOrSaysHowLongToWait() {
        var bucket = TokenBucket(rate: 10, capacity: 10, at: 0)
        #expect(bucket.take(10, at: 0) == nil)
        #expect(bucket.take(1, at: 0) == 0.1)
        #expect(bucket.take(1, at: 0.1) == nil)
        #expect(bucket.reserve(5, at: 0.1) == 0.5)
        #expect(bucket.level == -5)
    }

    /// A ledger shared by two limiters (two runners, one FCM project), on the same manual clock: together
    /// they stay within the project's rate, where each alone would take all of it.
    @Test func limitersSharingALedgerStayWithinTheRateTogether() async throws {
        actor SharedLedger: QuotaLedger {
            var bucket: TokenBucket?
            let clock: ManualClock
            var reservations = 0
            init(clock: ManualClock) { self.clock = clock }
            func reserve(_ permits: Double, rate: Double, capacity: Double) async throws -> Double {
                reservations += 1
                let now = Timing.seconds(clock.now)
                var current = bucket ?? TokenBucket(rate: rate, capacity: capacity, at: now)
                let wait = current.reserve(permits, at: now)
                bucket = current
                return wait
            }
        }
        let clock = ManualClock()
        let ledger = SharedLedger(clock: clock)
        let a = RateLimiter(rate: 100, burst: 10, timing: clock.timing, ledger: ledger)
        let b = RateLimiter(rate: 100, burst: 10, timing: clock.timing, ledger: ledger)
        for _ in 0..<100 {
            try await a.acquire()
            try await b.acquire()
        }
        // 200 permits at 100/s with a burst of 10: about 1.9 s, where two private buckets take 0.9 s.
        let elapsed = Timing.seconds(clock.now)
        #expect(elapsed >= 1.85, "took \(elapsed) s")
        #expect(await ledger.reservations < 100, "permits are reserved in blocks, not one by one")
    }
}
