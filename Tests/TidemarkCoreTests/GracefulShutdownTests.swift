import Logging
import ServiceLifecycle
import Synchronization
import Testing
import TidemarkTesting

@testable import TidemarkCore

/// A graceful shutdown (SIGTERM through swift-service-lifecycle, a replica told to stop) cancels an
/// apply wherever it is; the journal's writer, beside it in the same task group, still records every
/// step that finished, and the next apply resumes from there.
@Suite struct GracefulShutdownTests {
    /// Answers like `base` until its `stallAt`-th subscribe call, which waits, as a request in flight
    /// does, until it is cancelled.
    final class StallingBackend: Backend {
        let base: any Backend
        let stallAt: Int
        let calls = Mutex(0)

        init(_ base: any Backend, stallAt: Int) {
            self.base = base
            self.stallAt = stallAt
        }

        var identity: BackendIdentity { base.identity }
        var journalStep: Int? { 1 }

        func refresh(_ tokens: [String]) async throws -> [RegistrationStatus] { try await base.refresh(tokens) }
        func subscribe(topic: String, tokens: [String]) async throws -> [TokenOutcome] {
            let call = calls.withLock {
                $0 += 1
                return $0
            }
            if call == stallAt { try await Task.sleep(for: .seconds(3600)) }
            return try await base.subscribe(topic: topic, tokens: tokens)
        }
        func unsubscribe(topic: String, tokens: [String]) async throws -> [TokenOutcome] {
            try await base.unsubscribe(topic: topic, tokens: tokens)
        }
        func groupKey(name: String) async throws -> String? { try await base.groupKey(name: name) }
        func createGroup(name: String, tokens: [String]) async throws -> String {
            try await base.createGroup(name: name, tokens: tokens)
        }
        func addToGroup(name: String, key: String, tokens: [String]) async throws -> String {
            try await base.addToGroup(name: name, key: key, tokens: tokens)
        }
        func removeFromGroup(name: String, key: String, tokens: [String]) async throws {
            try await base.removeFromGroup(name: name, key: key, tokens: tokens)
        }
        func exportGroup(name: String, key: String) async throws -> [String]? {
            try await base.exportGroup(name: name, key: key)
        }
    }

    /// A store whose saves fail in a cancelled task, as a driver that heeds cancellation fails (GRDB's
    /// async access, a query cancelled on the server): only a writer that is not cancelled journals.
    /// `during` runs inside each save, before it commits.
    struct HeedingStore: StateStore {
        let base: InMemoryStateStore
        let during: @Sendable (StateWrite) async -> Void
        var location: String { base.location }
        func load() async throws -> State? { try await base.load() }
        func save(_ state: inout State, _ write: StateWrite, at now: Int64) async throws -> Int {
            await during(write)
            try Task.checkCancellation()
            return try await base.save(&state, write, at: now)
        }
        func unfinishedApply() async throws -> UnfinishedApply? { try await base.unfinishedApply() }
        func applies(limit: Int) async throws -> [ApplyRecord] { try await base.applies(limit: limit) }
        func lock(_ holder: LockHolder) async throws -> any StateLease { try await base.lock(holder) }
        func lockHolder() async throws -> LockHolder? { try await base.lockHolder() }
    }

    /// Runs `body` as the one service of a service group, as `tidemark apply` runs under SIGTERM.
    struct OneShot: Service {
        let body: @Sendable () async -> Void
        func run() async { await body() }
    }

    @Test func theStepsThatFinishedAreJournaledAndTheNextApplyResumes() async throws {
        let project = try WorkflowTests.Project()
        // One token per step: the third request waits until it is cancelled, and the shutdown comes
        // while the second step is being saved.
        let stalling = StallingBackend(project.backend, stallAt: 3)
        let shutdown = Mutex<(@Sendable () async -> Void)?>(nil)
        var parts = project.parts
        parts.backend = stalling
        parts.store = HeedingStore(base: project.store) { write in
            guard write.operationProgress.contains(where: { $0.tokensDone == 2 }) else { return }
            await shutdown.withLock { $0 }?()
            try? await Task.sleep(for: .milliseconds(50))
        }
        parts.parallelism = 1
        let outcome = Mutex<Result<ApplyOutcome, any Error>?>(nil)
        let apply = OneShot { [parts] in
            let result: Result<ApplyOutcome, any Error>
            do { result = .success(try await ApplyWorkflow(parts).run(ApplyRequest())) } catch {
                result = .failure(error)
            }
            outcome.withLock { $0 = result }
        }
        let group = ServiceGroup(
            configuration: ServiceGroupConfiguration(
                services: [.init(service: apply, successTerminationBehavior: .gracefullyShutdownGroup)],
                logger: .init(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })))
        shutdown.withLock { $0 = { await group.triggerGracefulShutdown() } }
        try await group.run()

        let result = try #require(outcome.withLock { $0 })
        #expect(throws: CancellationError.self) { try result.get() }
        let unfinished = try #require(try await project.store.unfinishedApply(), "the apply stays to be resumed")
        #expect(unfinished.done.isEmpty)
        #expect(
            unfinished.tokensDone.values.reduce(0, +) == 2,
            "both steps answered before the request in flight are journaled: \(unfinished.tokensDone)")
        // The next apply finishes what is left, and then nothing is.
        let resumed = try await project.apply()
        #expect(resumed.resumed != nil)
        #expect(try await project.store.unfinishedApply() == nil)
        #expect(try await project.plan().plan.hasChanges == false)
    }

    /// The writer runs what it is given in order, drains it before `run` returns, and keeps going while
    /// the body fails.
    @Test func theWriterDrainsItsQueueBeforeItStops() async throws {
        let writer = JournalWriter()
        let ran = Mutex<[Int]>([])
        await #expect(throws: CancellationError.self) {
            try await writer.run {
                for i in 0..<5 {
                    #expect(writer.schedule { ran.withLock { $0.append(i) } })
                }
                throw CancellationError()
            }
        }
        #expect(ran.withLock { $0 } == [0, 1, 2, 3, 4])
        #expect(!writer.schedule {}, "a stopped writer takes nothing more")
    }
}
