import Foundation

/// The client side of FCM's quota: a token bucket that makes callers wait instead of being
/// answered 429. `rate` permits a second, bursts up to `burst`; a cost larger than the burst
/// (a 1000-token batch under a small quota) waits until the bucket has filled to it.
public actor RateLimiter {
    public let rate: Double
    public let burst: Double
    private var level: Double
    /// Permits taken so far: what the calls were charged.
    public private(set) var charged: Double = 0
    private var last: ContinuousClock.Instant
    private let clock: ContinuousClock

    public init(rate: Double, burst: Double? = nil) {
        precondition(rate > 0, "a rate limiter needs a positive rate")
        self.rate = rate
        self.burst = burst ?? rate
        clock = ContinuousClock()
        last = clock.now
        level = burst ?? rate
    }

    /// Waits until `cost` permits are available, then takes them.
    public func acquire(_ cost: Double = 1) async throws {
        // Reserve first (the level may go negative), then sleep off the debt: callers are served
        // in arrival order and the actor is never held while sleeping.
        refill()
        level -= cost
        charged += cost
        if level < 0 {
            try await Task.sleep(for: .nanoseconds(Int64(-level / rate * 1e9)))
        }
    }

    private func refill() {
        let now = clock.now
        let elapsed = now - last
        last = now
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) * 1e-18
        level = min(max(burst, 0), level + seconds * rate)
    }
}
