import Foundation
import Testing
import TidemarkBackendTesting
import TidemarkCore
import TidemarkEmulator
import TidemarkTesting

/// `max_unsubscribes` on a topic: a plan that takes more of its members is refused, at the topic's
/// line, while rotated tokens (a device keeping its topics under a new token) never count.
@Suite struct TopicRailTests {
    static func inventory(drop: Set<Int> = [], rotate: Set<Int> = []) -> String {
        "device_id,token,region\n"
            + (0..<10).filter { !drop.contains($0) }.map {
                "d\($0),\(Fixtures.token(rotate.contains($0) ? 100 + $0 : $0)),north"
            }.joined(separator: "\n") + "\n"
    }

    static let topics = """
        topics:
          - name: storms
            max_unsubscribes: 20%
            members: [{selector: {region: north}}]
        """

    /// One project's parts: a store, a backend and a clock shared by every run; the inventory per run.
    static func project(output: any WorkflowOutput = SilentOutput()) throws -> (String) -> WorkflowParts {
        let store = InMemoryStateStore()
        let (backend, _) = try InMemoryBackend.make(project: "p", autoRegister: true)
        let clock = ManualClock()
        return { inventory in
            WorkflowParts(
                manifests: Fixtures.manifests([
                    "inv.yaml": "inventory:\n  files: [devices.csv]\n", "devices.csv": inventory,
                    "topics.yaml": Self.topics,
                ]), store: store, backend: backend, timing: clock.timing, output: output, tidemarkVersion: "0.1.0")
        }
    }

    @Test func aTopicsOwnRailRefusesAPlanPastItAndCountsNoRotation() async throws {
        let parts = try Self.project()
        _ = try await ApplyWorkflow(parts(Self.inventory())).run(ApplyRequest())
        // Two of ten leave: 20%, as much as the rail allows.
        let two = try await PlanWorkflow(parts(Self.inventory(drop: [0, 1]))).run(PlanRequest()).plan
        #expect(!two.diagnostics.hasErrors, "\(two.diagnostics)")
        #expect(two.topics.first?.maxUnsubscribes == "20%")
        #expect(PlanRenderer.flagged(two).isEmpty, "within its own rail, not past the default share either")
        // Three leave: refused, naming the topic, its line and the rail.
        let three = try await PlanWorkflow(parts(Self.inventory(drop: [0, 1, 2]))).run(PlanRequest()).plan
        let error = try #require(three.diagnostics.first { $0.severity == .error })
        #expect(error.location?.file == "topics.yaml" && error.location?.line == 2, "\(error)")
        #expect(error.message.contains("3 devices from topic 'storms' (30% of its 10 known subscribers)"), "\(error)")
        #expect(error.message.contains("more than its max_unsubscribes 20% allows (2)"))
        #expect(
            PlanRenderer.flagged(three).first?.reasons == ["30% of its 10 subscribers, over its max_unsubscribes 20%"])
        // Five devices rotate their tokens: five removals, none of them lost, nothing refused or flagged.
        let rotated = try await PlanWorkflow(parts(Self.inventory(rotate: [3, 4, 5, 6, 7]))).run(PlanRequest()).plan
        #expect(rotated.unsubscribeCount == 5 && rotated.rotations?.count == 5)
        #expect(!rotated.diagnostics.hasErrors, "\(rotated.diagnostics)")
        #expect(PlanRenderer.flagged(rotated).isEmpty && rotated.summarized().summary?.destructive == [])
        // The global rail does not count rotations either.
        let global = try UnsubscribeLimit(parsing: "1")
        let capped = try await PlanWorkflow(parts(Self.inventory(rotate: [3, 4, 5, 6, 7]))).run(
            PlanRequest(maxUnsubscribes: global)
        ).plan
        #expect(!capped.diagnostics.hasErrors, "\(capped.diagnostics)")
    }

    /// A saved plan that a rail now refuses is never first said to have been checked: the two lines
    /// would contradict each other.
    @Test func aRefusedSavedPlanIsNotSaidToHaveBeenChecked() async throws {
        let output = RecordingOutput()
        let parts = try Self.project(output: output)
        _ = try await ApplyWorkflow(parts(Self.inventory())).run(ApplyRequest())
        let saved = try await PlanWorkflow(parts(Self.inventory(drop: [0]))).run(PlanRequest()).plan
        #expect(saved.unsubscribeCount == 1)
        // A recent plan applied as CI does (not --refresh all): checked against a plan from state.
        var request = ApplyRequest(
            savedPlan: (saved, "plan.json"),
            planning: PlanRequest(policy: .sample, maxUnsubscribes: try UnsubscribeLimit(parsing: "0")))
        request.rereadAfter = 15 * 60
        let refused = request
        await #expect(throws: WorkflowError.self) {
            _ = try await ApplyWorkflow(parts(Self.inventory(drop: [0]))).run(refused)
        }
        #expect(!output.events.contains { if case .savedPlanChecked = $0 { true } else { false } })
        // Within the rail, the check passes and is said.
        var passing = ApplyRequest(savedPlan: (saved, "plan.json"), planning: PlanRequest(policy: .sample))
        passing.rereadAfter = 15 * 60
        _ = try await ApplyWorkflow(parts(Self.inventory(drop: [0]))).run(passing)
        #expect(output.events.contains { if case .savedPlanChecked = $0 { true } else { false } })
    }

    @Test func railsAreReadFromTheManifestsAndTidemarkYaml() throws {
        let (settings, ok) = ProjectSettings.decode("max_unsubscribes: 5%\n", file: "tidemark.yaml")
        #expect(ok.isEmpty && settings.maxUnsubscribes?.description == "5%")
        let (_, bad) = ProjectSettings.decode("max_unsubscribes: lots\n", file: "tidemark.yaml")
        #expect(
            bad.map(\.description) == [
                "tidemark.yaml:1:19: error: max_unsubscribes 'lots' is neither a number of unsubscriptions (e.g. 500), a percentage (e.g. 5%) nor 'none'."
            ])
        var manifests = ManifestSet()
        let diagnostics = ManifestDecoder().decode(
            "topics:\n  - name: a\n    max_unsubscribes: 150%\n    members: [{devices: [d1]}]\n", file: "m.yaml",
            into: &manifests)
        #expect(
            diagnostics.map(\.description) == [
                "m.yaml:3:23: error: max_unsubscribes '150%' is not a percentage between 0% and 100%."
            ])
    }
}
