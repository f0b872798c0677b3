import Foundation
import Synchronization

/// Time and randomness for retries: the real clock, or a virtual one so tests never sleep and
/// always draw the same jitter.
public struct RetryTiming: Sendable {
    /// Monotonic time since an arbitrary origin.
    public var now: @Sendable () -> Duration
    public var sleep: @Sendable (Duration) async throws -> Void
    /// A uniformly distributed 64-bit value, for jitter.
    public var random: @Sendable () -> UInt64
    /// The calendar time, for a `Retry-After` given as an HTTP date.
    public var wallClock: @Sendable () -> Date

    public init(now: @escaping @Sendable () -> Duration, sleep: @escaping @Sendable (Duration) async throws -> Void,
        random: @escaping @Sendable () -> UInt64, wallClock: @escaping @Sendable () -> Date = { Date() })
    {
        self.now = now
        self.sleep = sleep
        self.random = random
        self.wallClock = wallClock
    }

    /// The continuous clock, `Task.sleep` and the system's random numbers.
    public static var live: RetryTiming {
        let origin = ContinuousClock.now
        return RetryTiming(now: { ContinuousClock.now - origin }, sleep: { try await Task.sleep(for: $0) },
            random: { var system = SystemRandomNumberGenerator(); return system.next() })
    }

    /// A `RandomNumberGenerator` view of `random`.
    public var generator: Generator { Generator(draw: random) }

    public struct Generator: RandomNumberGenerator {
        let draw: @Sendable () -> UInt64
        public mutating func next() -> UInt64 { draw() }
    }
}

/// A clock for tests: sleeping advances it at once and is recorded; jitter comes from a seed.
public final class VirtualRetryClock: Sendable {
    private struct Inner {
        var now: Duration = .zero
        var sleeps: [Duration] = []
        var random: SeededGenerator
    }

    private let inner: Mutex<Inner>

    /// Calendar time at virtual time zero.
    public let epoch: Date

    public init(seed: UInt64 = 1, epoch: Date = Date(timeIntervalSince1970: 1_800_000_000)) {
        inner = Mutex(Inner(random: SeededGenerator(seed: seed)))
        self.epoch = epoch
    }

    public var timing: RetryTiming {
        RetryTiming(now: { self.now }, sleep: { self.advance($0) }, random: { self.inner.withLock { $0.random.next() } },
            wallClock: { self.epoch.addingTimeInterval(Double(self.now.components.seconds) + Double(self.now.components.attoseconds) * 1e-18) })
    }

    public var now: Duration { inner.withLock { $0.now } }
    /// Every sleep so far, in order.
    public var sleeps: [Duration] { inner.withLock { $0.sleeps } }

    public func advance(_ duration: Duration) {
        inner.withLock {
            $0.now += duration
            $0.sleeps.append(duration)
        }
    }
}
