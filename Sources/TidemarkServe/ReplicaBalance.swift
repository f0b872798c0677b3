import Foundation
import Synchronization
import TidemarkCore

/// How the replicas of `serve` spread the workspaces they share, so that each reconciles its part
/// rather than the first to start owning them all.
///
/// Every replica records its presence in the records of the workspaces it runs (`ServeRecord.replicas`,
/// renewed with each claim), so each one sees which replicas run each of its workspaces and which
/// one owns it. From that, one rule, applied by every replica alike:
///
/// - A free workspace is taken by the replica, among those that run it, that owns the fewest of the
///   workspaces this one sees (ties go to the lowest name); any replica takes it once it has been
///   free for `grace`, so a workspace is never left without an owner.
/// - Between two reconciles, an owner that has at least two more workspaces than another replica
///   running one of them hands that one over: it gives its claim up and keeps its presence, and the
///   replica with fewer takes it. One handover at a time, at most one per `cooldown`, so the spread
///   converges without workspaces changing hands back and forth.
///
/// The counts are those of the workspaces this replica runs: replicas that list other workspaces
/// are balanced over the ones they share.
public final class ReplicaBalance: Sendable {
    /// What a runner last read or wrote of a workspace's record.
    private struct Seen {
        var owner: String?
        var replicas: Set<String>
        /// When it was first seen free (monotonic), while it stays free.
        var freeSince: Duration?
    }

    private struct Book {
        var seen: [String: Seen] = [:]
        var lastHandover: Duration?
    }

    /// This replica's name.
    public let replica: String
    /// How long a workspace may stay free before any replica running it takes it.
    public let grace: Duration
    /// How long after a handover this replica waits before the next.
    public let cooldown: Duration
    private let now: @Sendable () -> Duration
    private let book = Mutex(Book())

    /// A balance for `replica`; `now` is a monotonic clock (the runners' `Timing.now`).
    public init(
        replica: String, grace: Duration, cooldown: Duration, now: @escaping @Sendable () -> Duration
    ) {
        self.replica = replica
        self.grace = grace
        self.cooldown = cooldown
        self.now = now
    }

    /// Notes what a runner read or wrote of the record of the workspace it knows as `key`.
    public func observe(_ key: String, _ record: ServeRecord) {
        let now = self.now()
        book.withLock { book in
            let before = book.seen[key]
            var seen = Seen(owner: record.owner, replicas: Set(record.replicas.keys), freeSince: nil)
            seen.replicas.insert(replica)
            if record.owner == nil { seen.freeSince = before?.freeSince ?? now }
            book.seen[key] = seen
        }
    }

    /// Forgets a workspace this replica no longer runs.
    public func forget(_ key: String) {
        _ = book.withLock { $0.seen.removeValue(forKey: key) }
    }

    /// Whether this replica should take the workspace `key`, seen free: it owns the fewest among the
    /// replicas running it, or the workspace has been free for `grace`. When it says yes it counts the
    /// workspace as this replica's until the next record read says otherwise (so two runners of one
    /// replica do not both take one more than its share).
    public func shouldTake(_ key: String) -> Bool {
        let now = self.now()
        return book.withLock { book in
            guard let seen = book.seen[key], seen.owner == nil else { return false }
            let counts = Self.counts(book.seen)
            let mine = counts[replica, default: 0]
            let fewest = seen.replicas.allSatisfy { other in
                other == replica || (mine, replica) < (counts[other, default: 0], other)
            }
            guard fewest || now - (seen.freeSince ?? now) >= grace else { return false }
            book.seen[key]?.owner = replica
            book.seen[key]?.freeSince = nil
            return true
        }
    }

    /// The replica to hand the workspace `key` (owned by this replica) over to, when moving it makes the
    /// spread fairer and no handover happened within `cooldown`; with this replica's count and theirs.
    /// When it names one, the workspace counts as free from then on.
    public func handOverTarget(_ key: String) -> (to: String, mine: Int, theirs: Int)? {
        let now = self.now()
        return book.withLock { book in
            guard let seen = book.seen[key], seen.owner == replica else { return nil }
            if let last = book.lastHandover, now - last < cooldown { return nil }
            let counts = Self.counts(book.seen)
            let mine = counts[replica, default: 0]
            let others = seen.replicas.filter { $0 != replica }.map { ($0, counts[$0, default: 0]) }
            guard let (to, theirs) = others.min(by: { ($0.1, $0.0) < ($1.1, $1.0) }), mine - theirs >= 2
            else { return nil }
            book.lastHandover = now
            book.seen[key]?.owner = nil
            book.seen[key]?.freeSince = now
            return (to, mine, theirs)
        }
    }

    /// The replicas seen running this replica's workspaces, this one included.
    public var replicas: Set<String> {
        book.withLock { book in book.seen.values.reduce(into: [replica]) { $0.formUnion($1.replicas) } }
    }

    /// How many of the workspaces seen each replica owns.
    private static func counts(_ seen: [String: Seen]) -> [String: Int] {
        seen.values.reduce(into: [:]) { counts, seen in
            if let owner = seen.owner { counts[owner, default: 0] += 1 }
        }
    }
}
