import Foundation
import Testing
import TidemarkCore
import TidemarkTesting

/// Handing a topic, group or audience back without unsubscribing anyone (`removed:` with
/// `unsubscribe: false`, and `tidemark state rm`), and adopting it again when the manifests name it.
@Suite struct ReleaseTests {
    static let devices = 1000

    static let inventory =
        "device_id,token,team\n"
        + (0..<devices).map { "d\($0),\(Fixtures.token($0)),t\($0 % 2)" }.joined(separator: "\n") + "\n"

    static let everyone = """
          - name: everyone
            protect: true
            members: [{selector: {team: [t0, t1]}}]

        """

    static func topics(everyone: Bool = true, removed: String = "") -> String {
        """
        topics:
        \(everyone ? Self.everyone : "")  - name: team-zero
            members: [{selector: {team: t0}}]
        groups:
          - notification_key_name: family
            members: [{devices: [d0, d1]}]
        audiences:
          - name: testers
            members: [{devices: [d2, d3]}]
        \(removed)
        """
    }

    static func project() throws -> WorkflowTests.Project {
        try WorkflowTests.Project(files: [
            "inv.yaml": "inventory:\n  files: [inventory.csv]\n", "inventory.csv": inventory, "topics.yaml": topics(),
        ])
    }

    /// The calls that change FCM (reads and group look-ups aside).
    static func changes(_ project: WorkflowTests.Project) -> Int {
        project.backend.calls.filter { $0 != .refresh && $0 != .groupKey }.count
    }

    @Test func aReleasedTopicSendsNothingIsForgottenAndIsAdoptedAgainWithNothingSent() async throws {
        var project = try Self.project()
        _ = try await project.apply()
        #expect(try await project.store.load()?.topics["everyone"]?.managed.count == Self.devices)

        // Released in the manifests: a protected topic too, since releasing sends nothing.
        project.files["topics.yaml"] = Self.topics(
            everyone: false, removed: "removed:\n  - {topic: everyone, unsubscribe: false}\n")
        let plan = try await project.plan().plan
        #expect(!plan.diagnostics.hasErrors, "\(plan.diagnostics)")
        let change = try #require(plan.topics.first { $0.topic == "everyone" })
        #expect(change.released == true && change.subscribe == 0 && change.unsubscribe == 0)
        #expect(change.notes.joined().contains("1,000 known subscribers stay subscribed"))
        #expect(plan.operations.map(\.kind) == [.topicRelease])
        #expect(plan.requests == 0, "\(plan.operations.map { ($0.kind, $0.target, $0.tokens.count) })")
        #expect(PlanRenderer.flagged(plan).isEmpty, "a release is not destructive")
        let text = PlanRenderer().render(plan)
        #expect(text.contains("= everyone"), "\(text)")
        #expect(text.contains("= released"), "\(text)")

        let sentBefore = Self.changes(project)
        _ = try await project.apply()
        #expect(Self.changes(project) == sentBefore, "a release sends nothing to FCM")
        let state = try #require(try await project.store.load())
        #expect(state.topics["everyone"] == nil, "state no longer holds the released topic")
        #expect(await project.engine.subscribers(of: "everyone", project: "tidemark-test").count == Self.devices)
        let after = try await project.plan().plan
        #expect(!after.hasChanges, "the entry may stay: \(after.operations.map { ($0.kind, $0.target) })")

        // Declared again: the plan adopts what FCM holds, and the apply sends nothing for it.
        project.files["topics.yaml"] = Self.topics()
        let again = try await project.plan().plan
        let adoption = try #require(again.topics.first { $0.topic == "everyone" })
        #expect(adoption.adopted == Self.devices && adoption.subscribe == 0 && adoption.unsubscribe == 0)
        #expect(Set(again.operations.map(\.kind)) == [.topicAdopt])
        #expect(again.requests == 0)
        let sentBeforeAdoption = Self.changes(project)
        _ = try await project.apply()
        #expect(Self.changes(project) == sentBeforeAdoption)
        let adopted = try #require(try await project.store.load()?.topics["everyone"])
        #expect(adopted.managed.count == Self.devices && adopted.protect)
        #expect(try await project.plan().plan.hasChanges == false)
    }

    @Test func deletingATopicStillUnsubscribesAndThePlanSaysHowToReleaseInstead() async throws {
        var project = try Self.project()
        _ = try await project.apply()
        project.files["topics.yaml"] = Self.topics().replacingOccurrences(of: "    protect: true\n", with: "")
        _ = try await project.apply()
        project.files["topics.yaml"] = Self.topics(everyone: false)
        let plan = try await project.plan().plan
        let change = try #require(plan.topics.first { $0.topic == "everyone" })
        #expect(change.unsubscribe == Self.devices && change.released == nil)
        #expect(change.notes.joined().contains("{topic: everyone, unsubscribe: false}"))
        #expect(change.notes.joined().contains("tidemark state rm topic:everyone"))
    }

