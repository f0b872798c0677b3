import AsyncHTTPClient
import Foundation
import Testing
import TidemarkAuth
import TidemarkCore
import TidemarkEmulator
@testable import TidemarkFCM

/// Every `Backend` the same inputs, expecting the same results: the embedded engine in process, and
/// tidemark's HTTP client over both topic transports talking to a live emulator on port 0.
///
/// The emulator's engine is the one seeded and inspected, so what differs between the cases is only
/// the path from `Backend` to the engine: nothing at all, or FCM's wire protocol over a socket.
@Suite struct BackendConformanceTests {
    enum Subject: String, CaseIterable, CustomTestStringConvertible {
        case embedded, httpV1, httpIID
        var testDescription: String { rawValue }
    }

    static let project = "fcm-test"

    static func token(_ i: Int) -> String { "conf\(i):APA91bC" + String(repeating: "c", count: 60) }
    static let stranger = "stranger:APA91bS" + String(repeating: "s", count: 60)

    /// Runs `body` with a backend of `subject` and the engine behind it; 40 tokens are registered.
    func with(_ subject: Subject, _ body: (any Backend, FCMEngine) async throws -> Void) async throws {
        // Short retries: a per-token fault injected for good must come back as that token's error, quickly.
        let policy = RetryPolicy(baseDelay: .milliseconds(2), maxDelay: .milliseconds(20), budget: .milliseconds(200))
        let instances = (0..<40).map { FCMEngine.Instance(token: Self.token($0)) }
        switch subject {
        case .embedded:
            let engine = try FCMEngine(configuration: FCMEngine.Configuration(autoRegister: false))
            try await engine.register(instances, project: Self.project)
            try await body(EmbeddedBackend(engine: engine, project: Self.project), engine)
        case .httpV1, .httpIID:
            try await AccessTokenProviderTests().withEmulator { server, client in
                let engine = server.emulator.engine
                try await engine.register(instances, project: Self.project)
                var options = FCMHTTPBackend.Options()
                options.transport = subject == .httpV1 ? .v1 : .iid
                options.policy = policy
                options.concurrency = 8
                let key = try ServiceAccountKey.load(path: server.keyFilePath)
                let backend = FCMHTTPBackend(kind: "emulator", project: Self.project,
                    endpoints: .emulator(host: server.emulator.control.baseURL), client: client,
                    credentials: AccessTokenProvider(key: key, client: client), options: options)
                try await body(backend, engine)
            }
        }
    }

    @Test(arguments: Subject.allCases)
    func subscribeIsIdempotentAndReportsUnknownTokens(_ subject: Subject) async throws {
        try await with(subject) { backend, engine in
            let tokens = (0..<5).map { Self.token($0) } + [Self.stranger]
            let first = try await backend.subscribe(topic: "news", tokens: tokens)
            #expect(first == Array(repeating: .ok, count: 5) + [.failed(.notFound)])
            // Again, and mixed with a new one: already subscribed is success, never an error.
            let again = try await backend.subscribe(topic: "news", tokens: [Self.token(0), Self.token(5)])
            #expect(again == [.ok, .ok])
            #expect(Set(await engine.subscribers(of: "news", project: Self.project)) == Set((0..<6).map { Self.token($0) }))
        }
    }

    @Test(arguments: Subject.allCases)
    func unsubscribeOfAMissingMembershipIsDone(_ subject: Subject) async throws {
        try await with(subject) { backend, engine in
            _ = try await backend.subscribe(topic: "news", tokens: [Self.token(1)])
            let removed = try await backend.unsubscribe(topic: "news", tokens: [Self.token(1), Self.token(2), Self.stranger])
            #expect(removed == [.ok, .ok, .failed(.notFound)])
            #expect(await engine.subscribers(of: "news", project: Self.project).isEmpty)
        }
    }

