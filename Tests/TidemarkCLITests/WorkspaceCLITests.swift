import Foundation
import Testing

/// `tidemark workspace list`: every workspace of a SQLite state file, the current one marked.
struct WorkspaceCLITests {
    @Test func workspaceListNamesEveryWorkspaceOfTheFile() throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        let empty = try cli.run(["workspace", "list"])
        #expect(empty.status == 0 && empty.stdout.contains("No workspace in"), "\(empty.stdout)\(empty.stderr)")
        #expect(try cli.run(["apply", "--auto-approve"]).status == 0)
        #expect(try cli.run(["apply", "--auto-approve", "--workspace", "Staging-EU"]).status == 0)
        let text = try cli.run(["workspace", "list", "--workspace", "Staging-EU"])
        #expect(text.status == 0, "\(text.stderr)")
        let lines = text.stdout.split(separator: "\n").map(String.init)
        #expect(lines.first?.hasPrefix("Workspaces in .tidemark/state.db") == true, "\(text.stdout)")
        #expect(lines.count == 4, "\(text.stdout)")
        #expect(lines.contains { $0.hasPrefix("*  Staging-EU  ") && $0.contains("finished, ") && $0.hasSuffix("free") })
        #expect(lines.contains { $0.hasPrefix("   default  ") }, "\(text.stdout)")
        let json = try cli.run(["workspace", "list", "--format", "json"])
        let object = try #require(try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [String: Any])
        let workspaces = try #require(object["workspaces"] as? [[String: Any]])
        #expect(workspaces.map { $0["name"] as? String } == ["Staging-EU", "default"])
        #expect(workspaces.map { $0["current"] as? Bool } == [false, true])
        #expect(workspaces.allSatisfy { ($0["tokens"] as? Int ?? 0) >= 3000 && ($0["serial"] as? Int ?? 0) > 0 })
        #expect(Set(workspaces.map { $0["memberships"] as? Int }).count == 1, "the same demo in both")
        let help = try cli.run(["workspace", "list", "--help"])
        #expect(help.status == 0 && help.stdout.contains("the current one marked"))

        // Delete: refused while it manages memberships, done with --force; the other workspace stays.
        let refused = try cli.run(["workspace", "delete", "Staging-EU"])
        #expect(refused.status == 1 && refused.stderr.contains("workspace 'Staging-EU' manages 11,085 memberships"))
        #expect(refused.stderr.contains("Nothing was deleted"), "\(refused.stderr)")
        let unknown = try cli.run(["workspace", "delete", "nowhere"])
        #expect(unknown.status == 1 && unknown.stderr.contains("no workspace 'nowhere'"), "\(unknown.stderr)")
        let bad = try cli.run(["workspace", "delete", "no/such"])
        #expect(bad.status != 0 && bad.stderr.contains("WORKSPACE must be 1 to 100 letters"), "\(bad.stderr)")
        let deleted = try cli.run(["workspace", "delete", "Staging-EU", "--force"])
        #expect(deleted.status == 0 && deleted.stdout.contains("Deleted workspace 'Staging-EU'"), "\(deleted.stderr)")
        #expect(deleted.stdout.contains("the 11,085 memberships it managed stay in FCM, unmanaged"))
        let after = try cli.run(["workspace", "list", "--format", "json"])
        let left = try #require(try JSONSerialization.jsonObject(with: Data(after.stdout.utf8)) as? [String: Any])
        #expect((left["workspaces"] as? [[String: Any]])?.map { $0["name"] as? String } == ["default"])
        let plan = try cli.run(["plan", "--detailed-exitcode"])
        #expect(plan.status == 0, "the default workspace is untouched: \(plan.stdout)\(plan.stderr)")
    }
}
