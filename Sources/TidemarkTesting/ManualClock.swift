import Foundation
import Synchronization
import TidemarkCore

/// A clock for tests: sleeping advances it at once and is recorded; random draws come from a seed,
/// so jitter, ids and keys repeat run after run.
public final class ManualClock: Sendable {
    private struct Inner {
        var now: Duration = .zero
        var sleeps: [Duration] = []
        var random: SeededGenerator
    }

    private let inner: Mutex<Inner>

    /// Calendar time at virtual time zero.
    public let epoch: Date

    /// A clock at zero whose draws come from `seed`, calendar time starting at `epoch`.
    public init(seed: UInt64 = 1, epoch: Date = Date(timeIntervalSince1970: 1_800_000_000)) {
        inner = Mutex(Inner(random: SeededGenerator(seed: seed)))
        self.epoch = epoch
    }

    /// The `Timing` to give the code under test.
    public var timing: Timing {
        Timing(
            now: { self.now }, sleep: { self.advance($0) }, random: { self.inner.withLock { $0.random.next() } },
            wallClock: { self.epoch.addingTimeInterval(Timing.seconds(self.now)) })
    }

    /// The virtual time.
    public var now: Duration { inner.withLock { $0.now } }
    /// Every sleep so far, in order.
    public var sleeps: [Duration] { inner.withLock { $0.sleeps } }

    /// Moves time on, as a sleep would (and records it as one).
    public func advance(_ duration: Duration) {
        inner.withLock {
            $0.now += duration
            $0.sleeps.append(duration)
        }
    }
}
