import Foundation
import Synchronization
import Testing
import TidemarkCore
import TidemarkServe

/// The rule by which replicas spread the workspaces they share.
struct ReplicaBalanceTests {
    /// A clock the tests move by hand.
    final class Clock: Sendable {
        private let value = Mutex<Duration>(.zero)
        var now: Duration { value.withLock { $0 } }
        func advance(_ by: Duration) { value.withLock { $0 += by } }
    }

    func balance(_ replica: String, _ clock: Clock) -> ReplicaBalance {
        ReplicaBalance(replica: replica, grace: .seconds(10), cooldown: .seconds(5), now: { clock.now })
    }

    func record(_ workspace: String, owner: String?, replicas: [String]) -> ServeRecord {
        var record = ServeRecord(workspace: workspace)
        record.owner = owner
        record.ownerExpires = owner.map { _ in Date().addingTimeInterval(30) }
        for replica in replicas { record.replicas[replica] = Date().addingTimeInterval(30) }
        return record
    }

    /// A free workspace goes to the replica that owns the fewest (the lowest name on a tie); the others
    /// take it only once it has been free for the grace.
    @Test func theReplicaWithTheFewestTakesAFreeWorkspace() {
        let clock = Clock()
        let b = balance("b", clock)
        b.observe("w1", record("w1", owner: "a", replicas: ["a", "b"]))
        b.observe("w2", record("w2", owner: nil, replicas: ["a", "b"]))
        #expect(b.shouldTake("w2"))
        // Counted as b's at once: a second free one is now a tie, which "a" wins by name.
        b.observe("w3", record("w3", owner: nil, replicas: ["a", "b"]))
        #expect(!b.shouldTake("w3"))
        clock.advance(.seconds(9))
        #expect(!b.shouldTake("w3"))
        clock.advance(.seconds(1))
        #expect(b.shouldTake("w3"))
        // A workspace owned by someone is never taken; one alone is always taken.
        #expect(!b.shouldTake("w1"))
        let alone = balance("c", clock)
        alone.observe("w9", record("w9", owner: nil, replicas: []))
        #expect(alone.shouldTake("w9"))
        #expect(!alone.shouldTake("unknown"))
    }

    /// An owner with two more than another replica running one of its workspaces hands it over, one at a
    /// time and once per cooldown; a difference of one moves nothing.
    @Test func anOwnerWithTwoMoreHandsOneOver() throws {
        let clock = Clock()
        let a = balance("a", clock)
        for index in 1...4 { a.observe("w\(index)", record("w\(index)", owner: "a", replicas: ["a", "b", "c"])) }
        let first = try #require(a.handOverTarget("w1"))
        #expect(first.to == "b" && first.mine == 4 && first.theirs == 0)
        #expect(a.handOverTarget("w2") == nil)
        // The first went to b; after the cooldown the next goes to c, which has none.
        a.observe("w1", record("w1", owner: "b", replicas: ["a", "b", "c"]))
        clock.advance(.seconds(5))
        let second = try #require(a.handOverTarget("w2"))
        #expect(second.to == "c" && second.mine == 3 && second.theirs == 0)
        a.observe("w2", record("w2", owner: "c", replicas: ["a", "b", "c"]))
        clock.advance(.seconds(5))
        // a owns 2, b and c 1 each: fair enough.
        #expect(a.handOverTarget("w3") == nil && a.handOverTarget("w4") == nil)
        // Not a's to give, and no workspace goes to a replica that does not run it.
        #expect(a.handOverTarget("w1") == nil)
        let d = balance("d", clock)
        for index in 1...3 { d.observe("w\(index)", record("w\(index)", owner: "d", replicas: ["d"])) }
        #expect(d.handOverTarget("w1") == nil)
        #expect(d.replicas == ["d"])
        #expect(a.replicas == ["a", "b", "c"])
    }

    /// The replica that handed a workspace over does not take it back while the other can.
    @Test func aHandedOverWorkspaceIsNotTakenBack() throws {
        let clock = Clock()
        let a = balance("a", clock)
        for index in 1...3 { a.observe("w\(index)", record("w\(index)", owner: "a", replicas: ["a", "b"])) }
        let target = try #require(a.handOverTarget("w1"))
        #expect(target.to == "b")
        a.observe("w1", record("w1", owner: nil, replicas: ["a", "b"]))
        #expect(!a.shouldTake("w1"))
        clock.advance(.seconds(10))
        #expect(a.shouldTake("w1"))
    }
}
