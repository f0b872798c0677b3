import Foundation
import Testing
import TidemarkBackendTesting
import TidemarkCore
import TidemarkFCM

/// A topic API added from outside tidemark's sources, with only the public surface: changes in
/// Instance ID batches, reads through FCM v1's registration list (the read the Instance ID API's end
/// takes away first). One type, one registration, and the backend conformance suite.
struct HybridTopicAPI: TopicAPI {
    var transport: TopicTransport { "hybrid" }
    var requests: TopicTransport.Requests { .perOperation }
    func base(_ endpoints: FCMEndpoints) -> String { endpoints.iid }
    var setting: String { "iid_url or TIDEMARK_IID_URL" }
    func journalStep(_ options: FCMHTTPBackend.Options) -> Int? { nil }

    func subscribe(_ backend: FCMHTTPBackend, topic: String, tokens: [String]) async throws -> [TokenOutcome] {
        try await backend.batch("v1:batchAdd", topic: topic, tokens: tokens)
    }

    func unsubscribe(_ backend: FCMHTTPBackend, topic: String, tokens: [String]) async throws -> [TokenOutcome] {
        try await backend.batch("v1:batchRemove", topic: topic, tokens: tokens)
    }

    func read(_ backend: FCMHTTPBackend, token: String) async throws -> RegistrationStatus {
        try await backend.listTopics(token)
    }
}

@Suite struct AddedTransportTests {
    static var registry: TopicAPIRegistry {
        var registry = TopicAPIRegistry.standard
        registry.register(HybridTopicAPI())
        return registry
    }

    @Test(arguments: BackendConformance.Check.allCases)
    func anAddedTransportPassesTheBackendSuite(_ check: BackendConformance.Check) async throws {
        try await BackendConformance.run(check) { body in
            try await BackendConformanceTests.overHTTP("hybrid", registry: Self.registry, body)
        }
    }

    @Test func aTransportNobodyRegisteredSaysSoAtItsFirstCall() async throws {
        try await BackendConformanceTests.overHTTP("carrier-pigeon") { backend, _ in
            let error = await #expect(throws: FCMCallError.self) {
                try await backend.subscribe(topic: "news", tokens: ["a"])
            }
            #expect(error?.description.contains("no topic API is registered for transport 'carrier-pigeon'") == true)
        }
    }

    @Test func aPlanCountsRequestsAsTheTransportDoes() {
        let operation = PlannedOperation(kind: .subscribe, target: "news", tokens: ["a", "b", "c"])
        #expect(TopicTransport.requests(for: [operation], counted: HybridTopicAPI().requests) == 1)
        #expect(TopicTransport.requests(for: [operation], counted: .perToken) == 3)
    }
}
