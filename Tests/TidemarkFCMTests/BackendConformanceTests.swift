import AsyncHTTPClient
import Foundation
import Testing
import TidemarkAuth
import TidemarkBackendTesting
import TidemarkCore
import TidemarkEmulator
import TidemarkTesting

@testable import TidemarkFCM

/// Every `Backend` through the one conformance suite: the in-memory engine, and tidemark's HTTP
/// client over both topic transports talking to a live emulator on port 0.
///
/// The emulator's engine is the one seeded and inspected, so what differs between the subjects is only
/// the path from `Backend` to the engine: nothing at all, or FCM's wire protocol over a socket.
@Suite struct BackendConformanceTests {
    enum Subject: String, CaseIterable, CustomTestStringConvertible {
        case embedded, httpV1, httpIID
        var testDescription: String { rawValue }
    }

    @Test(arguments: Subject.allCases, BackendConformance.Check.allCases)
    func conforms(_ subject: Subject, _ check: BackendConformance.Check) async throws {
        switch subject {
        case .embedded:
            try await BackendConformance.run(check, InMemoryBackend.harness)
        case .httpV1, .httpIID:
            try await BackendConformance.run(check) { body in
                try await Self.overHTTP(subject == .httpV1 ? .v1 : .iid, body)
            }
        }
    }

    static func overHTTP(
        _ transport: TopicTransport, registry: TopicAPIRegistry = .standard,
        _ body: (any Backend, FCMEngine) async throws -> Void
    )
        async throws
    {
        // Short retries: a per-token fault injected for good must come back as that token's error, quickly.
        let policy = RetryPolicy(baseDelay: .milliseconds(2), maxDelay: .milliseconds(20), budget: .milliseconds(200))
        try await AccessTokenProviderTests().withEmulator { server, client in
            let engine = server.emulator.engine
            try await engine.register(BackendConformance.instances, project: BackendConformance.project)
            var options = FCMHTTPBackend.Options()
            options.transport = transport
            options.topicAPIs = registry
            options.policy = policy
            options.concurrency = 8
            let key = try ServiceAccountKey.load(path: server.keyFilePath)
            let backend = FCMHTTPBackend(
                kind: .emulator, project: BackendConformance.project,
                endpoints: .emulator(host: server.emulator.control.baseURL), client: client,
                credentials: AccessTokenProvider(key: key, client: client), options: options)
            try await body(backend, engine)
        }
    }
}
