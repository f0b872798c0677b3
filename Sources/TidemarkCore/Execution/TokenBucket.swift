/// A token bucket: `rate` permits a second, holding at most `capacity`. Pure: time is passed in, as
/// seconds on any monotonic clock. FCM's quota in the emulator and the client's limiter are both this.
public struct TokenBucket: Sendable, Equatable {
    /// Permits added each second.
    public var rate: Double
    /// The most permits the bucket holds (the burst).
    public var capacity: Double
    /// Permits available now; negative while reserved permits are being waited for.
    public private(set) var level: Double
    /// When the level was last brought up to date, in seconds on the caller's clock.
    public private(set) var last: Double

    /// A full bucket at `time`.
    public init(rate: Double, capacity: Double, at time: Double) {
        precondition(rate > 0, "a token bucket needs a positive rate")
        self.rate = rate
        self.capacity = capacity
        level = capacity
        last = time
    }

    private mutating func refill(at time: Double) {
        level = min(max(capacity, 0), level + max(0, time - last) * rate)
        last = max(last, time)
    }

    /// Takes `cost` permits when they are there; otherwise takes nothing and returns the seconds
    /// until they will be (what a server answers with `Retry-After`).
    public mutating func take(_ cost: Double, at time: Double) -> Double? {
        refill(at: time)
        if level >= cost {
            level -= cost
            return nil
        }
        return (cost - level) / rate
    }

    /// Takes `cost` permits at once, going into debt if need be, and returns the seconds the caller
    /// must wait before using them (0 when none): callers are served in the order they reserve.
    public mutating func reserve(_ cost: Double, at time: Double) -> Double {
        refill(at: time)
        level -= cost
        return level < 0 ? -level / rate : 0
    }
}
