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
    }
}
