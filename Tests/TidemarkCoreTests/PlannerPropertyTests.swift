import Testing

@testable import TidemarkCore

/// Random worlds: whatever FCM holds, whatever state remembers and the manifests declare,
/// carrying out the plan gives exactly the declared memberships, and a second plan is empty.
@Suite struct PlannerPropertyTests {
    struct Scenario {
        var known: [String]
        var unknown: [String]
        var dead: Set<String>
        var world: [String: Set<String>]
        var state: State
        var desired: DesiredState
        var cap: Int
        var batch: Int
    }

    static func makeScenario(seed: UInt64) -> Scenario {
        var rng = SeededGenerator(seed: seed)
        let knownCount = Int.random(in: 5...40, using: &rng)
        let known = (0..<knownCount).map { "known-\(seed)-\($0):APA91b" }
        let unknown = (0..<Int.random(in: 0...6, using: &rng)).map { "unknown-\($0):APA91b" }
        let topicNames = (0..<Int.random(in: 1...8, using: &rng)).map { "topic-\($0)" }
        let cap = Int.random(in: 2...6, using: &rng)
        let dead = Set(known.filter { _ in Int.random(in: 0..<10, using: &rng) == 0 })
        var world: [String: Set<String>] = [:]
        var count: [String: Int] = [:]
        for topic in topicNames {
            for token in known + unknown
            where !dead.contains(token) && Bool.random(using: &rng)
                && count[token, default: 0] < cap
            {
                world[topic, default: []].insert(token)
                count[token, default: 0] += 1
            }
        }
        var state = State(lineage: "test", serial: 1)
        for token in known { state.intern(token) }
        state.setDead(TokenSet(dead.compactMap { state.tokens.id($0) }))
        for topic in topicNames where Bool.random(using: &rng) {
            // What state remembers may be stale: memberships seen earlier, some managed.
            var observed: [UInt32] = []
            var managed: [UInt32] = []
            for token in known where !dead.contains(token) {
                let id = state.tokens.id(token)!
                let isMember = world[topic]?.contains(token) ?? false
                if isMember ? Int.random(in: 0..<5, using: &rng) > 0 : Int.random(in: 0..<6, using: &rng) == 0 {
                    observed.append(id)
                }
                if Int.random(in: 0..<3, using: &rng) == 0 { managed.append(id) }
            }
            state.setTopic(topic, TopicState(mode: .additive, managed: TokenSet(managed), observed: TokenSet(observed)))
        }
        var topics: [DesiredTopic] = []
        for topic in topicNames where Int.random(in: 0..<5, using: &rng) > 0 {
            let members = known.filter { _ in Int.random(in: 0..<3, using: &rng) == 0 }.map { state.tokens.id($0)! }
            // allow_empty: these worlds test convergence; the emptying rail has its own tests.
            topics.append(
                DesiredTopic(
                    name: topic, mode: Bool.random(using: &rng) ? .additive : .authoritative,
                    allowEmpty: true, members: TokenSet(members)))
        }
        let desired = DesiredState(
            topics: topics, groups: [],
            knownTokens: TokenSet(sorted: Array(0..<UInt32(state.tokens.count))))
        return Scenario(
            known: known, unknown: unknown, dead: dead, world: world, state: state, desired: desired,
            cap: cap, batch: Int.random(in: 1...7, using: &rng))
    }

    static func refresh(_ world: [String: Set<String>], _ scenario: Scenario, _ state: State) -> RefreshResult {
        var subscribed: [String: TokenSet] = [:]
        for (topic, tokens) in world {
            subscribed[topic] = TokenSet(tokens.compactMap { state.tokens.id($0) })
        }
        return RefreshResult(
            at: 100, refreshed: TokenSet(sorted: Array(0..<UInt32(state.tokens.count))),
            subscribed: subscribed, dead: TokenSet(scenario.dead.compactMap { state.tokens.id($0) }), groupKeys: [:])
    }

    @Test(arguments: 0..<300)
    func planConvergesAndIsMinimal(seed: Int) throws {
        let scenario = Self.makeScenario(seed: UInt64(seed))
        let differ = Differ(batchSize: scenario.batch, maxTopicsPerToken: scenario.cap)
        var state = scenario.state
        let observations = state.observations(from: Self.refresh(scenario.world, scenario, state))
        state.recordObservations(observations, seen: TokenSet(sorted: Array(0..<UInt32(state.tokens.count))))
        let result = differ.diff(desired: scenario.desired, state: state)
        if result.diagnostics.hasErrors {
            // The declared set would pass the cap together with memberships tidemark may not remove.
            #expect(
                result.diagnostics.allSatisfy {
                    $0.message.contains("topics after this plan") || $0.message.contains("more tokens would pass")
                })
            return
        }
        // Execute in plan order against the world, checking the cap after every request.
        state.prepareForApply(with: scenario.desired, operations: result.operations)
        var world = scenario.world
        var seenUnsubscribe = false
        var seenSubscribeAfter = false
        for op in result.operations {
            #expect(op.tokens.count <= scenario.batch && !op.tokens.isEmpty)
            #expect(Set(op.tokens).count == op.tokens.count)
            if op.kind == .unsubscribe {
                seenUnsubscribe = true
                #expect(!seenSubscribeAfter)
            }
            if op.kind == .subscribe { seenSubscribeAfter = true }
            if op.kind.isStateOnly {
                // An adoption records what FCM holds; nothing is sent, the world stays as it is.
                #expect(op.kind == .topicAdopt && op.tokens.allSatisfy { world[op.target]?.contains($0) == true })
                state.recordOutcome(op, outcomes: op.tokens.map { _ in .ok }, groupKey: nil)
                continue
            }
            var outcomes: [TokenOutcome] = []
            for token in op.tokens {
                if scenario.dead.contains(token) {
                    outcomes.append(.failed(.notFound))
                    continue
                }
                if op.kind == .subscribe {
                    world[op.target, default: []].insert(token)
                } else {
                    world[op.target]?.remove(token)
                }
                outcomes.append(.ok)
            }
            for token in op.tokens {
                let count = world.values.filter { $0.contains(token) }.count
                #expect(count <= scenario.cap, "token passed the cap mid-plan")
            }
            state.recordOutcome(op, outcomes: outcomes, groupKey: nil)
        }
        _ = seenUnsubscribe
        #expect(!result.operations.contains { op in op.tokens.contains { scenario.dead.contains($0) } })

