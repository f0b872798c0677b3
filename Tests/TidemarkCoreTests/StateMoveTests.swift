import Foundation
import Testing
import TidemarkCore
import TidemarkTesting

/// `tidemark state mv`: an entry moves whole between two states, and a run stopped after any of its
/// writes leaves nothing lost or acted on in two places; the same command finishes it.
@Suite struct StateMoveTests {
    struct Stop: Error {}

    /// A project applied into its store, and an empty second store for the other workspace.
    static func applied() async throws -> (WorkflowTests.Project, InMemoryStateStore) {
        let project = try ReleaseTests.project()
        _ = try await project.apply()
        return (project, InMemoryStateStore())
    }

    static func workflow(
        _ project: WorkflowTests.Project, _ target: InMemoryStateStore, stopAfter: Int? = nil
    ) -> StateMoveWorkflow {
        var workflow = StateMoveWorkflow(
            source: project.store, target: target, sourceName: "a.db", targetName: "a.db (workspace b)",
            timing: project.clock.timing, tidemarkVersion: "test")
        if let stopAfter { workflow.afterWrite = { if $0 == stopAfter { throw Stop() } } }
        return workflow
    }

    @Test func aTopicMovesWithItsTokensAndMemberships() async throws {
        let (project, target) = try await Self.applied()
        let before = try #require(try await project.store.load())
        let outcome = try await Self.workflow(project, target).run(StateAddress(.topic, "everyone"))
        #expect(!outcome.resumed && outcome.moved.observed == ReleaseTests.devices)
        let source = try #require(try await project.store.load())
        let moved = try #require(try await target.load())
        #expect(source.topics["everyone"] == nil && source.topics["team-zero"] != nil)
        let topic = try #require(moved.topics["everyone"])
        #expect(topic.managed.count == ReleaseTests.devices && topic.protect)
        #expect(
            Set(topic.managed.map { moved.tokens[$0] })
                == Set(before.topics["everyone"]!.managed.map { before.tokens[$0] }))
        let id = try #require(moved.tokens.id(Fixtures.token(7)))
        #expect(
            moved.deviceIDs[Int(id)] == "d7" && moved.seenAt[Int(id)] > 0, "a token's device and last read move too")
        #expect(moved.backend == before.backend && moved.lineage != before.lineage)
        #expect(try await project.store.unfinishedApply() == nil)
        #expect(try await target.unfinishedApply() == nil)
        #expect(
            await project.engine.subscribers(of: "everyone", project: "tidemark-test").count == ReleaseTests.devices)
        // Groups and audiences move the same way; what the target holds already is refused.
        _ = try await Self.workflow(project, target).run(StateAddress(.audience, "testers"))
        #expect(try await target.load()?.groups["testers"]?.audience == true)
        do {
            _ = try await Self.workflow(project, target).run(StateAddress(.topic, "everyone"))
            Issue.record("a move of what the source no longer holds went through")
        } catch let error as WorkflowError { #expect(error.reason == "not_in_state") }
    }

    @Test(arguments: [1, 2, 3])
    func aMoveStoppedAfterAnyWriteIsFinishedByTheSameCommand(stopAfter: Int) async throws {
        var (project, target) = try await Self.applied()
        // As a person moving it would: the source's manifests no longer declare it.
        project.files["topics.yaml"] = ReleaseTests.topics(everyone: false)
        let address = StateAddress(.topic, "everyone")
        await #expect(throws: Stop.self) {
            _ = try await Self.workflow(project, target, stopAfter: stopAfter).run(address)
        }
        // Neither side acts on it meanwhile: the source's apply, prune and state rm, the target's too.
        let sourceHolds = try await project.store.load()?.holds(address) ?? false
        let targetHolds = try await target.load()?.holds(address) ?? false
        #expect(sourceHolds || targetHolds, "never lost")
        if stopAfter < 3 {
            do {
                _ = try await project.apply()
                Issue.record("an apply ran beside an interrupted move")
            } catch let error as WorkflowError {
                #expect(error.reason == "interrupted_move")
                #expect(error.description.contains("run the same 'tidemark state mv' again"))
            }
        } else {
            // The source let go and closed its journal: it is free, and holds nothing of the entry.
            _ = try await project.apply()
            #expect(try await project.store.load()?.holds(address) == false)
        }
        if stopAfter >= 2 {
            await #expect(throws: WorkflowError.self) {
                _ = try await StateRemoveWorkflow(store: target).run([address])
            }
        }
        // The same command finishes it: in the target once, gone from the source, journals closed.
        let outcome = try await Self.workflow(project, target).run(address)
        #expect(outcome.resumed)
        #expect(try await project.store.load()?.holds(address) == false)
        #expect(try await target.load()?.topics["everyone"]?.managed.count == ReleaseTests.devices)
        #expect(try await project.store.unfinishedApply() == nil)
        #expect(try await target.unfinishedApply() == nil)
        _ = try await project.apply()
    }

    @Test func aMoveWhoseTargetGotItsOwnMeanwhileIsUndone() async throws {
        let (project, target) = try await Self.applied()
        let address = StateAddress(.topic, "everyone")
        await #expect(throws: Stop.self) {
            _ = try await Self.workflow(project, target, stopAfter: 1).run(address)
        }
        var own = State()
        own.claim(backend: try #require(try await project.store.load()?.backend), lineage: "own")
        own.setTopic("everyone", TopicState(mode: .authoritative))
        var write = StateWrite()
        write.topics = ["everyone"]
        try await target.save(&own, write, at: 1)
        do {
            _ = try await Self.workflow(project, target).run(address)
            Issue.record("a move into a state holding the entry went through")
        } catch let error as WorkflowError {
            #expect(error.reason == "target_holds" && error.description.contains("the move was undone"))
        }
        #expect(try await project.store.load()?.topics["everyone"]?.managed.count == ReleaseTests.devices)
        #expect(try await project.store.unfinishedApply() == nil, "the source's journal is closed")
    }
}
