import Foundation
import Testing
import TidemarkCore
import TidemarkTesting

/// The journal's compact copy of a plan: tokens as ids of the state's table.
@Suite struct JournalPlanTests {
    static func table(_ n: Int) -> TokenTable {
        var state = State(lineage: "l", serial: 1)
        for i in 0..<n { state.intern(Fixtures.token(i)) }
        return state.tokens.table
    }

    static let plan = StateStoreConformance.plan(
        [
            PlannedOperation(kind: .unsubscribe, target: "news", tokens: [Fixtures.token(9), Fixtures.token(2)]),
            PlannedOperation(kind: .subscribe, target: "news", tokens: []),
            PlannedOperation(kind: .subscribe, target: "sports", tokens: [Fixtures.token(2), Fixtures.token(0)]),
        ], state: State(lineage: "l", serial: 1))

    @Test func roundTripsAndIsSmallerThanJSON() throws {
        let tokens = Self.table(10)
        let data = try #require(try JournalPlan.encode(Self.plan, tokens: tokens))
        #expect(JournalPlan.isCompact(data))
        var asked: [UInt32] = []
        let back = try JournalPlan.decode(data) { ids in
            asked = ids
            return Dictionary(uniqueKeysWithValues: ids.map { ($0, tokens[$0]) })
        }
        #expect(back.operations == Self.plan.operations && back.operationsDigest == Self.plan.operationsDigest)
        #expect(asked == [0, 2, 9], "each id looked up once, in order")
        #expect(data.count < (try Plan.encoder(pretty: false).encode(Self.plan)).count)
    }

    @Test func readsAWholeJSONPlanAsBefore() throws {
        let json = try Plan.encoder(pretty: false).encode(Self.plan)
        #expect(!JournalPlan.isCompact(json))
        let back = try JournalPlan.decode(json) { _ in
            Issue.record("a whole plan looks nothing up")
            return [:]
        }
        #expect(back.operations == Self.plan.operations)
        #expect(try JournalPlan.encode(Self.plan, tokens: Self.table(5)) == nil, "token 9 has no id: kept whole")
    }

    @Test func aDamagedCopyIsRefused() throws {
        let tokens = Self.table(10)
        let data = try #require(try JournalPlan.encode(Self.plan, tokens: tokens))
        let all = { (ids: [UInt32]) in Dictionary(uniqueKeysWithValues: ids.map { ($0, tokens[$0]) }) }
        for cut in [data.count - 1, data.count - 9, 30] {
            #expect(throws: JournalPlan.Damaged.self, "cut at \(cut)") {
                try JournalPlan.decode(data.prefix(cut), tokens: all)
            }
        }
        #expect(throws: JournalPlan.Damaged.self, "trailing bytes") {
            try JournalPlan.decode(data + Data([0]), tokens: all)
        }
        #expect(throws: JournalPlan.Damaged.self, "an id state does not hold") {
            try JournalPlan.decode(data) { ids in all(ids).filter { $0.key != 9 } }
        }
    }
}
