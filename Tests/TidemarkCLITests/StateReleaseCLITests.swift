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
        #expect(help.status == 0 && help.stdout.contains("nothing is sent to FCM"), "\(help.stdout)")
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
