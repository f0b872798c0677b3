import Foundation
import Testing

@Suite struct BadInputTests {
    @Test func brokenYAMLNamesFileAndLine() throws {
        let cli = try CLIRunner()
        defer { cli.remove() }
        try cli.write("manifests/topics.yaml", "topics:\n  - name: a\n    members: [\n  - name: b\n")
        for command in [["validate"], ["plan"], ["apply", "--auto-approve"]] {
            let result = try cli.run(command)
            #expect(result.status == 1)
            #expect(result.stderr.contains("manifests/topics.yaml:4:"), "\(result.stderr)")
            #expect(result.stderr.contains("error: YAML syntax error"))
        }
    }

    @Test func manyProblemsAtOnce() throws {
        let cli = try CLIRunner()
        defer { cli.remove() }
        try cli.write(
            "manifests/inventory.yaml",
            "inventory:\n  devices:\n    - {id: d1, token: \"aaaa:APA91b\", labels: {region: north}}\n")
        try cli.write(
            "manifests/topics.yaml",
            """
            topics:
              - name: bad name
                members: [{devices: [d1]}]
              - name: ok
                mebmers: []
              - name: sel
                members: [{selector: {regin: north}}]
            """)
        let result = try cli.run(["validate"])
        #expect(result.status == 1)
        #expect(result.stderr.contains("manifests/topics.yaml:2:11: error: invalid topic name 'bad name'"))
        #expect(
            result.stderr.contains(
                "manifests/topics.yaml:5:5: error: unknown key 'mebmers' in a topic; did you mean 'members'?"))
        #expect(result.stderr.contains("manifests/topics.yaml:7:27: error: unknown label 'regin'"))
        #expect(result.stderr.contains("errors found"))
    }

    @Test func damagedStateIsRefusedAndLeftAlone() throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        try cli.write(".tidemark/state.db", "garbage, not SQLite")
        for command in [["plan"], ["apply", "--auto-approve"]] {
            let result = try cli.run(command)
            #expect(result.status == 1)
            #expect(result.stderr.contains(".tidemark/state.db is not a tidemark state file"), "\(result.stderr)")
        }
        #expect(
            try String(contentsOf: cli.project.appendingPathComponent(".tidemark/state.db"), encoding: .utf8)
                == "garbage, not SQLite")
    }

    @Test func missingManifestsAndUnknownBackend() throws {
        let cli = try CLIRunner()
        defer { cli.remove() }
        let empty = try cli.run(["plan"])
        #expect(empty.status == 1)
        #expect(empty.stderr.contains("no manifest files (*.yaml) in manifests"))
        let backend = try cli.run(["plan", "--backend", "cloud"])
        #expect(backend.status != 0)
        #expect(backend.stderr.contains("The value 'cloud' is invalid for '--backend <KIND>'"), "\(backend.stderr)")
        #expect(backend.stderr.contains("'embedded', 'emulator' or 'fcm'"))
        try cli.write("tidemark.yaml", "projekt: x\n")
        let settings = try cli.run(["plan"])
        #expect(
            settings.stderr.contains(
                "tidemark.yaml:1:1: error: unknown key 'projekt' in tidemark.yaml; did you mean 'project'?"))
    }

    @Test func garbagePlanFile() throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        try cli.write("plan.json", "{\"hello\": 1}")
        let result = try cli.run(["apply", "plan.json"])
        #expect(result.status == 1)
        #expect(result.stderr.contains("plan.json is not a tidemark plan file"))
    }
}
