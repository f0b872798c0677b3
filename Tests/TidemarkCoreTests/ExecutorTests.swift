import Foundation
import Synchronization
import Testing
import TidemarkCore
import TidemarkTesting

@testable import TidemarkEmulator

/// Records finished operations in memory, as the SQLite session does on disk.
final class MemoryRecorder: ApplyRecorder {
    let finished = Mutex<[Int]>([])
    /// Every step recorded: operation index, first token, token count.
    let steps = Mutex<[[Int]]>([])
    let state: Mutex<State>

    init(state: State) { self.state = Mutex(state) }

    func recorded(_ step: OperationStep) async throws {
        if step.finishesOperation { finished.withLock { $0.append(step.index) } }
        steps.withLock { $0.append([step.index, step.from, step.outcomes.count]) }
        state.withLock { _ = $0.recordOutcome(step.part, outcomes: step.outcomes, groupKey: step.groupKey) }
    }
}

@Suite struct ExecutorTests {
    @Test func endToEndAgainstTheEngine() async throws {
        let engine = try FCMEngine()
        let backend = ScriptedBackend(EmbeddedBackend(engine: engine, project: "p"))
        // 2,500 devices: an authoritative topic for all, an additive one for some, one device uninstalled,
        // a foreign subscriber that must go from the authoritative topic, and a group.
        var state = State(lineage: "l", serial: 0)
        let tokens = (0..<2500).map { String(format: "dev%05d:APA91b", $0) }
        for token in tokens { state.intern(token) }
        try await engine.unregister(token: tokens[7])
        _ = try await engine.batchAdd(project: "p", topic: "all", tokens: [tokens[10]])
        _ = try await engine.batchAdd(project: "p", topic: "self-chosen", tokens: [tokens[11]])
        let ids = { (range: Range<Int>) in TokenSet(range.map { UInt32($0) }) }
        let desired = DesiredState(
            topics: [
                DesiredTopic(name: "everyone", mode: .authoritative, members: ids(0..<2500)),
                DesiredTopic(name: "all", mode: .authoritative, members: ids(100..<200)),
                DesiredTopic(name: "some", mode: .additive, members: ids(0..<1500)),
            ], groups: [DesiredGroup(name: "family", members: ids(0..<3))], knownTokens: ids(0..<2500))

        let refresh = try await Refresher(backend: backend, chunkSize: 300).refresh(
            ids(0..<2500), table: state.tokens.table,
            groups: ["family"], at: 5)
        #expect(refresh.dead == TokenSet([7]))
        let observations = state.observations(from: refresh)
        state.recordObservations(observations, seen: ids(0..<2500))
        let result = Differ().diff(desired: desired, state: state)
        // ⌈2499/1000⌉ + ⌈100/1000⌉ + ⌈1499/1000⌉ subscribe calls and one unsubscribe call.
        let topicCalls = result.operations.filter { !$0.kind.isGroup }.count
        #expect(topicCalls == 7)
        state.prepareForApply(with: desired, operations: result.operations)
        let recorder = MemoryRecorder(state: state)
        let report = try await Executor(
            backend: backend, recorder: recorder, parallelism: 4,
            timing: ManualClock().timing
        )
        .run(result.operations)
        #expect(report.failures.isEmpty)
        #expect(backend.calls.filter { $0 == .subscribe || $0 == .unsubscribe }.count == 7)
        let subs = await engine.allSubscriptions(project: "p")
        #expect(subs["everyone"]?.count == 2499)
        #expect(subs["all"] == Set(tokens[100..<200]))
        #expect(subs["some"]?.count == 1499)
        #expect(subs["self-chosen"] == [tokens[11]], "additive: tidemark leaves memberships it did not make")
        #expect(await engine.groupMembers(project: "p", name: "family") == Array(tokens[0..<3]))
        let after = recorder.state.withLock { $0 }
        #expect(Differ().diff(desired: desired, state: after).operations.isEmpty)
    }

