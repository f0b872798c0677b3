import Foundation
import Synchronization
import Testing
import TidemarkCore
import TidemarkTesting

@testable import TidemarkEmulator

/// Records finished operations in memory, as the SQLite session does on disk.
final class MemoryRecorder: ApplyRecorder {
    let finished = Mutex<[Int]>([])
    let state: Mutex<State>

    init(state: State) { self.state = Mutex(state) }

    func completed(index: Int, operation: PlannedOperation, outcomes: [TokenOutcome], groupKey: String?) async throws {
        finished.withLock { $0.append(index) }
        state.withLock { $0.record(operation, outcomes: outcomes, groupKey: groupKey, at: 1) }
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
        for token in tokens { state.tokens.intern(token) }
        state.growToTable()
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
            ids(0..<2500), table: state.tokens,
            groups: ["family"], at: 5)
        #expect(refresh.dead == TokenSet([7]))
        let observations = state.observations(from: refresh)
        state.apply(observations, seen: ids(0..<2500))
        let result = Differ().diff(desired: desired, state: state)
        // ⌈2499/1000⌉ + ⌈100/1000⌉ + ⌈1499/1000⌉ subscribe calls and one unsubscribe call.
        let topicCalls = result.operations.filter { !$0.kind.isGroup }.count
        #expect(topicCalls == 7)
        state.reconcileBookkeeping(with: desired, operations: result.operations)
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
