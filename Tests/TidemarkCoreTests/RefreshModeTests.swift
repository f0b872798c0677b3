import Foundation
import Testing
import TidemarkCore
import TidemarkEmulator
import TidemarkTesting

/// Refresh modes (issue 16): which registrations touched and sample read, how the sweep moves over
/// successive applies, and how verdicts name what they covered.
@Suite struct RefreshModeTests {
    /// A state of `n` tokens, none read yet.
    static func state(_ n: Int) -> State {
        var state = State(lineage: "l", serial: 1)
        for i in 0..<n { _ = state.intern(Fixtures.token(i)) }
        return state
    }

    @Test func budgetsParseAndScale() throws {
        #expect(try RefreshBudget(parsing: "5%") == .share(0.05))
        #expect(try RefreshBudget(parsing: "10000") == .reads(10_000))
        for bad in ["", "abc", "0%", "101%", "-3", "1.5"] {
            #expect(throws: RefreshPolicyError.self, "'\(bad)'") { try RefreshBudget(parsing: bad) }
        }
        #expect(RefreshBudget.default.reads(fleet: 1_000_000) == 20_000)
        #expect(RefreshBudget.default.reads(fleet: 10_000) == 1_000, "a share reads at least 1,000")
        #expect(RefreshBudget.default.reads(fleet: 400) == 400, "and never more than the fleet")
        #expect(RefreshBudget.reads(50).reads(fleet: 10) == 50)
    }

    @Test func touchedReadsOnlyWhatThePlanChangesAndWhatIsTooOld() {
        var state = Self.state(10)
        for i in 0..<10 { state.setSeen(UInt32(i), at: 1_000) }
        state.setSeen(7, at: 100)
        let touched = TokenSet([2, 3])
        let plain = state.refreshSelection(RefreshPolicy(mode: .touched), touched: touched, now: 2_000)
        #expect(plain.ids == touched)
        #expect(plain.coverage.read == 2 && plain.coverage.fleet == 10 && plain.coverage.touched == 2)
        #expect(plain.coverage.oldestUnread == 100 && plain.coverage.neverRead == 0)
        let aged = state.refreshSelection(RefreshPolicy(mode: .touched, maxAge: 1_500), touched: touched, now: 2_000)
        #expect(aged.ids == TokenSet([2, 3, 7]), "token 7 was read longer ago than the maximum age")
        #expect(aged.coverage.stale == 1 && aged.coverage.oldestUnread == 1_000)
    }

    @Test func deadTokensAreNotPartOfTheFleet() {
        var state = Self.state(10)
        state.setDead(TokenSet([0, 1]))
        let run = state.refreshSelection(RefreshPolicy(mode: .sample, budget: .reads(100)), touched: TokenSet(), now: 5)
        #expect(run.coverage.fleet == 8 && run.ids == TokenSet(2..<10))
        #expect(run.coverage.readWholeFleet)
    }