    @Test func retriesRetryableTokensOnlyAndReportsTheRest() async throws {
        let engine = try FCMEngine()
        let backend = EmbeddedBackend(engine: engine, project: "p")
        await engine.injectError(.internalError, forToken: "b:APA91b")
        await engine.injectError(.invalidArgument, forToken: "c:APA91b")
        let ops = [PlannedOperation(kind: .subscribe, target: "t", tokens: ["a:APA91b", "b:APA91b", "c:APA91b"])]
        let clock = ManualClock()
        let report = try await Executor(
            backend: backend, recorder: MemoryRecorder(state: State()), timing: clock.timing
        )
        .run(ops)
        #expect(clock.sleeps.count == 1)
        #expect(report.requests == 2)
        #expect(report.failures.map(\.token) == ["c:APA91b"])
        #expect(await engine.subscribers(of: "t", project: "p") == ["a:APA91b", "b:APA91b"])
    }

    @Test func skipsOperationsAlreadyDone() async throws {
        let engine = try FCMEngine()
        let backend = ScriptedBackend(EmbeddedBackend(engine: engine, project: "p"))
        let ops = (0..<5).map { PlannedOperation(kind: .subscribe, target: "t\($0)", tokens: ["a:APA91b"]) }
        let recorder = MemoryRecorder(state: State())
        _ = try await Executor(backend: backend, recorder: recorder).run(ops, done: [0, 2])
        #expect(Set(recorder.finished.withLock { $0 }) == [1, 3, 4])
        #expect(backend.calls.filter { $0 == .subscribe || $0 == .unsubscribe }.count == 3)
    }

    /// A per-token transport journals each operation in steps; a run that dies part-way is resumed from
    /// the first step it did not journal, and no journaled token is sent again.
    @Test func journalsInStepsAndResumesFromTheLastStep() async throws {
        let engine = try FCMEngine()
        let tokens = (0..<5).map { Fixtures.token($0) }
        for token in tokens { try await engine.register(token: token, project: "p") }
        let backend = ScriptedBackend(EmbeddedBackend(engine: engine, project: "p"), journalStep: 2)
        let ops = [PlannedOperation(kind: .subscribe, target: "t", tokens: tokens)]
        let recorder = MemoryRecorder(state: State())
        backend.fail(.subscribe, nth: 2)
        await #expect(throws: ScriptedBackend.Failure.self) {
            _ = try await Executor(backend: backend, recorder: recorder, timing: ManualClock().timing).run(ops)
        }
        #expect(recorder.steps.withLock { $0 } == [[0, 0, 2]], "the first step was journaled, the failed one not")
        #expect(recorder.finished.withLock { $0 }.isEmpty)
        #expect(await engine.subscribers(of: "t", project: "p") == Array(tokens[0..<2]))

        let before = backend.calls.count
        let report = try await Executor(backend: backend, recorder: recorder, timing: ManualClock().timing).run(
            ops, tokensDone: [0: 2])
        #expect(recorder.steps.withLock { Array($0.dropFirst()) } == [[0, 2, 2], [0, 4, 1]])
        #expect(backend.calls.count - before == 2, "tokens 2-3 and 4: nothing journaled is sent again")
        #expect(report.tokensChanged == 3 && report.operationsRun == 1)
        #expect(recorder.finished.withLock { $0 } == [0])
        #expect(await engine.subscribers(of: "t", project: "p") == tokens.sorted())
    }

    @Test func groupThatVanishedIsRecreated() async throws {
        let engine = try FCMEngine()
        let backend = EmbeddedBackend(engine: engine, project: "p")
        let key = try await backend.createGroup(name: "g", tokens: ["a:APA91b"])
        try await backend.removeFromGroup(name: "g", key: key, tokens: ["a:APA91b"])
        let ops = [PlannedOperation(kind: .groupAdd, target: "g", tokens: ["b:APA91b"])]
        _ = try await Executor(backend: backend, recorder: MemoryRecorder(state: State())).run(
            ops, groupKeys: ["g": key])
        #expect(await engine.groupMembers(project: "p", name: "g") == ["b:APA91b"])
    }
}