        // The world now holds exactly what each mode promises.
        let knownSet = Set(scenario.known)
        var expectedAdds = 0
        var expectedRemoves = 0
        for topic in Set(scenario.world.keys).union(scenario.desired.topics.map(\.name)).union(
            scenario.state.topics.keys)
        {
            let before = scenario.world[topic] ?? []
            let after = world[topic] ?? []
            #expect(
                after.filter { !knownSet.contains($0) } == before.filter { !knownSet.contains($0) },
                "devices tidemark does not know were touched")
            let managed = Set((scenario.state.topics[topic]?.managed ?? TokenSet()).map { scenario.state.tokens[$0] })
            if let spec = scenario.desired.topics.first(where: { $0.name == topic }) {
                let declared = Set(spec.members.map { scenario.state.tokens[$0] }).subtracting(scenario.dead)
                let knownAfter = after.intersection(knownSet)
                // Declared devices state saw subscribed that left on their own opted out: an additive topic
                // respects that (its default), an authoritative one subscribes them again.
                let seenBefore = Set(
                    (scenario.state.topics[topic]?.observed ?? TokenSet()).map { scenario.state.tokens[$0] })
                let optedOut = spec.optOuts == .respect ? declared.intersection(seenBefore).subtracting(before) : []
                switch spec.mode {
                case .additive:
                    let expected = declared.subtracting(optedOut).union(
                        before.intersection(knownSet).subtracting(managed.subtracting(declared)))
                    #expect(knownAfter == expected, "additive topic \(topic)")
                case .authoritative:
                    #expect(knownAfter == declared.subtracting(optedOut), "authoritative topic \(topic)")
                }
                expectedAdds += declared.subtracting(before).subtracting(optedOut).count
                expectedRemoves += before.intersection(knownSet).subtracting(knownAfter).count
            } else {
                #expect(
                    after.intersection(knownSet) == before.intersection(knownSet).subtracting(managed),
                    "topic \(topic) left the manifests: only what tidemark made is removed")
                expectedRemoves += before.intersection(managed).count
            }
        }
        // The minimum: each changed membership once, in ⌈n / batch⌉ requests per (topic, operation).
        let adds = result.operations.filter { $0.kind == .subscribe }.reduce(0) { $0 + $1.tokens.count }
        let removes = result.operations.filter { $0.kind == .unsubscribe }.reduce(0) { $0 + $1.tokens.count }
        #expect(adds == expectedAdds)
        #expect(removes == expectedRemoves)
        var perKey: [String: Int] = [:]
        let sent = result.operations.filter { !$0.kind.isStateOnly }
        for op in sent { perKey["\(op.kind)/\(op.target)", default: 0] += op.tokens.count }
        let minimum = perKey.values.reduce(0) { $0 + ($1 + scenario.batch - 1) / scenario.batch }
        #expect(sent.count == minimum)

        // A plan after the apply is empty, with or without a refresh.
        let again = differ.diff(desired: scenario.desired, state: state)
        #expect(again.operations.isEmpty, "plan from state after apply: \(again.operations)")
        var refreshed = state
        let later = refreshed.observations(from: Self.refresh(world, scenario, refreshed))
        refreshed.recordObservations(later, seen: TokenSet())
        #expect(differ.diff(desired: scenario.desired, state: refreshed).operations.isEmpty)
    }

    @Test func plansAreDeterministic() {
        let scenario = Self.makeScenario(seed: 42)
        var a = scenario.state
        var b = scenario.state
        a.recordObservations(a.observations(from: Self.refresh(scenario.world, scenario, a)))
        b.recordObservations(b.observations(from: Self.refresh(scenario.world, scenario, b)))
        #expect(
            Differ().diff(desired: scenario.desired, state: a).operations
                == Differ().diff(desired: scenario.desired, state: b).operations)
    }

    @Test(arguments: 0..<500)
    func groupStepsStayWithinLimits(seed: Int) {
        var rng = SeededGenerator(seed: UInt64(seed))
        let universe = (0..<60).map { UInt32($0) }.shuffled(using: &rng)
        let current = TokenSet(universe.prefix(Int.random(in: 1...20, using: &rng)))
        let desired = TokenSet(
            universe.dropFirst(Int.random(in: 0...25, using: &rng)).prefix(Int.random(in: 1...20, using: &rng)))
        let add = desired.subtracting(current)
        let remove = current.subtracting(desired)
        var members = current
        for (kind, ids) in Differ.groupSteps(current: current, add: add, remove: remove) {
            if kind == .groupAdd { members.formUnion(ids) } else { members.subtract(ids) }
            #expect(members.count <= FCMLimits.maxGroupMembers)
            #expect(!members.isEmpty, "the group would be emptied, which deletes it")
        }
        #expect(members == desired)
    }
}
