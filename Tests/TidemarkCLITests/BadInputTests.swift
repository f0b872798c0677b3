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

    /// Every error a user can cause is one line that says what, where and what to do: no Foundation or
    /// Swift dump, no misleading reason, and no hang on a FIFO.
    @Test func everyFileProblemIsOneClearLine() throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        func expectOneLine(
            _ result: CLIRunner.Result, _ parts: [String], sourceLocation: SourceLocation = #_sourceLocation
        ) {
            #expect(result.status == 1, sourceLocation: sourceLocation)
            for part in parts {
                #expect(result.stderr.contains(part), "\(result.stderr)", sourceLocation: sourceLocation)
            }
            for dump in ["Error Domain", "NSCocoaErrorDomain", "DecodingError", "CodingKeys", "NSFilePath"] {
                #expect(!result.stderr.contains(dump), "\(result.stderr)", sourceLocation: sourceLocation)
            }
        }
        // A FIFO as an inventory file and as a plan file: refused at once (opening one must not block).
        let fifo = cli.project.appendingPathComponent("manifests/pipe.csv").path
        #expect(mkfifo(fifo, 0o600) == 0)
        try cli.write("manifests/pipe.yaml", "inventory:\n  files: [pipe.csv]\n")
        expectOneLine(try cli.run(["validate"]), ["manifests/pipe.yaml:2:11", "pipe.csv", "not a regular file"])
        expectOneLine(try cli.run(["apply", "manifests/pipe.csv"]), ["pipe.csv", "not a regular file"])
        try FileManager.default.removeItem(atPath: fifo)
        try FileManager.default.removeItem(atPath: cli.project.appendingPathComponent("manifests/pipe.yaml").path)
        // A manifest that cannot be read, and a plan file that is a directory.
        let secret = cli.project.appendingPathComponent("manifests/secret.yaml").path
        try cli.write("manifests/secret.yaml", "topics: []\n")
        if getuid() != 0 {  // root reads everything
            chmod(secret, 0)
            expectOneLine(try cli.run(["validate"]), ["manifests/secret.yaml", "permission denied"])
        }
        try FileManager.default.removeItem(atPath: secret)
        try FileManager.default.createDirectory(
            at: cli.project.appendingPathComponent("plan.json"), withIntermediateDirectories: true)
        expectOneLine(try cli.run(["apply", "plan.json"]), ["plan file plan.json", "is a directory"])
        expectOneLine(try cli.run(["show", "missing.json"]), ["missing.json", "no such file"])
        // state: naming a directory says so, not "the file is empty".
        try cli.write("tidemark.yaml", "state: somewhere\n")
        try FileManager.default.createDirectory(
            at: cli.project.appendingPathComponent("somewhere"), withIntermediateDirectories: true)
        let directory = try cli.run(["plan"])
        expectOneLine(directory, ["somewhere", "is a directory"])
        #expect(!directory.stderr.contains("empty"))
        // A plan file whose JSON has the wrong shape names the place.
        try cli.write("tidemark.yaml", "")
        try cli.write("bad.json", #"{"format_version": 1, "operations": [{"kind": 7}]}"#)
        expectOneLine(try cli.run(["apply", "bad.json"]), ["bad.json is not a valid tidemark plan"])
        // Limits from tidemark.yaml apply to every input.
        try cli.write("tidemark.yaml", "limits:\n  manifest_bytes: 10\n")
        expectOneLine(try cli.run(["validate"]), ["limits.manifest_bytes"])
    }

    /// Manifests, token files and inventories are read only from inside the project: a path that climbs
    /// out, an absolute path and a symlink that leads out are refused with the path they lead to, before
    /// anything is read; a manifest that is a symlink out or a FIFO is named and refused, not skipped.
    @Test func filesOutsideTheProjectAreNeverRead() throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        let manifests = cli.project.appendingPathComponent("manifests")
        try cli.write(
            "manifests/escape.yaml",
            """
            topics:
              - name: escape
                members:
                  - file: ../../../../../../etc/passwd
                  - file: /etc/hostname
                  - file: shadow.txt

            """)
        try FileManager.default.createSymbolicLink(
            atPath: manifests.appendingPathComponent("shadow.txt").path, withDestinationPath: "/etc/shadow")
        try FileManager.default.createSymbolicLink(
            atPath: manifests.appendingPathComponent("linked.csv").path, withDestinationPath: "/etc/passwd")
        try FileManager.default.createSymbolicLink(
            atPath: manifests.appendingPathComponent("passwd.yaml").path, withDestinationPath: "/etc/passwd")
        #expect(mkfifo(manifests.appendingPathComponent("pipe.yaml").path, 0o600) == 0)
        for command in [["validate"], ["plan"], ["fmt", "--check"]] {
            let result = try cli.run(command)
            #expect(result.status == 1, "\(command)")
            let expected =
                command == ["fmt", "--check"]
                ? ["manifests/passwd.yaml", "manifests/pipe.yaml"]
                : [
                    "manifests/escape.yaml:4:", "manifests/escape.yaml:5:", "manifests/escape.yaml:6:",
                    "manifests/passwd.yaml", "manifests/pipe.yaml",
                ]
            for part in expected + ["outside the project directory"] {
                #expect(result.stderr.contains(part), "\(command) \(part): \(result.stderr)")
            }
            #expect(result.stderr.contains("not a regular file"), "\(result.stderr)")
            // Nothing read from those files reaches the output.
            #expect(!result.stderr.contains("root:"), "\(result.stderr)")
            #expect(!result.stdout.contains("root:"))
        }
        for name in ["escape.yaml", "shadow.txt", "passwd.yaml", "pipe.yaml"] {
            try FileManager.default.removeItem(at: manifests.appendingPathComponent(name))
        }
        // An inventory file that leads out.
        try cli.write("manifests/more.yaml", "inventory:\n  files: [linked.csv]\n")
        let inventory = try cli.run(["plan"])
        #expect(inventory.status == 1)
        #expect(inventory.stderr.contains("manifests/more.yaml:2:11"), "\(inventory.stderr)")
        #expect(inventory.stderr.contains("outside the project directory '.' (it leads to /etc/passwd)"))
        try FileManager.default.removeItem(at: manifests.appendingPathComponent("more.yaml"))
        try FileManager.default.removeItem(at: manifests.appendingPathComponent("linked.csv"))
        // A symlink that stays inside the project is followed as before.
        let testers = manifests.appendingPathComponent("tokens/radar-beta-testers.txt")
        try FileManager.default.moveItem(at: testers, to: cli.project.appendingPathComponent("testers.txt"))
        try FileManager.default.createSymbolicLink(atPath: testers.path, withDestinationPath: "../../testers.txt")
        let inside = try cli.run(["validate"])
        #expect(inside.status == 0, "\(inside.stderr)")
    }

    /// Command lines the campaign found accepted: help for a command that does not exist, an empty
    /// device, rates of infinity.
    @Test func commandLinesThatMeanNothingExit64() throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        let help = try cli.run(["help", "nosuchcommand"])
        #expect(help.status == 64)
        #expect(help.stderr.contains("no command 'nosuchcommand'"), "\(help.stderr)")
        #expect(try cli.run(["help", "state", "lock"]).status == 0)
        for arguments in [
            ["device", ""], ["apply", "--qps", "inf"], ["plan", "--read-qps", "1e400"], ["apply", "--qps", "nan"],
        ] {
            let result = try cli.run(arguments)
            #expect(result.status == 64, "\(arguments): \(result.stderr)")
        }
    }

    /// A command line tidemark does not understand exits 64 (documented), never 0, 1 or 2.
    @Test func usageErrorsExit64AsDocumented() throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        for arguments in [
            ["plan", "--bogus"], ["frobnicate"], ["apply", "a.json", "b.json"], ["apply", "--format", "markdown"],
        ] {
            let result = try cli.run(arguments)
            #expect(result.status == 64, "\(arguments)")
            // One style for every error, the command line's included.
            #expect(result.stderr.hasPrefix("error: "), "\(arguments): \(result.stderr)")
        }
        let help = try cli.run(["--help"]).stdout.split(whereSeparator: \.isWhitespace).joined(separator: " ")
        #expect(help.contains("64 a command line tidemark does not understand"), "\(help)")
    }

    /// `plan --out` killed mid-write leaves a temporary file with full tokens; the next write removes
    /// it, and a write that fails leaves none.
    @Test func planTemporariesNeverOutliveTheirWriter() throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        // What a killed writer leaves: pid 999999 does not run.
        try cli.write("plan.json.tmp-999999", "{\"tokens\": \"full\"}")
        let plan = try cli.run(["plan", "--out", "plan.json"])
        #expect(plan.status == 0 || plan.status == 2, "\(plan.stderr)")
        let names = try FileManager.default.contentsOfDirectory(atPath: cli.project.path)
        #expect(!names.contains { $0.contains(".tmp-") }, "\(names)")
        let mode =
            try FileManager.default.attributesOfItem(
                atPath: cli.project.appendingPathComponent("plan.json").path)[.posixPermissions] as? Int
        #expect(mode == 0o600)
        // A write into a directory that does not exist fails in one line and leaves nothing.
        let failed = try cli.run(["plan", "--out", "nowhere/plan.json"])
        #expect(failed.status == 1)
        #expect(failed.stderr.contains("cannot write nowhere/plan.json"))
    }
}
