import Foundation
import Synchronization
import Testing
import TidemarkEmulator
import TidemarkTesting

@testable import TidemarkCore

/// What apply concludes when FCM answers what it should not, or when an apply was cut off while FCM
/// was acting on its requests: no fleet written off, no membership lost.
@Suite struct FaultTrustTests {
    typealias Project = WorkflowTests.Project

    static func inventory(_ count: Int) -> String {
        "device_id,token,team\n"
            + (0..<count).map { "d\($0),\(Fixtures.token($0)),t\($0 % 2)" }
            .joined(separator: "\n") + "\n"
    }

    /// Plans and applies as the CLI does by default: a sample refresh (a recent saved plan then reads
    /// only what state does not explain).
    static var sampled: PlanRequest {
        var request = PlanRequest()
        request.refresh = .sample
        return request
    }

    static let launch = "topics:\n  - name: launch\n    members: [{selector: {team: [t0, t1]}}]\n"

    /// 100 devices applied, then a saved plan (recent, so its apply reads nothing first) subscribing
    /// all of them to a new topic, after which the engine forgets the first `dead` of them.
    static func recentLaunchPlan(unregistering dead: Int) async throws -> (Project, ApplyRequest) {
        var project = try Project()
        project.files["inventory.csv"] = inventory(100)
        _ = try await project.apply()
        project.files["more.yaml"] = launch
        let plan = try await project.plan(sampled).plan
        #expect(plan.operations.map(\.kind) == [.subscribe] && plan.operations[0].tokens.count == 100)
        for i in 0..<dead { try await project.engine.unregister(token: Fixtures.token(i)) }
        var request = project.saved(plan)
        request.rereadAfter = 900
        request.planning.refresh = .sample
        return (project, request)
    }

