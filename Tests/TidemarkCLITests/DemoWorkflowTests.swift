import Foundation
import Testing

/// The README's promise on the demo project: plan shows changes, apply makes them, the next plan is empty.
@Suite(.serialized) struct DemoWorkflowTests {
    @Test func planApplyPlan() throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        let validate = try cli.run(["validate"])
        #expect(validate.status == 0, "\(validate.stderr)")
        #expect(validate.stdout.contains("The manifests are valid"))

        let plan = try cli.run(["plan", "--detailed-exitcode"])
        #expect(plan.status == 2, "\(plan.stderr)")
        #expect(plan.stdout.hasPrefix("Plan: 23 topics and 4 groups change: +"))
        #expect(!plan.stdout.contains("APA91b"), "tokens must be redacted in human output")

        let apply = try cli.run(["apply", "--auto-approve"])
        #expect(apply.status == 0, "\(apply.stderr)")
        #expect(apply.stdout.contains("Apply complete: +"))

        let again = try cli.run(["plan", "--detailed-exitcode"])
        #expect(again.status == 0, "\(again.stdout)\(again.stderr)")
        #expect(again.stdout.hasPrefix("No changes."))
        let fast = try cli.run(["plan", "--no-refresh", "--detailed-exitcode"])
        #expect(fast.status == 0)

