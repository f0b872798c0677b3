import Foundation
import Testing
import TidemarkCore
import TidemarkRuntime
import TidemarkTesting

/// Saved plans sealed with TIDEMARK_PLAN_KEY: no token in the clear, opened only with the key, and
/// refused when either part was edited.
struct SealedPlanTests {
    static func token(_ index: Int) -> String { "tok\(index):APA91b" + String(repeating: "Q", count: 140) }

    /// A plan with a registration token in every field that can hold one, and a group key.
    static func plan() -> Plan {
        var plan = StateStoreConformance.plan(
            [
                PlannedOperation(kind: .subscribe, target: "news", tokens: [token(1), token(2)]),
                PlannedOperation(kind: .unsubscribe, target: "news", tokens: [token(3)]),
                PlannedOperation(kind: .groupAdd, target: "family", tokens: [token(4)]),
            ], state: State(lineage: "lineage-1", serial: 3))
        plan.observations.topics = [
            Observations.TopicDelta(topic: "news", subscribed: [token(5)], unsubscribed: [token(6)])
        ]
        plan.observations.dead = [token(7)]
        plan.observations.revived = [token(8)]
        plan.observations.groupKeys = [Observations.GroupKey(group: "family", key: "APA91bGROUPKEY" + token(9))]
        plan.rotations = [Rotation(device: "d10", from: token(10), to: token(11), subscribes: 1, unsubscribes: 1)]
        plan.departed = [Departure(device: "d12", token: token(12))]
        plan.sweptMatching = [token(13)]
        var observed = Observations()
        observed.dead = [token(14)]
        plan.shadowVerify = ShadowVerify(reads: .v1, against: .iid, observations: observed, coverage: nil)
        plan.operationsDigestWhenMade = plan.operationsDigest
        return plan
    }

    static let key = try! PlanKey(base64: Data(repeating: 7, count: 32).base64EncodedString())

    @Test func aSealedPlanHoldsNoTokenInTheClearAndOpensWithItsKey() throws {
        let plan = Self.plan()
        let data = try SealedPlan.seal(plan, key: Self.key)
        let text = String(decoding: data, as: UTF8.self)
        for index in 1...14 {
            #expect(!text.contains(Self.token(index)), "token \(index) is in the clear")
            #expect(!text.contains("tok\(index):APA91b"), "token \(index) is in the clear")
        }
        #expect(!text.contains("GROUPKEY"))
        #expect(SealedPlan.isSealed(data))
        #expect(!SealedPlan.isSealed(try Plan.encoder().encode(plan)))
        let opened = try SealedPlan.read(data, file: "plan.json", key: Self.key, requireWhole: true)
        #expect(opened.sealed && opened.whole)
        #expect(try Plan.encoder().encode(opened.plan) == Plan.encoder().encode(Self.decoded(plan)))
        // Without the key: the readable part, for show; apply is refused.
        let closed = try SealedPlan.read(data, file: "plan.json", key: nil, requireWhole: false)
        #expect(
            closed.sealed && !closed.whole && closed.closedBecause?.contains("TIDEMARK_PLAN_KEY is not set") == true)
        #expect(closed.plan.operations.map(\.tokens) == plan.operations.map { $0.tokens.map(Redaction.redact) })
        #expect(throws: RuntimeError.self) {
            try SealedPlan.read(data, file: "plan.json", key: nil, requireWhole: true)
        }
        let other = try PlanKey(base64: Data(repeating: 8, count: 32).base64EncodedString())
        #expect {
            try SealedPlan.read(data, file: "plan.json", key: other, requireWhole: true)
        } throws: { "\($0)".contains("sealed with another key") }
    }

    /// A plan as a saved plan reads back (dates to the second, operations coalesced).
    static func decoded(_ plan: Plan) throws -> Plan {
        try Plan.decodeSaved(Plan.encoder().encode(plan), file: "plan.json")
    }

    @Test func anEditedSealOrReadablePartIsRefused() throws {
        let data = try SealedPlan.seal(Self.plan(), key: Self.key)
        var object = try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
        // The readable part says fewer unsubscribes than the sealed plan makes.
        var readable = try #require(object["plan"] as? [String: Any])
        readable["requests"] = 99
        object["plan"] = readable
        let edited = try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])
        #expect {
            try SealedPlan.read(edited, file: "plan.json", key: Self.key, requireWhole: true)
        } throws: { "\($0)".contains("readable part was edited") }
        // One character of the seal changed.
        var sealed = try #require(object["sealed"] as? String)
        let index = sealed.index(sealed.startIndex, offsetBy: 40)
        sealed.replaceSubrange(index...index, with: sealed[index] == "A" ? "B" : "A")
        object["plan"] = try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])["plan"]
        object["sealed"] = sealed
        let broken = try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])
        #expect {
            try SealedPlan.read(broken, file: "plan.json", key: Self.key, requireWhole: true)
        } throws: { "\($0)".contains("seal does not verify") }
    }

    @Test(arguments: ["", "abc", Data(repeating: 1, count: 16).base64EncodedString()])
    func aKeyThatIsNotThirtyTwoBytesIsRefusedWithoutShowingIt(_ value: String) throws {
        if value.isEmpty {
            #expect(try PlanKey.from([PlanKey.variable: value]) == nil)
            return
        }
        #expect {
            try PlanKey.from([PlanKey.variable: value])
        } throws: { "\($0)".contains("TIDEMARK_PLAN_KEY must be base64 of 32") && !"\($0)".contains(value) }
    }
}
