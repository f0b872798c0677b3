import Foundation
import TidemarkCore

/// The client side of FCM's quota: a token bucket that makes callers wait instead of being
/// answered 429. `rate` permits a second, bursts up to `burst`; a cost larger than the burst
/// (a 1000-token batch under a small quota) waits until the bucket has filled to it.
public actor RateLimiter {
    public nonisolated let rate: Double
    public nonisolated let burst: Double
    private var bucket: TokenBucket
    private let timing: Timing
    /// Permits taken so far: what the calls were charged.
    public private(set) var charged: Double = 0

    public init(rate: Double, burst: Double? = nil, timing: Timing = .live) {
        precondition(rate > 0, "a rate limiter needs a positive rate")
        self.rate = rate
        self.burst = burst ?? rate
        self.timing = timing
        bucket = TokenBucket(rate: rate, capacity: burst ?? rate, at: Timing.seconds(timing.now()))
    }

    /// Waits until `cost` permits are available, then takes them.
    public func acquire(_ cost: Double = 1) async throws {
        // Reserve first, then sleep off the debt: callers are served in arrival order and the actor
        // is never held while sleeping.
        let wait = bucket.reserve(cost, at: Timing.seconds(timing.now()))
        charged += cost
        if wait > 0 { try await timing.sleep(.nanoseconds(Int64(wait * 1e9))) }
    }
}
