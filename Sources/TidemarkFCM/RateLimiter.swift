import Foundation
import TidemarkCore

/// The client side of FCM's quota: a token bucket that makes callers wait instead of being
/// answered 429. `rate` permits a second, bursts up to `burst`; a cost larger than the burst
/// (a 1000-token batch under a small quota) waits until the bucket has filled to it.
public actor RateLimiter {
    /// Permits a second.
    public nonisolated let rate: Double
    /// The most permits taken at once after a pause.
    public nonisolated let burst: Double
    private var bucket: TokenBucket
    private let timing: Timing
    /// Permits taken so far: what the calls were charged.
    public private(set) var charged: Double = 0
    /// The project's shared bucket, when runners share one (PostgreSQL state); nil for a local one.
    private let ledger: (any QuotaLedger)?
    /// Blocks of permits reserved from the ledger and not yet used, in order, each usable from its
    /// `readyAt` (seconds on `timing`).
    private var blocks: [(amount: Double, readyAt: Double)] = []
    /// Whether a reservation is in flight: callers short of permits wait for it rather than reserving
    /// again, and look again once it ended (however it ended).
    private var refilling = false
    private var waitingForRefill: [CheckedContinuation<Void, Never>] = []

    /// A limiter of `rate` a second (burst: one second's worth by default); `ledger` shares the bucket with other runners.
    public init(rate: Double, burst: Double? = nil, timing: Timing = .live, ledger: (any QuotaLedger)? = nil) {
        precondition(rate > 0, "a rate limiter needs a positive rate")
        self.rate = rate
        self.burst = burst ?? rate
        self.timing = timing
        self.ledger = ledger
        bucket = TokenBucket(rate: rate, capacity: burst ?? rate, at: Timing.seconds(timing.now()))
    }

    /// Waits until `cost` permits are available, then takes them.
    public func acquire(_ cost: Double = 1) async throws {
        if let ledger {
            charged += cost
            // Permits come from the project's shared ledger in blocks of about 50 ms of quota (one
            // database round trip per block, not per request), one reservation at a time.
            while blocks.reduce(0, { $0 + $1.amount }) < cost {
                if refilling {
                    await withCheckedContinuation { waitingForRefill.append($0) }
                    try Task.checkCancellation()
                    continue
                }
                let available = blocks.reduce(0, { $0 + $1.amount })
                let block = max(cost - available, min(burst, rate / 20))
                refilling = true
                defer {
                    refilling = false
                    for waiter in waitingForRefill { waiter.resume() }
                    waitingForRefill = []
                }
                let wait = try await ledger.reserve(block, rate: rate, capacity: burst)
                blocks.append((block, Timing.seconds(timing.now()) + wait))
            }
            var remaining = cost
            var ready = 0.0
            while remaining > 1e-9, !blocks.isEmpty {
                ready = max(ready, blocks[0].readyAt)
                if blocks[0].amount <= remaining {
                    remaining -= blocks[0].amount
                    blocks.removeFirst()
                } else {
                    blocks[0].amount -= remaining
                    remaining = 0
                }
            }
            let wait = ready - Timing.seconds(timing.now())
            if wait > 0 { try await timing.sleep(.nanoseconds(Int64(wait * 1e9))) }
            return
        }
        // Reserve first, then sleep off the debt: callers are served in arrival order and the actor
        // is never held while sleeping.
        let wait = bucket.reserve(cost, at: Timing.seconds(timing.now()))
        charged += cost
        if wait > 0 { try await timing.sleep(.nanoseconds(Int64(wait * 1e9))) }
    }
}
