import Foundation
import Testing
@testable import TidemarkFCM

@Suite struct RateLimiterTests {
    @Test func holdsCallersToTheRate() async throws {
        let limiter = RateLimiter(rate: 200, burst: 20)
        let start = ContinuousClock.now
        try await withThrowingTaskGroup(of: Void.self) { group in
            for _ in 0..<120 { group.addTask { try await limiter.acquire() } }
            try await group.waitForAll()
        }
        let elapsed = ContinuousClock.now - start
        // 20 at once, then 100 more at 200/s: never faster than 0.5 s. (No upper bound: a loaded
        // machine may be slower, which is not the limiter's doing.)
        #expect(elapsed >= .milliseconds(495), "\(elapsed)")
    }
}