    /// Applies that record what they read sweep the whole fleet in the runs the budget promises, each
    /// slice new, and spread over the fleet rather than in inventory order.
    @Test func theSweepCoversTheFleetInTheRunsItPromises() {
        var state = Self.state(1_000)
        let policy = RefreshPolicy(mode: .sample, budget: .reads(100))
        let touched = TokenSet([0, 1, 2])
        let first = state.refreshSelection(policy, touched: touched, now: 10, salt: 42)
        #expect(first.coverage.runsToCompleteSweep == 9, "897 never read at 100 a run")
        #expect(first.sampled.count == 100 && first.sampled.intersection(touched).isEmpty)
        #expect(first.sampled.ids.max()! > 500, "the slice is spread over the fleet")
        var readSoFar = TokenSet()
        var runs = 0
        var now: Int64 = 10
        while true {
            let run = state.refreshSelection(policy, touched: touched, now: now, salt: 42)
            if run.coverage.neverRead + run.sampled.count >= 1_000 - readSoFar.count, 1_000 - readSoFar.count >= 100 {
                #expect(
                    run.sampled.intersection(readSoFar).isEmpty, "run \(runs + 1) reads only registrations never read")
            }
            for id in run.ids { state.setSeen(id, at: now) }
            readSoFar.formUnion(run.ids)
            runs += 1
            now += 10
            if run.coverage.neverRead == 0 { break }
            #expect(runs <= 10)
        }
        #expect(readSoFar.count == 1_000 && runs == 10, "\(runs) runs")
        // Once swept, the oldest read goes first again.
        let again = state.refreshSelection(policy, touched: TokenSet(), now: now, salt: 42)
        #expect(again.coverage.neverRead == 0 && again.coverage.oldestUnread != nil)
        #expect(again.sampled.allSatisfy { state.seenAt[Int($0)] <= 20 })
    }

    @Test func verdictsSayHowFarTheyLooked() {
        let renderer = PlanRenderer()
        var plan = Plan(
            tidemarkVersion: "t", createdAt: Date(timeIntervalSince1970: 0), lineage: "l", serial: 1,
            manifestsDigest: "d", backend: Fixtures.backend, refreshed: true, operations: [], topics: [], groups: [],
            diagnostics: [], observations: Observations())
        plan.coverage = RefreshCoverage(
            mode: .sample, fleet: 200_000, read: 21_400, touched: 400, sampled: 21_000, budget: 21_000,
            neverRead: 100_000, oldestUnread: 1_000_000 - 3 * 86_400, at: 1_000_000)
        let partial = renderer.verdict(plan)
        #expect(partial.hasPrefix("No changes among the 21,400 registrations read, 11% of the fleet"), "\(partial)")
        #expect(partial.contains("100,000 have never been read") && partial.contains("about 5 more applies"))
        #expect(!partial.contains("FCM matches"), "a sample never claims the whole fleet")
        plan.coverage?.neverRead = 0
        let swept = renderer.verdict(plan)
        #expect(swept.contains("FCM matches the manifests among the 21,400 registrations read"), "\(swept)")
        #expect(swept.contains("the rest were last read at most 3 days ago, by the completed sweep"))
        plan.coverage = RefreshCoverage(mode: .all, fleet: 10, read: 10, at: 0)
        #expect(renderer.verdict(plan) == "No changes. FCM matches the manifests.")
        #expect(
            renderer.render(plan).contains("Computed after reading 10 of 10 registrations from FCM (--refresh all)"))
    }

    @Test func driftEstimatesCarryBounds() {
        let none = DriftEstimate(drifted: 0, sampled: 1_000, unread: 99_000)
        #expect(none.expected == 0 && none.low == 0 && none.high > 0 && none.high < 500, "\(none)")
        let some = DriftEstimate(drifted: 10, sampled: 1_000, unread: 99_000)
        #expect(some.expected == 990 && some.low < 990 && some.high > 990, "\(some)")
        #expect(some.low > 400 && some.high < 1_900, "\(some)")
    }

    /// A project of 60 devices in one topic; the sweep reads 10 a run.
    enum Fleet {
        static func make() throws -> WorkflowTests.Project {
            let rows = (0..<60).map { "d\($0),\(Fixtures.token($0)),all" }.joined(separator: "\n")
            return try WorkflowTests.Project(files: [
                "inv.yaml": "inventory:\n  files: [inventory.csv]\n",
                "inventory.csv": "device_id,token,fleet\n\(rows)\n",
                "topics.yaml":
                    "topics:\n  - name: news\n    mode: authoritative\n    members: [{selector: {fleet: all}}]\n",
            ])
        }

        static let sample = RefreshPolicy(mode: .sample, budget: .reads(10))
    }

    /// Drift seeded on devices no plan touches is found by the sweep within the runs it promises, each
    /// run saying what share it covered; plan and drift never move the sweep, apply does.
    @Test func driftOutsideTheTouchedSetIsFoundWithinTheSweep() async throws {
        let fleet = try Fleet.make()
        _ = try await ApplyWorkflow(fleet.parts).run(ApplyRequest(planning: PlanRequest(policy: .all)))
        fleet.clock.advance(.seconds(60))
        // Two devices unsubscribe on their own; nothing in the manifests changed, so nothing is touched.
        let dropped = [Fixtures.token(17), Fixtures.token(43)]
        _ = try await fleet.engine.batchRemove(project: "tidemark-test", topic: "news", tokens: dropped)
        let promised = 6  // 60 registrations at 10 a run
        var found: [String: Int] = [:]
        for run in 1...promised {
            let drift = try await DriftWorkflow(fleet.parts).run(Fleet.sample)
            #expect(drift.coverage?.read == 10 && drift.coverage?.fleet == 60, "run \(run) says what it covered")
            #expect(drift.estimate?.unread == 50 && drift.estimate?.sampled == 10)
            let again = try await DriftWorkflow(fleet.parts).run(Fleet.sample)
            #expect(again.items == drift.items, "drift does not move the sweep")
            for token in drift.items.compactMap(\.token) where found[token] == nil { found[token] = run }
            // The scheduled apply reads the same slice, corrects what it found and moves the sweep on.
            _ = try await ApplyWorkflow(fleet.parts).run(ApplyRequest(planning: PlanRequest(policy: Fleet.sample)))
            fleet.clock.advance(.seconds(60))
        }
        #expect(Set(found.keys) == Set(dropped), "found \(found) within \(promised) runs")
        #expect(await fleet.engine.subscribers(of: "news", project: "tidemark-test").count == 60, "and corrected")
        let plan = try await PlanWorkflow(fleet.parts).run(PlanRequest(policy: Fleet.sample))
        #expect(!plan.plan.hasChanges)
        #expect(plan.plan.coverage?.neverRead == 0, "the sweep completed")
        #expect(PlanRenderer().verdict(plan.plan).contains("by the completed sweep"))
    }

    @Test func applyRecordsOnlyWhatItReadAndRefreshOnlyChangesNothing() async throws {
        let fleet = try Fleet.make()
        _ = try await ApplyWorkflow(fleet.parts).run(ApplyRequest(planning: PlanRequest(policy: .all)))
        let before = try #require(try await fleet.store.load())
        #expect(before.seenAt.allSatisfy { $0 > 0 })
        fleet.clock.advance(.seconds(3_600))
        _ = try await fleet.engine.batchRemove(project: "tidemark-test", topic: "news", tokens: [Fixtures.token(5)])
        var request = ApplyRequest(planning: PlanRequest(policy: RefreshPolicy(mode: .sample, budget: .reads(60))))
        request.refreshOnly = true
        let outcome = try await ApplyWorkflow(fleet.parts).run(request)
        guard case .refreshed(let record) = outcome.result else {
            Issue.record("expected a refresh, got \(outcome.result)")
            return
        }
        #expect(record.coverage.read == 60 && record.serial == before.serial + 1)
        #expect(record.observations.topics.first?.unsubscribed == [Fixtures.token(5)])
        #expect(await fleet.engine.subscribers(of: "news", project: "tidemark-test").count == 59, "FCM untouched")
        let after = try #require(try await fleet.store.load())
        let id = Int(after.tokens.id(Fixtures.token(5))!)
        #expect(!after.topics["news"]!.observed.contains(UInt32(id)), "the observation is recorded")
        #expect(after.seenAt.allSatisfy { $0 > before.seenAt[0] }, "every registration read is recorded as read")
    }

    /// A saved plan applied soon after it was made reads again only the registrations whose changes
    /// state and the manifests do not call for by themselves (drift the plan's refresh found, a new
    /// token it found dead); an older one reads every registration it changes again.
    @Test func aRecentSavedPlanReadsAgainOnlyWhatStateDoesNotExplain() async throws {
        var fleet = try Fleet.make()
        _ = try await ApplyWorkflow(fleet.parts).run(ApplyRequest(planning: PlanRequest(policy: .all)))
        fleet.clock.advance(.seconds(60))
        // Devices 3 and 4 get new tokens (4's is already dead); device 30 unsubscribes on its own.
        let fresh = ["new-\(Fixtures.token(3))", "new-\(Fixtures.token(4))"]
        fleet.files["inventory.csv"] = fleet.files["inventory.csv"]!
            .replacingOccurrences(of: "d3,\(Fixtures.token(3)),", with: "d3,\(fresh[0]),")
            .replacingOccurrences(of: "d4,\(Fixtures.token(4)),", with: "d4,\(fresh[1]),")
        try await fleet.engine.unregister(token: fresh[1])
        _ = try await fleet.engine.batchRemove(project: "tidemark-test", topic: "news", tokens: [Fixtures.token(30)])
        let policy = RefreshPolicy(mode: .sample, budget: .reads(100))
        let plan = try await PlanWorkflow(fleet.parts).run(PlanRequest(policy: policy))
        let changed = Set(plan.plan.operations.flatMap(\.tokens))
        #expect(
            changed == [fresh[0], Fixtures.token(3), Fixtures.token(4), Fixtures.token(30)],
            "the new live token and the drifted one are subscribed, the replaced ones unsubscribed: \(changed)")
        fleet.clock.advance(.seconds(30))
        let before = fleet.backend.tokensRead.count
        var request = ApplyRequest(savedPlan: (plan.plan, "plan.json"), planning: PlanRequest(policy: policy))
        request.rereadAfter = 900
        let outcome = try await ApplyWorkflow(fleet.parts).run(request)
        guard case .applied(let summary) = outcome.result else {
            Issue.record("\(outcome.result)")
            return
        }
        #expect(summary.subscribed == 2 && summary.unsubscribed == 2)
        let reread = Array(fleet.backend.tokensRead[before...])
        #expect(
            Set(reread) == [Fixtures.token(30), fresh[1]] && reread.count == 2,
            "only the drifted registration and the dead token the plan left out are read again: \(reread)")
        #expect(
            fleet.output.events.contains {
                if case .savedPlanChecked(4, 2, 30) = $0 { true } else { false }
            })
        let subscribers = Set(await fleet.engine.subscribers(of: "news", project: "tidemark-test"))
        let declared = Set((0..<60).filter { $0 != 3 && $0 != 4 }.map { Fixtures.token($0) } + [fresh[0]])
        #expect(subscribers == declared, "FCM matches the manifests, the dead token aside")
        let state = try #require(try await fleet.store.load())
        #expect(state.dead.contains(try #require(state.tokens.id(fresh[1]))), "what the read found dead is recorded")

        // An older plan has every registration it changes read again.
        fleet.files["inventory.csv"] = fleet.files["inventory.csv"]!
            .replacingOccurrences(of: "d5,\(Fixtures.token(5)),", with: "d5,new-\(Fixtures.token(5)),")
        let second = try await PlanWorkflow(fleet.parts).run(PlanRequest(policy: policy))
        fleet.clock.advance(.seconds(901))
        let mark = fleet.backend.tokensRead.count
        var late = ApplyRequest(savedPlan: (second.plan, "plan.json"), planning: PlanRequest(policy: policy))
        late.rereadAfter = 900
        _ = try await ApplyWorkflow(fleet.parts).run(late)
        #expect(
            Set(fleet.backend.tokensRead[mark...]) == [Fixtures.token(5), "new-\(Fixtures.token(5))"],
            "a plan older than the window is read again in full")
        #expect(
            await fleet.engine.subscribers(of: "news", project: "tidemark-test").contains("new-\(Fixtures.token(5))"))
    }

    /// A sample's slice is read while the manifests load, before the plan knows what it touches: each
    /// registration is still read once, the coverage counts both reads, and a failed read stops the plan.
    @Test func theSlicesReadStartsWithStateAndEachRegistrationIsReadOnce() async throws {
        var fleet = try Fleet.make()
        _ = try await ApplyWorkflow(fleet.parts).run(ApplyRequest(planning: PlanRequest(policy: .all)))
        fleet.clock.advance(.seconds(60))
        fleet.files["inventory.csv"] = fleet.files["inventory.csv"]!
            .replacingOccurrences(of: "d8,\(Fixtures.token(8)),", with: "d8,new-\(Fixtures.token(8)),")
        // One device drifted; the sweep will find it when its slice reaches it.
        _ = try await fleet.engine.batchRemove(project: "tidemark-test", topic: "news", tokens: [Fixtures.token(20)])
        let before = fleet.backend.tokensRead.count
        let plan = try await PlanWorkflow(fleet.parts).run(PlanRequest(policy: Fleet.sample))
        let read = Array(fleet.backend.tokensRead[before...])
        #expect(read.count == Set(read).count, "no registration read twice: \(read.count) reads")
        let coverage = try #require(plan.plan.coverage)
        #expect(coverage.touched == 2, "the replaced token and its successor")
        #expect(Set(read).isSuperset(of: [Fixtures.token(8), "new-\(Fixtures.token(8))"]))
        #expect(coverage.read == read.count && coverage.read == 2 + coverage.sampled, "\(coverage)")
        #expect(coverage.sampled == 9 || coverage.sampled == 10, "the slice of 10, less the touched token it held")
        #expect(read.last == "new-\(Fixtures.token(8))", "the slice is read first, then what it did not hold")
        #expect(coverage.fleet == 61 && coverage.budget == 10)
        let sampledDrift = Set(read).contains(Fixtures.token(20))
        #expect(plan.plan.operations.flatMap(\.tokens).contains(Fixtures.token(20)) == sampledDrift)

        // A read that fails fails the plan, whichever read it was.
        fleet.backend.fail(.refresh)
        await #expect(throws: (any Error).self) {
            _ = try await PlanWorkflow(fleet.parts).run(PlanRequest(policy: Fleet.sample))
        }
    }
}
