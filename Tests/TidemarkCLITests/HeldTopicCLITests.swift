import Foundation
import Testing

/// Held topics at the command line: `plan` says what a rail would hold and what would go on beside
/// it, `apply` refuses the whole plan unless `--skip-held`, and `init --serve` writes a pipeline that
/// only plans.
struct HeldTopicCLITests {
    static func manifests(narrow: Bool) -> String {
        """
        topics:
          - name: storms
            mode: authoritative
            max_unsubscribes: 10%
            members: [{selector: {region: \(narrow ? "none-such-region-but-south" : "north")}}]
          - name: everyone
            members: [{devices: [\((0..<20).map { "d\($0)" }.joined(separator: ", "))]}]

        """
    }

    static func inventory(_ count: Int) -> String {
        "device_id,token,region\n"
            + (0..<count).map {
                "d\($0),d\($0)-\(String(repeating: "x", count: 8)):APA91b\(String(repeating: "t", count: 140)),\($0 % 2 == 0 ? "north" : "south")"
            }
            .joined(separator: "\n") + "\n"
    }

    @Test func planNamesWhatIsHeldAndApplySkipsItOnlyWhenAsked() throws {
        let cli = try CLIRunner()
        defer { cli.remove() }
        try cli.write("tidemark.yaml", "project: held-cli\nbackend: embedded\n")
        try cli.write("manifests/inventory.csv", Self.inventory(20))
        try cli.write("manifests/inv.yaml", "inventory:\n  files: [inventory.csv]\n")
        try cli.write(
            "manifests/topics.yaml", Self.manifests(narrow: false).replacingOccurrences(of: "d19]", with: "d9]"))
        let first = try cli.run(["apply", "--auto-approve"])
        #expect(first.status == 0, "\(first.stderr)")
        // The edit: storms loses every member past its rail; everyone gains ten devices.
        try cli.write(
            "manifests/topics.yaml",
            Self.manifests(narrow: true).replacingOccurrences(of: "none-such-region-but-south", with: "south"))
        let plan = try cli.run(["plan"])
        #expect(plan.status == 1, "\(plan.stdout)\(plan.stderr)")
        #expect(
            plan.stdout.contains("Held by a rail: 'tidemark apply' refuses the whole plan; with --skip-held"),
            "\(plan.stdout)")
        #expect(plan.stdout.contains("‖ topic:storms  rail.max_unsubscribes at manifests/topics.yaml:2:11"))
        #expect(
            plan.stdout.contains("and the rest would be applied: +1 −0 memberships in 1 topic (1 operation)."),
            "\(plan.stdout)")
        let refused = try cli.run(["apply", "--auto-approve"])
        #expect(refused.status == 1)
        let skipping = try cli.run(["plan", "--skip-held", "--detailed-exitcode"])
        #expect(skipping.status == 2, "\(skipping.stdout)\(skipping.stderr)")
        #expect(skipping.stdout.contains("Held by a rail (not in this plan; its changes wait until its plan passes):"))
        let json = try cli.run(["plan", "--skip-held", "--format", "json"])
        let decoded = try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [String: Any]
        let held = try #require(decoded?["held"] as? [[String: Any]])
        #expect((held.first?["subject"] as? [String: String]) == ["kind": "topic", "name": "storms"])
        let applied = try cli.run(["apply", "--skip-held", "--auto-approve"])
        #expect(applied.status == 0, "\(applied.stderr)")
        // Only the held topic's changes are left.
        let after = try cli.run(["plan", "--format", "json"])
        let rest = try JSONSerialization.jsonObject(with: Data(after.stdout.utf8)) as? [String: Any]
        let operations = try #require(rest?["operations"] as? [[String: Any]])
        #expect(!operations.isEmpty && operations.allSatisfy { $0["target"] as? String == "storms" }, "\(operations)")
    }

    @Test func initWithServeWritesAPipelineThatOnlyPlans() throws {
        let cli = try CLIRunner()
        defer { cli.remove() }
        let github = try cli.run(["init", "--ci", "github", "--serve", "-C", "gh"])
        #expect(github.status == 0, "\(github.stderr)")
        #expect(github.stdout.contains("only plans (tidemark serve applies and corrects drift)"))
        let workflow = try String(
            contentsOf: cli.project.appendingPathComponent("gh/.github/workflows/tidemark.yml"), encoding: .utf8)
        let lines = workflow.split(separator: "\n").map(String.init)
        #expect(lines.contains("  plan:") && !lines.contains("  apply:") && !lines.contains("  drift:"))
        #expect(!lines.contains("  schedule:") && !lines.contains("  push:"))
        #expect(workflow.hasPrefix("# tidemark on GitHub Actions beside 'tidemark serve'"))
        let gitlab = try cli.run(["init", "--ci", "gitlab", "--serve", "-C", "gl"])
        #expect(gitlab.status == 0, "\(gitlab.stderr)")
        let pipeline = try String(contentsOf: cli.project.appendingPathComponent("gl/.gitlab-ci.yml"), encoding: .utf8)
        let jobs = pipeline.split(separator: "\n").map(String.init)
        #expect(jobs.contains("stages: [check, plan]") && jobs.contains("plan:"))
        #expect(!jobs.contains("apply:") && !jobs.contains("drift:"))
        let alone = try cli.run(["init", "--serve", "-C", "x"])
        #expect(alone.status != 0 && alone.stderr.contains("--serve shapes the CI pipeline"))
    }
}
