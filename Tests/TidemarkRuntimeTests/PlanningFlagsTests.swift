import Foundation
import Testing
import TidemarkCore
import TidemarkRuntime

/// Flags and tidemark.yaml are merged in one place, the runtime, for every front end: a flag wins
/// over tidemark.yaml, which wins over tidemark's defaults.
@Suite struct PlanningFlagsTests {
    static func runtime(_ settings: String?) throws -> (Runtime, URL) {
        let project = FileManager.default.temporaryDirectory.appendingPathComponent("tm-flags-\(UUID().uuidString)")
        try FileManager.default.createDirectory(
            at: project.appendingPathComponent("manifests"), withIntermediateDirectories: true)
        if let settings {
            try settings.write(to: project.appendingPathComponent("tidemark.yaml"), atomically: true, encoding: .utf8)
        }
        var flags = RuntimeFlags()
        flags.directory = project.path
        return (try Runtime.load(flags, environment: [:]), project)
    }

    @Test func withoutFlagsOrSettingsTheDefaultsHold() throws {
        let (runtime, project) = try Self.runtime(nil)
        defer { try? FileManager.default.removeItem(at: project) }
        let request = runtime.planRequest(PlanningFlags())
        #expect(request.refresh.mode == .sample)
        #expect(request.maxUnsubscribes == nil)
        #expect(runtime.pruneRetention(nil) == (90 * 86_400, "90d"))
    }

    @Test func tidemarkYamlFillsInWhatNoFlagGives() throws {
        let (runtime, project) = try Self.runtime(
            "project: tidemark-flags\nrefresh: all\nmax_unsubscribes: 5\nprune_after: 30d\n")
        defer { try? FileManager.default.removeItem(at: project) }
        let request = runtime.planRequest(PlanningFlags(), driftOnly: true)
        #expect(request.refresh.mode == .all && request.driftOnly)
        #expect(request.maxUnsubscribes?.description == (try UnsubscribeLimit(parsing: "5")).description)
        #expect(runtime.pruneRetention(nil) == (30 * 86_400, "30d"))
    }

    @Test func aFlagWinsOverTidemarkYaml() throws {
        let (runtime, project) = try Self.runtime(
            "project: tidemark-flags\nrefresh: all\nmax_unsubscribes: 5\nprune_after: 30d\n")
        defer { try? FileManager.default.removeItem(at: project) }
        let flags = PlanningFlags(
            refresh: RefreshMode.none, refreshBudget: try RefreshBudget(parsing: "7"),
            maxUnsubscribes: try UnsubscribeLimit(parsing: "10%"))
        let request = runtime.planRequest(flags)
        #expect(request.refresh.mode == .none)
        #expect(request.refresh.budget == (try RefreshBudget(parsing: "7")))
        #expect(request.maxUnsubscribes == (try UnsubscribeLimit(parsing: "10%")))
        #expect(runtime.pruneRetention("12w") == (84 * 86_400, "12w"))
    }
}
