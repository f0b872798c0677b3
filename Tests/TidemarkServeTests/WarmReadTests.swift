import Foundation
import Testing
import TidemarkTesting

@testable import TidemarkCore
@testable import TidemarkServe

/// What a whole reconcile of a workspace that follows changes keeps in memory for its batches.
@Suite struct WarmReadTests {
    /// A resync's reading keeps the strings of the one before it for every token it finds again, in
    /// state and inventory alike (see `StringReuse`): its new allocations are the new tokens only.
    @Test func aResyncKeepsTheStringsOfTheReadingBeforeIt() async throws {
        let project = try ServeProject()
        defer { project.remove() }
        try project.writeDevices([0, 1, 2, 3])
        var reconciler = try project.reconciler()
        reconciler.followsChanges = true
        func reading() throws -> WarmPlan {
            let entry = try #require(reconciler.warm.take(), "a whole reconcile leaves its reading")
            reconciler.warm.put(entry)
            return entry.plan
        }
        let first = await reconciler.reconcile()
        #expect(first.outcome == .success && first.subscribed == 4, "\(first)")
        let before = try reading()

        try project.writeDevices([0, 1, 2, 3, 4])
        let resync = await reconciler.reconcile(whole: true)
        #expect(resync.outcome == .success && resync.subscribed == 1, "\(resync)")
        let after = try reading()
        let storage = StateStoreConformance.storage
        for i in 0..<5 {
            let token = Fixtures.token(i)
            let device = try #require(after.inventory.index(ofDevice: "d\(i)"))
            let id = try #require(after.state.tokens.id(token))
            #expect(after.inventory.tokens[device] == token && after.state.tokens[id] == token)
            #expect(
                storage(after.inventory.tokens[device]) == storage(after.state.tokens[id]),
                "state and inventory hold one string for token \(i)")
            if i < 4 {
                let kept = try #require(before.state.tokens.id(token))
                #expect(
                    storage(after.state.tokens[id]) == storage(before.state.tokens[kept]),
                    "token \(i) is the string the reading before made")
            }
        }
    }

    /// The first reading after a start (state stored, nothing to reuse) holds one string per token too:
    /// the inventory's tokens become state's.
    @Test func theFirstReadingHoldsOneStringPerToken() async throws {
        let project = try ServeProject()
        defer { project.remove() }
        try project.writeDevices([0, 1, 2])
        #expect(try await project.reconciler().reconcile().outcome == .success, "state is stored")
        var restarted = try project.reconciler()
        restarted.followsChanges = true
        let first = await restarted.reconcile()
        #expect(first.outcome == .success && first.subscribed == 0, "\(first)")
        let entry = try #require(restarted.warm.take())
        let storage = StateStoreConformance.storage
        for i in 0..<3 {
            let device = try #require(entry.plan.inventory.index(ofDevice: "d\(i)"))
            let id = try #require(entry.plan.state.tokens.id(Fixtures.token(i)))
            #expect(storage(entry.plan.inventory.tokens[device]) == storage(entry.plan.state.tokens[id]))
        }
    }
}
