import Foundation
import Synchronization
import Testing
import TidemarkCore

/// `TimeLimit.race`: the caller gets the work's answer, or nil at the limit even when the work ignores
/// cancellation; what is given up on is cancelled and disposed of; the caller's cancellation ends it at once.
@Suite struct TimeLimitTests {
    /// Work that never ends and never looks at cancellation (a continuation nobody resumes until the test says).
    final class Stuck: Sendable {
        private let waiting = Mutex<CheckedContinuation<Int, Never>?>(nil)
        func wait() async -> Int {
            await withCheckedContinuation { continuation in waiting.withLock { $0 = continuation } }
        }
        func release(_ value: Int) -> Bool {
            guard let continuation = waiting.withLock({ $0.take() }) else { return false }
            continuation.resume(returning: value)
            return true
        }
    }

    /// Waits until `condition` holds, or 120 s (the whole suite's blocking tests can starve this
    /// process's tasks for tens of seconds, so no bound here is tight).
    static func eventually(_ condition: () -> Bool) async throws -> Bool {
        let end = ContinuousClock.now + .seconds(120)
        while !condition() {
            if ContinuousClock.now > end { return false }
            try await Task.sleep(for: .milliseconds(10))
        }
        return true
    }

    @Test func theWorksAnswerWhenItComesFirst() async throws {
        let value = try await TimeLimit.race(.seconds(30)) { 42 }
        #expect(value == 42)
        await #expect(throws: URLError.self) {
            _ = try await TimeLimit.race(.seconds(30)) { () async throws -> Int in throw URLError(.badURL) }
        }
    }

    @Test func nilAtTheLimitEvenWhenTheWorkIgnoresCancellation() async throws {
        let stuck = Stuck()
        let disposed = Mutex<[Int]>([])
        // The work never ends until released below: that the race returns at all is the point.
        let value = try await TimeLimit.race(.milliseconds(200)) {
            await stuck.wait()
        } late: { value in
            disposed.withLock { $0.append(value) }
        }
        #expect(value == nil)
        // The work finishes later: what it made is handed to `late`, not lost.
        #expect(try await Self.eventually { stuck.release(7) })
        #expect(try await Self.eventually { !disposed.withLock { $0.isEmpty } })
        #expect(disposed.withLock { $0 } == [7])
    }

    @Test func workGivenUpOnIsCancelled() async throws {
        let sawCancellation = Mutex(false)
        let value = try await TimeLimit.race(.milliseconds(100)) { () async throws -> Int in
            do {
                try await Task.sleep(for: .seconds(600))
            } catch {
                sawCancellation.withLock { $0 = true }
                throw error
            }
            return 1
        }
        #expect(value == nil)
        #expect(try await Self.eventually { sawCancellation.withLock { $0 } })
    }

    @Test func theCallersCancellationEndsTheRaceAtOnce() async throws {
        let stuck = Stuck()
        let started = ContinuousClock.now
        let caller = Task { try await TimeLimit.race(.seconds(600)) { await stuck.wait() } }
        try await Task.sleep(for: .milliseconds(100))
        caller.cancel()
        await #expect(throws: CancellationError.self) { _ = try await caller.value }
        #expect(ContinuousClock.now - started < .seconds(300), "not the 600 s limit")
        // Let the abandoned work end, so nothing outlives the test.
        #expect(try await Self.eventually { stuck.release(0) })
    }
}
