import Foundation
import Testing
import TidemarkTesting

/// Sources in tidemark.yaml, or in a file it names, end to end with an `exec` source.
@Suite struct ConfiguredSourceCLITests {
    static func project() throws -> CLIRunner {
        let cli = try CLIRunner()
        let lines = (0..<6).map {
            "{\"id\": \"d\($0)\", \"token\": \"\(Fixtures.token($0, prefix: "ex"))\", \"labels\": {\"platform\": \"\($0 % 2 == 0 ? "ios" : "android")\"}}"
        }
        try cli.write("exports/devices.jsonl", lines.joined(separator: "\n") + "\n")
        try cli.write("manifests/topics.yaml", "topics:\n  - name: ios\n    members: [{selector: {platform: ios}}]\n")
        return cli
    }

    @Test func aFileNamedByTidemarkYamlHoldsTheSources() throws {
        let cli = try Self.project()
        defer { cli.remove() }
        try cli.write("tidemark.yaml", "inventory: ops/inventory.yaml\n")
        try cli.write("ops/inventory.yaml", "- name: export\n  exec: {command: [cat, exports/devices.jsonl]}\n")
        let validate = try cli.run(["validate"])
        #expect(validate.status == 0, "\(validate.stderr)")
        #expect(validate.stdout.contains("6 devices"), "\(validate.stdout)")
        let plan = try cli.run(["plan"])
        #expect(plan.stdout.contains("Inventory read: export 6 devices sha256:"), "\(plan.stdout)")
        // Inside the manifests directory, which pull requests edit: refused.
        try cli.write("manifests/sources.yaml", "- name: export\n  exec: {command: [cat, exports/devices.jsonl]}\n")
        try cli.write("tidemark.yaml", "inventory: manifests/sources.yaml\n")
        let inside = try cli.run(["validate"])
        #expect(inside.status == 1 && inside.stderr.contains("is inside the manifests directory"), "\(inside.stderr)")
    }

    @Test func anEmptyExportIsRefusedUnlessAllowed() throws {
        let cli = try Self.project()
        defer { cli.remove() }
        try cli.write("exports/devices.jsonl", "")
        try cli.write(
            "tidemark.yaml", "inventory:\n  - name: export\n    exec: {command: [cat, exports/devices.jsonl]}\n")
        let refused = try cli.run(["plan"])
        #expect(refused.status == 1)
        #expect(
            refused.stderr.contains(
                "tidemark.yaml:2:5: error: inventory source 'export' failed: 'cat exports/devices.jsonl' printed no devices"
            ),
            "\(refused.stderr)")
        try cli.write(
            "tidemark.yaml",
            "inventory:\n  - name: export\n    allow_empty: true\n    exec: {command: [cat, exports/devices.jsonl]}\n")
        try cli.write("manifests/topics.yaml", "topics:\n  - name: ios\n    allow_empty: true\n    members: []\n")
        let allowed = try cli.run(["plan"])
        #expect(allowed.status == 0, "\(allowed.stdout)\(allowed.stderr)")
    }

    /// An export that prints a few of its devices and exits 0 is not planned as the rest leaving:
    /// plan and apply stop with the counts; `--allow-shrink` or `max_shrink` on the source accepts it.
    @Test func anExportThatPrintsAFewOfItsDevicesIsRefused() throws {
        let cli = try CLIRunner()
        defer { cli.remove() }
        func export(_ count: Int) throws {
            let lines = (0..<count).map {
                "{\"id\": \"d\($0)\", \"token\": \"\(Fixtures.token($0, prefix: "sh"))\", \"labels\": {\"platform\": \"ios\"}}"
            }
            try cli.write("exports/devices.jsonl", lines.joined(separator: "\n") + "\n")
        }
        try export(300)
        try cli.write("manifests/topics.yaml", "topics:\n  - name: ios\n    members: [{selector: {platform: ios}}]\n")
        try cli.write(
            "tidemark.yaml", "inventory:\n  - name: export\n    exec: {command: [cat, exports/devices.jsonl]}\n")
        let first = try cli.run(["apply", "--auto-approve"])
        #expect(first.status == 0, "\(first.stderr)")
        try export(3)
        for command in [["plan"], ["apply", "--auto-approve"]] {
            let refused = try cli.run(command)
            #expect(refused.status == 1, "\(command)")
            #expect(
                refused.stderr.contains("inventory source 'export' read 3 devices, 99% fewer than the 300"),
                "\(refused.stderr)")
            #expect(refused.stderr.contains("--allow-shrink"))
            #expect(!refused.stdout.contains("unsubscribe"), "\(refused.stdout)")
        }
        let plan = try cli.run(["plan", "--allow-shrink"])
        #expect(plan.status == 0, "\(plan.stderr)")
        #expect(plan.stdout.contains("297"), "\(plan.stdout)")
        try cli.write(
            "tidemark.yaml",
            "inventory:\n  - name: export\n    max_shrink: 100%\n    exec: {command: [cat, exports/devices.jsonl]}\n")
        #expect(try cli.run(["plan"]).status == 0)
    }
}
