import Foundation
import Testing
import TidemarkCore
import TidemarkEmulator
import TidemarkTesting

/// One suite for every `Backend`: the same inputs, the same results. The harness runs a body with a
/// backend and the emulator engine behind it (seeded and inspected by the checks), with 40 tokens
/// (`token(0..<40)`) registered in `project`.
///
/// ```swift
/// @Test(arguments: BackendConformance.Check.allCases)
/// func conforms(_ check: BackendConformance.Check) async throws {
///     try await BackendConformance.run(check, InMemoryBackend.harness)
/// }
/// ```
public enum BackendConformance {
    /// Runs one check's body with the backend under test and the engine behind it.
    public typealias Harness = (_ body: (any Backend, FCMEngine) async throws -> Void) async throws -> Void

    /// The checks every backend passes.
    public enum Check: String, CaseIterable, Sendable, CustomTestStringConvertible {
        case subscribeIsIdempotentAndReportsUnknownTokens
        case unsubscribeOfAMissingMembershipIsDone
        case refreshReadsEachRegistration
        case theTwoThousandAndFirstTopicIsRefused
        case transientTokenErrorsAreRetriedAndPermanentOnesReported
        case deviceGroupsFollowFCMsRules
        case executorAdoptsAndRecreatesGroups

        /// The check's name, as test reports show it.
        public var testDescription: String { rawValue }
    }

    /// The FCM project the checks run against.
    public static let project = "fcm-test"

    /// The registration token of test device `i`.
    public static func token(_ i: Int) -> String { "conf\(i):APA91bC" + String(repeating: "c", count: 60) }
    /// A token no harness registers.
    public static let stranger = "stranger:APA91bS" + String(repeating: "s", count: 60)

    /// The registrations a harness sets up before the body runs.
    public static var instances: [FCMEngine.Instance] { (0..<40).map { FCMEngine.Instance(token: token($0)) } }

    /// Runs `check` through `harness`.
    public static func run(_ check: Check, _ harness: Harness) async throws {
        switch check {
        case .subscribeIsIdempotentAndReportsUnknownTokens:
            try await subscribeIsIdempotentAndReportsUnknownTokens(harness)
        case .unsubscribeOfAMissingMembershipIsDone: try await unsubscribeOfAMissingMembershipIsDone(harness)
        case .refreshReadsEachRegistration: try await refreshReadsEachRegistration(harness)
        case .theTwoThousandAndFirstTopicIsRefused: try await theTwoThousandAndFirstTopicIsRefused(harness)
        case .transientTokenErrorsAreRetriedAndPermanentOnesReported:
            try await transientTokenErrorsAreRetriedAndPermanentOnesReported(harness)
        case .deviceGroupsFollowFCMsRules: try await deviceGroupsFollowFCMsRules(harness)
        case .executorAdoptsAndRecreatesGroups: try await executorAdoptsAndRecreatesGroups(harness)
        }
    }

    static func subscribeIsIdempotentAndReportsUnknownTokens(_ with: Harness) async throws {
        try await with { backend, engine in
            let tokens = (0..<5).map { token($0) } + [stranger]
            let first = try await backend.subscribe(topic: "news", tokens: tokens)
            #expect(first == Array(repeating: .ok, count: 5) + [.failed(.notFound)])
            // Again, and mixed with a new one: already subscribed is success, never an error.
            let again = try await backend.subscribe(topic: "news", tokens: [token(0), token(5)])
            #expect(again == [.ok, .ok])
            #expect(Set(await engine.subscribers(of: "news", project: project)) == Set((0..<6).map { token($0) }))
        }
    }

    static func unsubscribeOfAMissingMembershipIsDone(_ with: Harness) async throws {
        try await with { backend, engine in
            _ = try await backend.subscribe(topic: "news", tokens: [token(1)])
            let removed = try await backend.unsubscribe(topic: "news", tokens: [token(1), token(2), stranger])
            #expect(removed == [.ok, .ok, .failed(.notFound)])
            #expect(await engine.subscribers(of: "news", project: project).isEmpty)
        }
    }

