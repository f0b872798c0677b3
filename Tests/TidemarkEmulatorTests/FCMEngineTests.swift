import Foundation
import Testing
import TidemarkCore

@testable import TidemarkEmulator

@Suite struct FCMEngineTests {
    let project = "p1"

    func engine(autoRegister: Bool = true, maxTopics: Int = 2000, store: (any EngineStore)? = nil) throws -> FCMEngine {
        try FCMEngine(configuration: .init(autoRegister: autoRegister, maxTopicsPerToken: maxTopics), store: store)
    }

    @Test func batchResultsAreInOrderWithPerTokenErrors() async throws {
        let e = try engine(autoRegister: false)
        try await e.register(token: "good:APA91b", project: project)
        try await e.register(token: "other:APA91b", project: "p2")
        try await e.register(token: "gone:APA91b", project: project)
        try await e.unregister(token: "gone:APA91b")
        let results = try await e.batchAdd(
            project: project, topic: "news",
            tokens: ["good:APA91b", "never:APA91b", "bad token", "other:APA91b", "gone:APA91b"])
        #expect(
            results == [
                .ok, .failed(.notFound), .failed(.invalidArgument), .failed(.invalidArgument), .failed(.notFound),
            ])
        #expect(await e.subscribers(of: "news", project: project) == ["good:APA91b"])
        // Subscribing twice and removing a missing subscription both succeed.
        #expect(try await e.batchAdd(project: project, topic: "news", tokens: ["good:APA91b"]) == [.ok])
        #expect(try await e.batchRemove(project: project, topic: "sports", tokens: ["good:APA91b"]) == [.ok])
    }

    @Test func wholeRequestErrors() async throws {
        let e = try engine()
        await #expect(throws: EngineError(.invalidTopicName, "bad/topic")) {
            try await e.batchAdd(project: project, topic: "bad/topic", tokens: ["a:APA91b"])
        }
        await #expect(throws: EngineError(.missingTokens)) {
            try await e.batchAdd(project: project, topic: "ok", tokens: [])
        }
        let tooMany = (0...1000).map { "t\($0):APA91b" }
        await #expect { try await e.batchAdd(project: project, topic: "ok", tokens: tooMany) } throws: { error in
            (error as? EngineError)?.code == .tooManyTokens
        }
    }

    @Test func topicCapPerToken() async throws {
        let e = try engine(maxTopics: 3)
        for topic in ["a", "b", "c"] {
            #expect(try await e.batchAdd(project: project, topic: topic, tokens: ["x:APA91b"]) == [.ok])
        }
        #expect(try await e.batchAdd(project: project, topic: "d", tokens: ["x:APA91b"]) == [.failed(.tooManyTopics)])
        #expect(try await e.batchAdd(project: project, topic: "a", tokens: ["x:APA91b"]) == [.ok])
        _ = try await e.batchRemove(project: project, topic: "a", tokens: ["x:APA91b"])
        #expect(try await e.batchAdd(project: project, topic: "d", tokens: ["x:APA91b"]) == [.ok])
    }

    @Test func v1SubscriptionSemantics() async throws {
        let e = try engine()
        _ = try await e.createSubscription(project: project, registration: "r:APA91b", topic: "t")
        await #expect(throws: EngineError(.alreadyExists, "topic subscription already exists")) {
            try await e.createSubscription(project: project, registration: "r:APA91b", topic: "t")
        }
        try await e.deleteSubscription(project: project, registration: "r:APA91b", topic: "t", allowMissing: false)
        try await e.deleteSubscription(project: project, registration: "r:APA91b", topic: "t", allowMissing: true)
        await #expect {
            try await e.deleteSubscription(project: project, registration: "r:APA91b", topic: "t", allowMissing: false)
        } throws: { ($0 as? EngineError)?.code == .notFound }
    }

    @Test func deviceGroups() async throws {
        let e = try engine(autoRegister: false)
        let members = (1...21).map { "m\($0):APA91b" }
        for token in members { try await e.register(token: token, project: project) }
        await #expect(throws: GroupError(.noValidRegistrationIDs)) {
            try await e.createGroup(project: project, name: "g", tokens: ["unknown:APA91b"])
        }
        // Invalid tokens are dropped on create.
        let key = try await e.createGroup(project: project, name: "g", tokens: ["m1:APA91b", "unknown:APA91b"])
        #expect(await e.groupMembers(project: project, name: "g") == ["m1:APA91b"])
        await #expect(throws: GroupError(.alreadyExists)) {
            try await e.createGroup(project: project, name: "g", tokens: ["m2:APA91b"])
        }
        // Look-ups issue new aliases; every alias works.
        let alias = try await e.groupKey(project: project, name: "g")
        #expect(alias != key)
        _ = try await e.addToGroup(project: project, name: "g", key: alias, tokens: Array(members[1..<20]))
        #expect(await e.groupMembers(project: project, name: "g")?.count == 20)
        await #expect(throws: GroupError(.tooManyMembers)) {
            try await e.addToGroup(project: project, name: "g", key: key, tokens: [members[20]])
        }
        await #expect(throws: GroupError(.nameMismatch)) {
            try await e.addToGroup(project: project, name: "h", key: key, tokens: [members[0]])
        }
        // Removing every member deletes the group and its keys.
        _ = try await e.removeFromGroup(project: project, name: "g", key: key, tokens: Array(members[0..<20]))
        #expect(await e.groupMembers(project: project, name: "g") == nil)
        await #expect(throws: GroupError(.notFound)) {
            try await e.addToGroup(project: project, name: "g", key: alias, tokens: [members[0]])
        }
        await #expect(throws: GroupError(.notFound)) { try await e.groupKey(project: project, name: "g") }
    }

    @Test func persistsAcrossRestarts() async throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("engine-\(UUID().uuidString).db").path
        defer { try? FileManager.default.removeItem(atPath: path) }
        do {
            let e = try engine(store: try SQLiteEngineStore(path: path))
            _ = try await e.batchAdd(project: project, topic: "a", tokens: ["x:APA91b", "y:APA91b"])
            _ = try await e.batchRemove(project: project, topic: "a", tokens: ["y:APA91b"])
            try await e.unregister(token: "z:APA91b")
            _ = try await e.createGroup(project: project, name: "g", tokens: ["x:APA91b"])
        }
        let reopened = try engine(store: try SQLiteEngineStore(path: path))
        #expect(await reopened.subscribers(of: "a", project: project) == ["x:APA91b"])
        #expect(await reopened.topics(of: "z:APA91b", project: project) == nil)
        #expect(await reopened.groupMembers(project: project, name: "g") == ["x:APA91b"])
        let attributes = try FileManager.default.attributesOfItem(atPath: path)
        #expect((attributes[.posixPermissions] as? Int) == 0o600)
    }
}
