import Foundation

/// The one source of time and randomness: every part that waits, measures, stamps or draws takes
/// it, so tests run on a manual clock (`TidemarkTesting.ManualClock`) and never sleep, and every
/// jitter, key and id they draw repeats.
public struct Timing: Sendable {
    /// Monotonic time since an arbitrary origin.
    public var now: @Sendable () -> Duration
    /// Waits (a manual clock advances at once); throws when the task is cancelled.
    public var sleep: @Sendable (Duration) async throws -> Void
    /// A uniformly distributed 64-bit value: jitter, ids, keys.
    public var random: @Sendable () -> UInt64
    /// The calendar time: timestamps in state and plans, a `Retry-After` given as an HTTP date.
    public var wallClock: @Sendable () -> Date

    /// A timing from these sources; the calendar is the system's unless given.
    public init(
        now: @escaping @Sendable () -> Duration, sleep: @escaping @Sendable (Duration) async throws -> Void,
        random: @escaping @Sendable () -> UInt64, wallClock: @escaping @Sendable () -> Date = { Date() }
    ) {
        self.now = now
        self.sleep = sleep
        self.random = random
        self.wallClock = wallClock
    }

    /// The continuous clock, `Task.sleep`, the system's random numbers and the system's calendar time.
    public static var live: Timing {
        let origin = ContinuousClock.now
        return Timing(
            now: { ContinuousClock.now - origin }, sleep: { try await Task.sleep(for: $0) },
            random: {
                var system = SystemRandomNumberGenerator()
                return system.next()
            })
    }

    /// A `RandomNumberGenerator` view of `random`.
    public var generator: Generator { Generator(draw: random) }

    /// Draws from `Timing.random`.
    public struct Generator: RandomNumberGenerator {
        let draw: @Sendable () -> UInt64
        /// The next draw.
        public mutating func next() -> UInt64 { draw() }
    }

    /// Seconds since 1970 by the wall clock, as state records times.
    public func unixTime() -> Int64 { Int64(wallClock().timeIntervalSince1970.rounded(.down)) }

    /// A random (version 4) UUID in lower case, drawn from `random`: lineages and apply ids.
    public func uuid() -> String {
        var bytes = [UInt8](repeating: 0, count: 16)
        for half in 0..<2 {
            var value = random()
            for i in 0..<8 {
                bytes[half * 8 + i] = UInt8(truncatingIfNeeded: value)
                value >>= 8
            }
        }
        bytes[6] = (bytes[6] & 0x0F) | 0x40
        bytes[8] = (bytes[8] & 0x3F) | 0x80
        let hex = bytes.map { String(format: "%02x", $0) }.joined()
        let parts = [
            hex.prefix(8), hex.dropFirst(8).prefix(4), hex.dropFirst(12).prefix(4), hex.dropFirst(16).prefix(4),
            hex.dropFirst(20),
        ]
        return parts.joined(separator: "-")
    }

    /// Seconds as a `Double`, for rates and messages.
    public static func seconds(_ duration: Duration) -> Double {
        Double(duration.components.seconds) + Double(duration.components.attoseconds) * 1e-18
    }
}