        let mode =
            try FileManager.default.attributesOfItem(
                atPath: cli.project.appendingPathComponent(".tidemark/state.db").path)[.posixPermissions] as? Int
        #expect(mode == 0o600)
    }

    /// SQLite workspaces live in the one state file, each converging on its own; a workspace an older
    /// tidemark kept in a file of its own (state.staging.db) is moved in on first use.
    @Test func sqliteWorkspacesShareTheStateFile() throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        #expect(try cli.run(["apply", "--auto-approve"]).status == 0)
        let prod = try cli.run(["plan", "--workspace", "prod", "--detailed-exitcode"])
        #expect(prod.status == 2, "a new workspace has no state yet: \(prod.stdout)")
        #expect(try cli.run(["apply", "--auto-approve", "--workspace", "prod", "--no-refresh"]).status == 0)
        let list = try cli.run(["state", "list", "--workspace", "prod"])
        #expect(list.stdout.contains(".tidemark/state.db (workspace prod)"), "\(list.stdout)")
        let state = cli.project.appendingPathComponent(".tidemark")
        var files = try FileManager.default.contentsOfDirectory(atPath: state.path).filter { $0.hasSuffix(".db") }
        #expect(Set(files) == ["state.db", "embedded.db"], "\(files)")

        // An older tidemark's file for workspace staging: its state becomes the workspace's.
        #expect(try cli.run(["apply", "--auto-approve", "--state", ".tidemark/state.staging.db"]).status == 0)
        let older = try cli.run(["state", "list", "--state", ".tidemark/state.staging.db", "--format", "json"])
        let lineage = try #require(
            (try JSONSerialization.jsonObject(with: Data(older.stdout.utf8)) as? [String: Any])?["lineage"] as? String)
        let moved = try cli.run(["state", "list", "--workspace", "staging", "--format", "json"])
        #expect(moved.stdout.contains(lineage), "\(moved.stdout)\(moved.stderr)")
        files = try FileManager.default.contentsOfDirectory(atPath: state.path)
        #expect(files.contains("state.staging.db.moved") && !files.contains("state.staging.db"), "\(files)")
        let converged = try cli.run(["plan", "--workspace", "staging", "--detailed-exitcode"])
        #expect(converged.status == 0, "\(converged.stdout)")
    }

    @Test func jsonPlanCarriesFullTokens() throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        let plan = try cli.run(["plan", "--format", "json", "--no-refresh"])
        #expect(plan.status == 0)
        let json = try JSONSerialization.jsonObject(with: Data(plan.stdout.utf8)) as? [String: Any]
        #expect(json?["format_version"] as? Int == 1)
        let operations = json?["operations"] as? [[String: Any]] ?? []
        #expect(!operations.isEmpty)
        #expect(operations.allSatisfy { ($0["tokens"] as? [String])?.count ?? 0 <= 1000 })
        #expect(plan.stdout.contains("APA91b"))
    }

    @Test func savedPlanIsAppliedExactlyOrRefusedAsStale() throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        #expect(try cli.run(["plan", "--out", "first.json"]).status == 0)
        #expect(try cli.run(["plan", "--out", "second.json"]).status == 0)
        let show = try cli.run(["show", "first.json"])
        #expect(show.status == 0 && show.stdout.hasPrefix("Plan: "))
        let apply = try cli.run(["apply", "first.json"])
        #expect(apply.status == 0, "\(apply.stderr)")
        // The state moved on: the second plan is stale.
        let stale = try cli.run(["apply", "second.json"])
        #expect(stale.status == 1)
        #expect(stale.stderr.contains("second.json is stale: it was made before any state existed"))
        #expect(try cli.run(["plan", "--detailed-exitcode"]).status == 0)

        // A plan made, then the manifests change: refused with the reason.
        try cli.write("manifests/extra.yaml", "topics:\n  - name: extra\n    members: [{devices: [dev-00001]}]\n")
        #expect(try cli.run(["plan", "--out", "third.json"]).status == 0)
        try cli.write("manifests/extra.yaml", "topics:\n  - name: extra\n    members: [{devices: [dev-00002]}]\n")
        let changed = try cli.run(["apply", "third.json"])
        #expect(changed.status == 1)
        #expect(
            changed.stderr.contains("the manifests or inventory changed what topic:extra means"), "\(changed.stderr)")
        // A plan made, then another apply changes the topic it touches: refused, naming the topic.
        try cli.write("manifests/extra.yaml", "topics:\n  - name: extra\n    members: [{devices: [dev-00003]}]\n")
        #expect(try cli.run(["apply", "--auto-approve"]).status == 0)
        try cli.write("manifests/extra.yaml", "topics:\n  - name: extra\n    members: [{devices: [dev-00004]}]\n")
        #expect(try cli.run(["plan", "--out", "fourth.json"]).status == 0)
        try cli.write("manifests/extra.yaml", "topics:\n  - name: extra\n    members: [{devices: [dev-00005]}]\n")
        #expect(try cli.run(["apply", "--auto-approve"]).status == 0)
        try cli.write("manifests/extra.yaml", "topics:\n  - name: extra\n    members: [{devices: [dev-00004]}]\n")
        let moved = try cli.run(["apply", "fourth.json"])
        #expect(moved.status == 1)
        #expect(moved.stderr.contains("topic:extra changed since it was made"), "\(moved.stderr)")
    }

    @Test func removedTopicIsUnsubscribedAndAuthoritativeRemovalsAreCalledOut() throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        #expect(try cli.run(["apply", "--auto-approve"]).status == 0)
        try FileManager.default.removeItem(at: cli.project.appendingPathComponent("manifests/scores.yaml"))
        let plan = try cli.run(["plan", "--detailed-exitcode"])
        #expect(plan.status == 2)
        #expect(plan.stdout.contains("Destructive changes:"))
        #expect(plan.stdout.contains("(topic removed from the manifests)"))
        #expect(try cli.run(["apply", "--auto-approve"]).status == 0)
        #expect(try cli.run(["plan", "--detailed-exitcode"]).status == 0)
    }

    @Test func applyWithoutTerminalNeedsApproval() throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        let apply = try cli.run(["apply"])
        #expect(apply.status == 1)
        #expect(apply.stderr.contains("--auto-approve"))
    }

    @Test func everyCommandHasHelp() throws {
        let cli = try CLIRunner()
        defer { cli.remove() }
        for command in [
            [], ["validate"], ["plan"], ["apply"], ["show"], ["drift"], ["import"], ["audience"], ["fmt"],
            ["state"], ["state", "list"], ["state", "show"], ["state", "lock"], ["emulator", "serve"],
        ] {
            let help = try cli.run(command + ["--help"])
            #expect(help.status == 0)
            #expect(help.stdout.contains("USAGE:"))
        }
    }
}