    /// A recent saved plan reads nothing before it runs: FCM's own answers to the apply are what
    /// would call the fleet dead, and they are held to the same guard as a refresh.
    @Test func aRecentSavedPlanAgainstAnFCMThatForgotTheFleetCallsNoTokenDead() async throws {
        // The wrong FCM: every registration of the fleet is unknown to it.
        let (project, request) = try await Self.recentLaunchPlan(unregistering: 100)
        await #expect { try await project.apply(request) } throws: { error in
            guard
                let message = (error as? WorkflowError).flatMap({ $0.reason == "too_many_dead" ? $0.description : nil })
            else { return false }
            return message.contains("100 of the 100 inventory registrations this apply changed")
                && message.contains("no token was recorded as dead") && message.contains("tidemark-test")
        }
        let state = try #require(try await project.store.load())
        #expect(state.dead.isEmpty, "no token is recorded as dead")
        #expect(state.topics["everyone"]?.managed.count == 100, "the fleet is still managed")
    }

    /// Below the guard, the tokens FCM answered as unregistered are recorded dead when the apply
    /// finishes, and reported for the on_dead hooks.
    @Test func aFewDeadAnswersAreRecordedWhenTheApplyFinishes() async throws {
        let (project, request) = try await Self.recentLaunchPlan(unregistering: 3)
        let outcome = try await project.apply(request)
        guard case .applied(let summary) = outcome.result else {
            Issue.record("\(outcome.result)")
            return
        }
        #expect(summary.subscribed == 97)
        let state = try #require(try await project.store.load())
        #expect(state.dead.count == 3)
        #expect(Set(outcome.dead.map(\.token)) == Set((0..<3).map { Fixtures.token($0) }))
        #expect(state.topics["everyone"]?.managed.count == 97, "dead tokens leave every topic")
    }

    /// The same answers mid-apply stop it before the next step is journaled; `--accept-dead` believes them.
    @Test func theGuardCanBeTurnedOffForARealMassUninstall() async throws {
        let (project, request) = try await Self.recentLaunchPlan(unregistering: 100)
        var parts = project.parts
        parts.deadTokenGuard = nil
        _ = try await ApplyWorkflow(parts).run(request)
        #expect(try await project.store.load()?.dead.count == 100)
    }

    /// An apply narrowing a topic is cut off after FCM carried out its unsubscribe; the change is
    /// reverted. The abandoned apply's in-flight registrations are read, so the next plan puts back
    /// what FCM lost rather than taking tidemark's own removal for the devices' opt-out.
    @Test(arguments: ["authoritative", "additive"])
    func aKilledUnsubscribeThenARevertLosesNothing(_ mode: String) async throws {
        let topics = """
            topics:
              - name: everyone
                mode: \(mode)
                opt_outs: respect
                members: [{selector: {team: [t0, t1]}}]
            """
        var project = try Project(topics: topics)
        project.files["inventory.csv"] = Self.inventory(40)
        _ = try await project.apply()
        let subscribers = { await project.engine.subscribers(of: "everyone", project: "tidemark-test").count }
        #expect(await subscribers() == 40)
        project.files["topics.yaml"] = topics.replacingOccurrences(of: "team: [t0, t1]", with: "team: t0")
        project.backend.failAfter(.unsubscribe)
        await #expect(throws: ScriptedBackend.Failure.self) { try await project.apply() }
        #expect(await subscribers() == 20, "FCM carried out the unsubscribe; its answer was lost")
        #expect(try await project.store.unfinishedApply() != nil)
        project.files["topics.yaml"] = topics
        _ = try await project.apply()
        #expect(try await project.store.applies(limit: 5).map(\.status).contains(.abandoned))
        #expect(await subscribers() == 40, "every membership is back")
        let state = try #require(try await project.store.load())
        #expect(state.topics["everyone"]?.optedOut.isEmpty == true, "tidemark's own removal is not an opt-out")
        #expect(state.topics["everyone"]?.observed.count == 40)
        #expect(!(try await project.plan().plan.hasChanges))
    }

    /// Cut off before FCM acted, then the manifests changed again: the read finds the memberships still
    /// there, and the next plan removes what the manifests no longer declare.
    @Test func aKilledUnsubscribeThatNeverReachedFCMIsStillCarriedOut() async throws {
        var project = try Project()
        _ = try await project.apply()
        let original = project.files["topics.yaml"]!
        let narrowed = original.replacingOccurrences(of: "team: [t0, t1]", with: "team: t0")
        project.files["topics.yaml"] = narrowed
        project.backend.fail(.unsubscribe)
        await #expect(throws: ScriptedBackend.Failure.self) { try await project.apply() }
        #expect(await project.engine.subscribers(of: "everyone", project: "tidemark-test").count == 6)
        // Another change lands before the next apply: the interrupted one is abandoned, not resumed.
        project.files["more.yaml"] = "topics:\n  - name: launch\n    members: [{devices: [d0]}]\n"
        _ = try await project.apply()
        #expect(try await project.store.applies(limit: 5).map(\.status).contains(.abandoned))
        #expect(await project.engine.subscribers(of: "everyone", project: "tidemark-test").count == 3)
        #expect(!(try await project.plan().plan.hasChanges))
    }

    /// The in-flight registrations are those of the phase the apply stopped in, from where each
    /// operation's journal got to.
    @Test func inFlightIsThePhaseTheApplyStoppedIn() {
        let plan = Plan(
            tidemarkVersion: "test", createdAt: Date(timeIntervalSince1970: 0), lineage: "l", serial: 1,
            manifestsDigest: "", backend: BackendIdentity(kind: .embedded, project: "p"), refreshed: true,
            operations: [
                PlannedOperation(kind: .unsubscribe, target: "a", tokens: ["t1", "t2", "t3"]),
                PlannedOperation(kind: .unsubscribe, target: "b", tokens: ["t4"]),
                PlannedOperation(kind: .subscribe, target: "c", tokens: ["t5"]),
            ], topics: [], groups: [], diagnostics: [], observations: Observations())
        let progress = [0: OperationProgress(applyID: "x", index: 0, tokensDone: 2, ok: 2, failed: 0)]
        let stopped = UnfinishedApply(id: "x", startedAt: Date(), plan: plan, done: [1], progress: progress)
        #expect(ApplyWorkflow.inFlight(stopped) == ["t3"])
        let later = UnfinishedApply(id: "x", startedAt: Date(), plan: plan, done: [0, 1])
        #expect(ApplyWorkflow.inFlight(later) == ["t5"])
    }

    /// A plan file's strings reach a reviewer's terminal only with their control characters escaped.
    @Test func renderersEscapeControlCharactersFromFiles() {
        let hostile = "news\u{1B}]0;pwned\u{07}\u{1B}[2J\u{202E}txt.exe"
        let plan = Plan(
            tidemarkVersion: "test", createdAt: Date(timeIntervalSince1970: 0), lineage: "l", serial: 1,
            manifestsDigest: "", backend: BackendIdentity(kind: .embedded, project: "p"), refreshed: true,
            operations: [PlannedOperation(kind: .subscribe, target: hostile, tokens: ["tok-a", "tok-b"])],
            topics: [
                TopicChange(
                    topic: hostile, mode: .additive, subscribe: 2, unsubscribe: 0, removedFromManifests: false,
                    notes: [])
            ],
            groups: [], diagnostics: [], observations: Observations())
        let renderings = [PlanRenderer(showTokens: true).render(plan)] + MarkdownPlanRenderer().render(plan)
        for text in renderings {
            #expect(!text.unicodeScalars.contains { $0.value == 0x1B || $0.value == 0x07 || $0.value == 0x202E })
            #expect(text.contains("news\\u{1B}]0;pwned\\u{7}\\u{1B}[2J\\u{202E}txt.exe"))
        }
        #expect("plain\ttext\n".escapingControlCharacters == "plain\ttext\n")
    }

    /// A lease that stops being this run's after `held` checks (a pause past its expiry, a broken lease).
    final class LosableLease: StateLease {
        let checks = Mutex(0)
        let held: Int
        init(held: Int) { self.held = held }
        func release() async {}
        func ensureHeld() async throws {
            let n = checks.withLock {
                $0 += 1
                return $0
            }
            if n > held {
                throw StateStoreError(.leaseLost, path: "test state", "this run no longer holds the lease")
            }
        }
    }

    /// A run that lost its lease while it applies: every call after that is refused before it is sent,
    /// and the error says why.
    @Test func aRunThatLostItsLeaseSendsNothingMore() async throws {
        var project = try Project()
        project.files["inventory.csv"] = Self.inventory(40)
        let parts = project.parts
        let gate = LeaseGate()
        let plan = try await PlanWorkflow(parts).run(Self.sampled)
        let session = try await ApplySession.begin(
            plan: plan.plan, desired: plan.loaded.desired, store: project.store, state: plan.state,
            timing: project.clock.timing)
        // One call per token (a journal step of one): the loss after the first call leaves many unsent.
        let backend = ScriptedBackend(project.backend.base, journalStep: 1)
        var executor = Executor(backend: backend, recorder: session, parallelism: 1, timing: project.clock.timing)
        executor.gate = gate
        gate.testHold(LosableLease(held: 1))
        await #expect { _ = try await executor.run(plan.plan.operations) } throws: {
            ($0 as? StateStoreError)?.code == .leaseLost
        }
        #expect(backend.calls.count == 1, "only the call made while the lease was held was sent")
        #expect(plan.plan.operations.reduce(0) { $0 + $1.tokens.count } > 40)
    }

    final class WatchedLease: StateLease {
        let activity: LeaseActivity?
        init(_ activity: LeaseActivity) { self.activity = activity }
        func release() async {}
    }

    /// The watchdog's signal: an apply's requests move the work under its lease, and the wait at its
    /// confirmation prompt is a wait for a person, never taken for stuck work however long it lasts.
    @Test func requestsMoveTheLeaseAndAPromptIsNotStuckWork() async throws {
        var project = try Project()
        project.files["inventory.csv"] = Self.inventory(40)
        var parts = project.parts
        let gate = LeaseGate()
        // Nothing has moved for an hour when the apply starts.
        let activity = LeaseActivity(now: .now - .seconds(3600))
        gate.testHold(WatchedLease(activity))
        parts.leaseGate = gate
        let whileAsked = Mutex<[Duration?]>([])
        _ = try await ApplyWorkflow(parts).run(
            ApplyRequest(
                planning: Self.sampled,
                approve: { _ in
                    whileAsked.withLock { $0.append(activity.idle()) }
                    return .approved
                }))
        #expect(whileAsked.withLock { $0 } == [nil], "asked once, and not idle while asked")
        #expect(try #require(activity.idle()) < .seconds(600), "the apply's requests moved it")
        #expect(LeaseActivity(now: .now - .seconds(5)).idle()! >= .seconds(5))
    }
}