    static func refreshReadsEachRegistration(_ with: Harness) async throws {
        try await with { backend, _ in
            _ = try await backend.subscribe(topic: "b-topic", tokens: [token(1), token(2)])
            _ = try await backend.subscribe(topic: "a-topic", tokens: [token(2)])
            let statuses = try await backend.refresh([token(0), token(1), token(2), stranger])
            #expect(
                statuses == [
                    .active(topics: []), .active(topics: ["b-topic"]), .active(topics: ["a-topic", "b-topic"]),
                    .notFound,
                ])
        }
    }

    static func theTwoThousandAndFirstTopicIsRefused(_ with: Harness) async throws {
        try await with { backend, engine in
            for t in 0..<FCMLimits.maxTopicsPerToken {
                _ = try await engine.batchAdd(project: project, topic: "t\(t)", tokens: [token(3)])
            }
            let outcomes = try await backend.subscribe(topic: "one-too-many", tokens: [token(3), token(4)])
            #expect(outcomes == [.failed(.tooManyTopics), .ok])
            if case .active(let topics) = try await backend.refresh([token(3)]).first {
                #expect(topics.count == FCMLimits.maxTopicsPerToken, "a list pages through all 2000 topics")
            } else {
                Issue.record("token 3 must read as active")
            }
        }
    }

    /// A transient per-token failure is retried (by the v1 client per request, by the executor per token
    /// for batches) and ends subscribed; a permanent one is reported once, for that token only.
    static func transientTokenErrorsAreRetriedAndPermanentOnesReported(_ with: Harness) async throws {
        try await with { backend, engine in
            await engine.injectError(.internalError, forToken: token(6))
            await engine.injectError(.invalidArgument, forToken: token(7))
            let operation = PlannedOperation(
                kind: .subscribe, target: "news",
                tokens: [token(6), token(7), token(8)])
            let report = try await Executor(backend: backend, recorder: NullRecorder(), timing: ManualClock().timing)
                .run([operation])
            #expect(report.failures.map(\.token) == [token(7)])
            #expect(report.failures.map(\.error) == [.invalidArgument])
            #expect(Set(await engine.subscribers(of: "news", project: project)) == [token(6), token(8)])
        }
    }

    static func deviceGroupsFollowFCMsRules(_ with: Harness) async throws {
        try await with { backend, engine in
            #expect(try await backend.groupKey(name: "family") == nil)
            // Invalid members are dropped on create.
            let key = try await backend.createGroup(name: "family", tokens: [token(1), stranger])
            #expect(await engine.groupMembers(project: project, name: "family") == [token(1)])
            #expect(try await backend.groupKey(name: "family") != nil)
            await #expect(throws: GroupError(.alreadyExists)) {
                try await backend.createGroup(name: "family", tokens: [token(2)])
            }
            await #expect(throws: GroupError(.noValidRegistrationIDs)) {
                try await backend.createGroup(name: "empty", tokens: [stranger])
            }
            _ = try await backend.addToGroup(name: "family", key: key, tokens: (2..<20).map { token($0) })
            // The export call lists every member, by any of the group's keys.
            #expect(
                Set(try await backend.exportGroup(name: "family", key: key) ?? []) == Set((1..<20).map { token($0) }))
            #expect(try await backend.exportGroup(name: "family", key: "APA91b-no-such-key") == nil)
            await #expect(throws: GroupError(.tooManyMembers)) {
                try await backend.addToGroup(name: "family", key: key, tokens: [token(25), token(26)])
            }
            await #expect(throws: GroupError(.nameMismatch)) {
                try await backend.addToGroup(name: "other", key: key, tokens: [token(25)])
            }
            // Removing every member deletes the group; it is then not found by name or key.
            try await backend.removeFromGroup(name: "family", key: key, tokens: (1..<20).map { token($0) })
            #expect(try await backend.groupKey(name: "family") == nil)
            #expect(try await backend.exportGroup(name: "family", key: key) == nil)
            await #expect(throws: GroupError(.notFound)) {
                try await backend.addToGroup(name: "family", key: key, tokens: [token(1)])
            }
            await #expect(throws: GroupError(.notFound)) {
                try await backend.removeFromGroup(name: "family", key: key, tokens: [token(1)])
            }
        }
    }

    /// What the executor builds on top: a group created elsewhere is adopted, a vanished one recreated.
    static func executorAdoptsAndRecreatesGroups(_ with: Harness) async throws {
        try await with { backend, engine in
            let old = try await engine.createGroup(project: project, name: "adopted", tokens: [token(1)])
            let vanished = try await engine.createGroup(project: project, name: "vanished", tokens: [token(2)])
            _ = try await engine.removeFromGroup(project: project, name: "vanished", key: vanished, tokens: [token(2)])
            let operations = [
                PlannedOperation(kind: .groupCreate, target: "adopted", tokens: [token(3)]),
                PlannedOperation(kind: .groupAdd, target: "vanished", tokens: [token(4)]),
            ]
            let report = try await Executor(backend: backend, recorder: NullRecorder(), timing: ManualClock().timing)
                .run(operations, groupKeys: ["vanished": vanished])
            #expect(report.failures.isEmpty)
            #expect(await engine.groupMembers(project: project, name: "adopted") == [token(1), token(3)])
            #expect(await engine.groupMembers(project: project, name: "vanished") == [token(4)])
            #expect(await engine.groupMembers(project: project, key: old) != nil, "every key alias stays valid")
        }
    }

}

/// The in-memory twin of every backend: the emulator's engine in process, with nothing persisted.
public enum InMemoryBackend {
    /// A backend over a fresh engine (tokens must be registered, as FCM requires, unless `autoRegister`)
    /// and the engine itself; by default on a manual clock, so its times and group keys repeat.
    public static func make(
        project: String = BackendConformance.project, autoRegister: Bool = false,
        timing: Timing = ManualClock().timing
    ) throws -> (EmbeddedBackend, FCMEngine) {
        let engine = try FCMEngine(configuration: FCMEngine.Configuration(autoRegister: autoRegister), timing: timing)
        return (EmbeddedBackend(engine: engine, project: project), engine)
    }

    /// The conformance harness over the in-memory backend.
    public static func harness(_ body: (any Backend, FCMEngine) async throws -> Void) async throws {
        let (backend, engine) = try make()
        try await engine.register(BackendConformance.instances, project: BackendConformance.project)
        try await body(backend, engine)
    }
}

/// Journals nothing: for executor runs whose state is not under test.
public struct NullRecorder: ApplyRecorder {
    /// A recorder that keeps nothing.
    public init() {}
    /// Keeps nothing.
    public func recorded(_ step: OperationStep) async throws {}
}