    @Test func groupsAndAudiencesAreReleasedWithoutAGroupCall() async throws {
        var project = try Self.project()
        _ = try await project.apply()
        let key = try #require(try await project.store.load()?.groups["family"]?.key)
        project.files["topics.yaml"] = """
            topics:
            \(Self.everyone)  - name: team-zero
                members: [{selector: {team: t0}}]
            removed:
              - {group: family, unsubscribe: false}
              - {audience: testers, unsubscribe: false}
            """
        let plan = try await project.plan().plan
        #expect(!plan.diagnostics.hasErrors, "\(plan.diagnostics)")
        #expect(plan.operations.map(\.kind) == [.groupRelease, .groupRelease])
        #expect(plan.groups.map(\.action) == [.release, .release])
        let sentBefore = Self.changes(project)
        _ = try await project.apply()
        #expect(Self.changes(project) == sentBefore)
        let state = try #require(try await project.store.load())
        #expect(state.groups["family"] == nil && state.groups["testers"] == nil)
        #expect(key.isEmpty == false)
        #expect(try await project.backend.groupKey(name: "family") != nil, "FCM keeps the group")
    }

    @Test func aRemovedEntryThatStillHasADeclarationOrIsListedTwiceIsAnError() async throws {
        let project = try WorkflowTests.Project(files: [
            "inv.yaml": "inventory:\n  files: [inventory.csv]\n", "inventory.csv": Self.inventory,
            "topics.yaml": Self.topics(
                removed: """
                    removed:
                      - {topic: everyone, unsubscribe: false}
                      - {group: team-zero, unsubscribe: false}
                      - {group: team-zero, unsubscribe: true}
                      - {audience: x}
                      - {topic: a, group: b, unsubscribe: false}
                    """),
        ])
        do {
            _ = try await project.plan()
            Issue.record("manifests with bad 'removed:' entries were planned")
        } catch let error as WorkflowError where error.reason == "invalid_input" {}
        let messages = project.output.diagnostics.map(\.description)
        #expect(
            messages.contains { $0.contains("topic:everyone is listed under 'removed' but 'topics:' still declares") })
        #expect(messages.contains { $0.contains("group:team-zero is listed under 'removed' twice") })
        #expect(messages.contains { $0.contains("the 'removed' entry for audience 'x' needs 'unsubscribe'") })
        #expect(messages.contains { $0.contains("names one thing; this one names topic and group") })
        #expect(messages.allSatisfy { $0.contains("topics.yaml:") }, "\(messages)")
    }

    @Test func aMistypedReleaseIsWarnedOfWhileThePlanRemovesWhatItMeant() async throws {
        var project = try Self.project()
        project.files["topics.yaml"] = Self.topics().replacingOccurrences(of: "    protect: true\n", with: "")
        _ = try await project.apply()
        project.files["topics.yaml"] = Self.topics(
            everyone: false, removed: "removed:\n  - {topic: everone, unsubscribe: false}\n")
        let plan = try await project.plan().plan
        #expect(
            plan.diagnostics.contains {
                $0.severity == .warning && $0.message.contains("did you mean topic:everyone")
                    && $0.location?.file == "topics.yaml"
            }, "\(plan.diagnostics)")
    }

    @Test func aSavedPlanThatReleasesAndAdoptsApplies() async throws {
        var project = try Self.project()
        _ = try await project.apply()
        project.files["topics.yaml"] = Self.topics(
            everyone: false, removed: "removed:\n  - {topic: everyone, unsubscribe: false}\n")
        let release = try await project.plan().plan
        _ = try await project.apply(project.saved(release))
        #expect(try await project.store.load()?.topics["everyone"] == nil)
        project.files["topics.yaml"] = Self.topics()
        let adopt = try await project.plan().plan
        project.clock.advance(.seconds(7200))
        _ = try await project.apply(project.saved(adopt))
        #expect(try await project.store.load()?.topics["everyone"]?.managed.count == Self.devices)
    }

    @Test func stateRmForgetsAtOnceAndRefusesWhatStateDoesNotHold() async throws {
        let project = try Self.project()
        _ = try await project.apply()
        let workflow = StateRemoveWorkflow(store: project.store, timing: project.clock.timing)
        let before = try #require(try await project.store.load()).serial
        do {
            _ = try await workflow.run([StateAddress(.topic, "everyone"), StateAddress(.group, "testers")])
            Issue.record("an address state does not hold was released")
        } catch let error as WorkflowError where error.reason == "not_in_state" {
            #expect(error.description.contains("holds no group:testers (state holds it as audience:testers)"))
        }
        #expect(try await project.store.load()?.serial == before, "nothing is written when one address misses")
        do {
            _ = try await workflow.run([StateAddress(.topic, "everyon")])
        } catch let error as WorkflowError {
            #expect(error.description.contains("(closest: topic:everyone)"))
        }
        let dry = try await workflow.run([StateAddress(.topic, "everyone")], dryRun: true)
        #expect(dry.serial == nil && dry.released.first?.observed == Self.devices)
        #expect(try await project.store.load()?.topics["everyone"] != nil)
        let outcome = try await workflow.run([
            StateAddress(.topic, "everyone"), StateAddress(.audience, "testers"), StateAddress(.group, "family"),
            StateAddress(.topic, "everyone"),
        ])
        #expect(outcome.released.map(\.address) == ["topic:everyone", "audience:testers", "group:family"])
        let state = try #require(try await project.store.load())
        #expect(state.topics["everyone"] == nil && state.groups.isEmpty && state.serial == before + 1)
        #expect(await project.engine.subscribers(of: "everyone", project: "tidemark-test").count == Self.devices)

        for bad in ["everyone", "topic:", "queue:x", "topic:weather-*"] {
            #expect(throws: StateAddressError(text: bad)) { try StateAddress(parsing: bad) }
        }
        #expect(try StateAddress(parsing: "audience:a:b") == StateAddress(.audience, "a:b"))
    }
}