    @Test(arguments: Subject.allCases)
    func refreshReadsEachRegistration(_ subject: Subject) async throws {
        try await with(subject) { backend, _ in
            _ = try await backend.subscribe(topic: "b-topic", tokens: [Self.token(1), Self.token(2)])
            _ = try await backend.subscribe(topic: "a-topic", tokens: [Self.token(2)])
            let statuses = try await backend.refresh([Self.token(0), Self.token(1), Self.token(2), Self.stranger])
            #expect(statuses == [.active(topics: []), .active(topics: ["b-topic"]), .active(topics: ["a-topic", "b-topic"]),
                .notFound])
        }
    }

    @Test(arguments: Subject.allCases)
    func theTwoThousandAndFirstTopicIsRefused(_ subject: Subject) async throws {
        try await with(subject) { backend, engine in
            for t in 0..<FCMLimits.maxTopicsPerToken {
                _ = try await engine.batchAdd(project: Self.project, topic: "t\(t)", tokens: [Self.token(3)])
            }
            let outcomes = try await backend.subscribe(topic: "one-too-many", tokens: [Self.token(3), Self.token(4)])
            #expect(outcomes == [.failed(.tooManyTopics), .ok])
            if case .active(let topics) = try await backend.refresh([Self.token(3)]).first {
                #expect(topics.count == FCMLimits.maxTopicsPerToken, "a list pages through all 2000 topics")
            } else {
                Issue.record("token 3 must read as active")
            }
        }
    }

    /// A transient per-token failure is retried (by the v1 client per request, by the executor per token
    /// for batches) and ends subscribed; a permanent one is reported once, for that token only.
    @Test(arguments: Subject.allCases)
    func transientTokenErrorsAreRetriedAndPermanentOnesReported(_ subject: Subject) async throws {
        try await with(subject) { backend, engine in
            await engine.injectError(.internalError, forToken: Self.token(6))
            await engine.injectError(.invalidArgument, forToken: Self.token(7))
            let operation = PlannedOperation(kind: .subscribe, target: "news",
                tokens: [Self.token(6), Self.token(7), Self.token(8)])
            let report = try await Executor(backend: backend, recorder: NullRecorder(), timing: VirtualRetryClock().timing)
                .run([operation])
            #expect(report.failures.map { [$0.token, $0.error.code] } == [[Self.token(7), "INVALID_ARGUMENT"]])
            #expect(Set(await engine.subscribers(of: "news", project: Self.project)) == [Self.token(6), Self.token(8)])
        }
    }

    @Test(arguments: Subject.allCases)
    func deviceGroupsFollowFCMsRules(_ subject: Subject) async throws {
        try await with(subject) { backend, engine in
            #expect(try await backend.groupKey(name: "family") == nil)
            // Invalid members are dropped on create.
            let key = try await backend.createGroup(name: "family", tokens: [Self.token(1), Self.stranger])
            #expect(await engine.groupMembers(project: Self.project, name: "family") == [Self.token(1)])
            #expect(try await backend.groupKey(name: "family") != nil)
            await #expect(throws: GroupError(.alreadyExists)) {
                try await backend.createGroup(name: "family", tokens: [Self.token(2)])
            }
            await #expect(throws: GroupError(.noValidRegistrationIDs)) {
                try await backend.createGroup(name: "empty", tokens: [Self.stranger])
            }
            _ = try await backend.addToGroup(name: "family", key: key, tokens: (2..<20).map { Self.token($0) })
            await #expect(throws: GroupError(.tooManyMembers)) {
                try await backend.addToGroup(name: "family", key: key, tokens: [Self.token(25), Self.token(26)])
            }
            await #expect(throws: GroupError(.nameMismatch)) {
                try await backend.addToGroup(name: "other", key: key, tokens: [Self.token(25)])
            }
            // Removing every member deletes the group; it is then not found by name or key.
            try await backend.removeFromGroup(name: "family", key: key, tokens: (1..<20).map { Self.token($0) })
            #expect(try await backend.groupKey(name: "family") == nil)
            await #expect(throws: GroupError(.notFound)) {
                try await backend.addToGroup(name: "family", key: key, tokens: [Self.token(1)])
            }
            await #expect(throws: GroupError(.notFound)) {
                try await backend.removeFromGroup(name: "family", key: key, tokens: [Self.token(1)])
            }
        }
    }

    /// What the executor builds on top: a group created elsewhere is adopted, a vanished one recreated.
    @Test(arguments: Subject.allCases)
    func executorAdoptsAndRecreatesGroups(_ subject: Subject) async throws {
        try await with(subject) { backend, engine in
            let old = try await engine.createGroup(project: Self.project, name: "adopted", tokens: [Self.token(1)])
            let vanished = try await engine.createGroup(project: Self.project, name: "vanished", tokens: [Self.token(2)])
            _ = try await engine.removeFromGroup(project: Self.project, name: "vanished", key: vanished, tokens: [Self.token(2)])
            let operations = [
                PlannedOperation(kind: .groupCreate, target: "adopted", tokens: [Self.token(3)]),
                PlannedOperation(kind: .groupAdd, target: "vanished", tokens: [Self.token(4)]),
            ]
            let report = try await Executor(backend: backend, recorder: NullRecorder(), timing: VirtualRetryClock().timing)
                .run(operations, groupKeys: ["vanished": vanished])
            #expect(report.failures.isEmpty)
            #expect(await engine.groupMembers(project: Self.project, name: "adopted") == [Self.token(1), Self.token(3)])
            #expect(await engine.groupMembers(project: Self.project, name: "vanished") == [Self.token(4)])
            #expect(await engine.groupMembers(project: Self.project, key: old) != nil, "every key alias stays valid")
        }
    }
}

/// Journals nothing: for executor runs whose state is not under test.
struct NullRecorder: ApplyRecorder {
    func completed(index: Int, operation: PlannedOperation, outcomes: [TokenOutcome], groupKey: String?) async throws {}
}
