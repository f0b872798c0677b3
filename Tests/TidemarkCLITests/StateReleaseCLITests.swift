import Foundation
import Testing

/// `tidemark state rm`, `removed:` in a manifest, and `tidemark version`, as a person runs them.
struct StateReleaseCLITests {
    static let opsWithoutCanary = """
        groups:
          - notification_key_name: user-u1085
            members: [{selector: {user: u1085}}]
          - notification_key_name: user-u1138
            members: [{selector: {user: u1138}}]
          - notification_key_name: user-u1004
            members: [{selector: {user: u1004}}]
          - notification_key_name: oncall-phones
            members:
              - devices: [oncall-iphone-15, oncall-pixel-8]
        removed:
          - {topic: ops-canary, unsubscribe: false}

        """

    @Test func aProtectedTopicIsReleasedThroughAPlanAndByStateRm() throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        #expect(try cli.run(["apply", "--auto-approve"]).status == 0)

        // Through the manifests: the plan shows the release, sends nothing, and apply forgets the topic.
        try cli.write("manifests/ops.yaml", Self.opsWithoutCanary)
        let plan = try cli.run(["plan", "--detailed-exitcode"])
        #expect(plan.status == 2, "\(plan.stdout)\(plan.stderr)")
        #expect(plan.stdout.contains("= ops-canary"), "\(plan.stdout)")
        #expect(plan.stdout.contains("its 3 known subscribers stay subscribed"), "\(plan.stdout)")
        #expect(plan.stdout.contains("applying it sends nothing to FCM"), "\(plan.stdout)")
        #expect(!plan.stdout.contains("Destructive"), "\(plan.stdout)")
        let apply = try cli.run(["apply", "--auto-approve"])
        #expect(apply.status == 0 && apply.stdout.contains("1 released; 0 requests"), "\(apply.stdout)\(apply.stderr)")
        let list = try cli.run(["state", "list", "--format", "json"])
        #expect(!list.stdout.contains("\"ops-canary\""), "\(list.stdout)")
        #expect(try cli.run(["plan", "--detailed-exitcode"]).status == 0, "the entry may stay")

        // Declared again: adopted, nothing sent.
        try FileManager.default.removeItem(at: cli.project.appendingPathComponent("manifests/ops.yaml"))
        try FileManager.default.copyItem(
            at: CLIRunner.repositoryRoot.appendingPathComponent("manifests/ops.yaml"),
            to: cli.project.appendingPathComponent("manifests/ops.yaml"))
        let adopt = try cli.run(["apply", "--auto-approve"])
        #expect(adopt.stdout.contains("3 memberships adopted; 0 requests"), "\(adopt.stdout)\(adopt.stderr)")
        #expect(try cli.run(["plan", "--detailed-exitcode"]).status == 0)

        // From the command line: at once, nothing sent; a wrong address changes nothing.
        let wrong = try cli.run(["state", "rm", "topic:ops-canry", "group:oncall-phones"])
        #expect(wrong.status == 1, "\(wrong.stdout)")
        #expect(wrong.stderr.contains("holds no topic:ops-canry (closest: topic:ops-canary)"), "\(wrong.stderr)")
        #expect(wrong.stderr.contains("Nothing was changed"))
        let bare = try cli.run(["state", "rm", "ops-canary"])
        #expect(bare.status == 1 && bare.stderr.contains("is not an address"), "\(bare.stderr)")
        let released = try cli.run(["state", "rm", "topic:ops-canary", "group:oncall-phones", "--format", "json"])
        #expect(released.status == 0, "\(released.stderr)")
        let object = try #require(try JSONSerialization.jsonObject(with: Data(released.stdout.utf8)) as? [String: Any])
        let entries = try #require(object["released"] as? [[String: Any]])
        #expect(entries.map { $0["address"] as? String } == ["topic:ops-canary", "group:oncall-phones"])
        #expect(entries.first?["observed"] as? Int == 3)
        let help = try cli.run(["state", "rm", "--help"])
        #expect(
            help.status == 0
                && help.stdout.split(whereSeparator: \.isWhitespace).joined(separator: " ").contains(
                    "nothing is sent to FCM"),
            "\(help.stdout)")
    }

    /// The demo's ops-canary moved to workspace `ops` of the same file, declared in manifests of its own.
    static func moveCanaryToOps(_ cli: CLIRunner) throws -> CLIRunner.Result {
        let manifests = cli.project.appendingPathComponent("manifests")
        let ops = try String(contentsOf: manifests.appendingPathComponent("ops.yaml"), encoding: .utf8)
        let canary = String(
            ops[ops.range(of: "  - name: ops-canary")!.lowerBound..<ops.range(of: "# Device groups")!.lowerBound])
        try cli.write("ops/ops.yaml", "topics:\n" + canary)
        try FileManager.default.copyItem(
            at: manifests.appendingPathComponent("inventory.yaml"),
            to: cli.project.appendingPathComponent("ops/inventory.yaml"))
        try FileManager.default.copyItem(
            at: manifests.appendingPathComponent("inventory"), to: cli.project.appendingPathComponent("ops/inventory"))
        let moved = try cli.run(["state", "mv", "topic:ops-canary", "--to-workspace", "ops"])
        try cli.write(
            "manifests/ops.yaml",
            String(ops[..<ops.range(of: "topics:")!.lowerBound])
                + Self.opsWithoutCanary
                .replacingOccurrences(of: "removed:\n  - {topic: ops-canary, unsubscribe: false}\n", with: ""))
        return moved
    }

    @Test func aTopicMovesBetweenWorkspacesAndStoresAndBothPlansAreEmpty() throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        #expect(try cli.run(["apply", "--auto-approve"]).status == 0)
        let moved = try Self.moveCanaryToOps(cli)
        #expect(moved.status == 0, "\(moved.stderr)")
        #expect(moved.stdout.contains("Moved topic:ops-canary with 3 managed memberships"), "\(moved.stdout)")
        #expect(moved.stdout.contains("nothing was sent to FCM"))
        // The source's manifests still declared it when it moved: said, so two workspaces never
        // manage one topic unnoticed.
        #expect(
            moved.stderr.contains("warning: workspace 'default' still declares topic:ops-canary (manifests/ops.yaml:"),
            "\(moved.stderr)")
        #expect(try cli.run(["plan", "--detailed-exitcode"]).status == 0, "the source has nothing left to do")
        let ops = try cli.run(["plan", "--workspace", "ops", "--manifests", "ops", "--detailed-exitcode"])
        #expect(ops.status == 0, "\(ops.stdout)\(ops.stderr)")
        // What the target holds already, or the source does not, is refused with nothing written.
        let again = try cli.run(["state", "mv", "topic:ops-canary", "--to-workspace", "ops"])
        #expect(again.status == 1 && again.stderr.contains("holds no topic:ops-canary"), "\(again.stderr)")
        let back = try cli.run(["state", "mv", "group:user-u1085", "--to-workspace", "default", "--workspace", "ops"])
        #expect(back.status == 1 && back.stderr.contains("holds no group:user-u1085"), "\(back.stderr)")
        let same = try cli.run(["state", "mv", "group:user-u1085", "--to-workspace", "default"])
        #expect(same.status == 1 && same.stderr.contains("give another workspace"), "\(same.stderr)")
        let help = try cli.run(["state", "mv", "--help"])
        #expect(
            help.status == 0
                && help.stdout.split(whereSeparator: \.isWhitespace).joined(separator: " ").contains(
                    "never acted on in two places"),
            "\(help.stdout)")

        // Into PostgreSQL, then to another workspace of that database (one transaction, no journal).
        guard let url = PostgresForCLI.url else { return }
        let ws = "mv-\(UUID().uuidString.prefix(8).lowercased())"
        let toPostgres = try cli.run([
            "state", "mv", "topic:ops-canary", "--workspace", "ops", "--to-state", url, "--to-workspace", ws,
        ])
        #expect(toPostgres.status == 0, "\(toPostgres.stderr)")
        let within = try cli.run([
            "state", "mv", "topic:ops-canary", "--state", url, "--workspace", ws, "--to-workspace", ws + "-b",
            "--format", "json",
        ])
        #expect(within.status == 0, "\(within.stderr)")
        let listed = try cli.run(["state", "list", "--state", url, "--workspace", ws + "-b", "--format", "json"])
        let object = try #require(try JSONSerialization.jsonObject(with: Data(listed.stdout.utf8)) as? [String: Any])
        #expect((object["topics"] as? [[String: Any]])?.map { $0["name"] as? String } == ["ops-canary"])
        #expect((object["applies"] as? [Any])?.isEmpty == true, "within one database the move journals nothing")
        let plan = try cli.run([
            "plan", "--state", url, "--workspace", ws + "-b", "--manifests", "ops", "--detailed-exitcode",
        ])
        #expect(plan.status == 0, "\(plan.stdout)\(plan.stderr)")
        #expect(try cli.run(["plan", "--workspace", "ops", "--manifests", "ops", "--detailed-exitcode"]).status == 2)
        for workspace in [ws, ws + "-b"] {
            _ = try cli.run(["workspace", "delete", workspace, "--state", url, "--force"])
        }
    }

    @Test func versionSaysWhatWasBuiltAndWhatItReads() throws {
        let cli = try CLIRunner()
        defer { cli.remove() }
        let line = try cli.run(["--version"])
        #expect(line.status == 0)
        #expect(line.stdout.hasPrefix("0.1.0 (commit "), "\(line.stdout)")
        let text = try cli.run(["version"])
        #expect(text.stdout.contains("SQLite state file: reads 1–2, writes 2"), "\(text.stdout)")
        let json = try cli.run(["version", "--format", "json"])
        let object = try #require(try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [String: Any])
        let commit = try #require(object["commit"] as? String)
        // Built from this checkout: git's commit, never "unknown".
        #expect(commit.range(of: "^[0-9a-f]{40}(-dirty)?$", options: .regularExpression) != nil, "\(commit)")
        #expect((object["built"] as? String)?.count == 10)
        #expect(
            (object["formats"] as? [[String: Any]])?.map { $0["name"] as? String } == [
                "sqlite_state", "postgres_schema", "saved_plan", "sealed_plan",
            ])
    }
}
