import ArgumentParser
import Foundation
import TidemarkCore
import TidemarkRuntime

/// `tidemark schema`: the JSON Schema of manifests, for editors and CI.
struct SchemaCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "schema",
        abstract: "Print the JSON Schema that manifests follow.",
        discussion: """
            Editors that read a '# yaml-language-server: $schema=FILE' line (VS Code's YAML extension, \
            JetBrains IDEs) complete and check manifests with it. 'tidemark init' writes it beside the \
            manifests; refresh that copy after upgrading with: tidemark schema > manifests/tidemark-manifest.schema.json
            """
    )

    func run() throws {
        try Terminal.write(EmbeddedFiles["schema/tidemark-manifest.schema.json"])
    }
}

/// `tidemark init`: a project's first files, never over anything that exists.
struct InitCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "init",
        abstract: "Start a tidemark project: tidemark.yaml, a manifest, an example inventory and a CI recipe.",
        discussion: """
            Writes tidemark.yaml, manifests/topics.yaml (whose first line points editors at the schema, \
            written beside it), an example inventory in manifests/inventory/devices.csv and, with --ci, \
            the pipeline for GitHub Actions or GitLab CI. Nothing that exists is overwritten: when any \
            of these files exists, nothing at all is written. The project plans and applies at once \
            against the embedded backend; replace the example devices with yours before using FCM. \
            In a project that has a tidemark.yaml already, --ci adds only the pipeline.
            """
    )

    enum CI: String, ExpressibleByArgument, CaseIterable {
        case github, gitlab, none
    }

    @Option(name: .customShort("C"), help: ArgumentHelp("The directory to start the project in.", valueName: "DIR"))
    var directory: String = "."

    @Option(
        help: ArgumentHelp(
            "The Firebase project's id (6-30 lowercase letters, digits and hyphens, starting with a letter).",
            valueName: "ID"))
    var project = "my-firebase-project"

    @Option(help: ArgumentHelp("The CI pipeline to write: github, gitlab or none.", valueName: "CI"))
    var ci: CI = .none

    func validate() throws {
        if let problem = ProjectSettings.projectIDProblem(project) {
            throw ValidationError("--project '\(project)' \(problem)")
        }
    }

    /// The files init writes, by path relative to the project directory, in the order written; with
    /// `pipelineOnly` (a project that exists), the pipeline's alone.
    func files(pipelineOnly: Bool = false, inventoryVariables: [String] = []) -> [(path: String, text: String)] {
        let recipe = { (path: String) in Self.pipeline(EmbeddedFiles[path], inventoryVariables: inventoryVariables) }
        var files: [(String, String)] =
            pipelineOnly
            ? []
            : [
                ("tidemark.yaml", Self.settings(project: project)),
                ("manifests/tidemark-manifest.schema.json", EmbeddedFiles["schema/tidemark-manifest.schema.json"]),
                ("manifests/topics.yaml", Self.manifest),
                ("manifests/inventory/devices.csv", Self.inventory),
            ]
        switch ci {
        case .github:
            files.append((".github/workflows/tidemark.yml", recipe("examples/github/tidemark.yml")))
            files.append(
                (
                    ".github/actions/install-tidemark/action.yml",
                    EmbeddedFiles["examples/github/actions/install-tidemark/action.yml"]
                ))
        case .gitlab:
            files.append((".gitlab-ci.yml", recipe("examples/gitlab/.gitlab-ci.yml")))
        case .none:
            break
        }
        return files
    }

    /// A recipe with its inventory variable (`TIDEMARK_INVENTORY_URL`) named as the project's
    /// PostgreSQL sources name theirs (`url_env` in tidemark.yaml): each line that passes it becomes
    /// one line per variable. Unchanged when the project has no such source.
    static func pipeline(_ text: String, inventoryVariables: [String]) -> String {
        guard !inventoryVariables.isEmpty else { return text }
        var lines: [String] = []
        for line in text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init) {
            let live = !line.trimmingCharacters(in: .whitespaces).hasPrefix("#")
            guard live, line.contains("TIDEMARK_INVENTORY_URL") else {
                lines.append(line)
                continue
            }
            for variable in inventoryVariables {
                lines.append(line.replacingOccurrences(of: "TIDEMARK_INVENTORY_URL", with: variable))
            }
        }
        return lines.joined(separator: "\n")
    }

    /// Writes the pipeline's files into the project at `root`, never over one that exists.
    private func addPipeline(_ root: URL) throws {
        let fileManager = FileManager.default
        let variables = try Runtime.inventoryVariables(root: root.path, directory: directory)
        let written = files(pipelineOnly: true, inventoryVariables: variables)
        let existing = written.map(\.path).filter {
            fileManager.fileExists(atPath: root.appendingPathComponent($0).path)
        }
        guard existing.isEmpty else {
            Terminal.err(
                "error: tidemark init never overwrites a file, and \(existing.count == 1 ? "this one exists" : "these exist") in \(directory): \(existing.joined(separator: ", ")). Nothing was written; compare with 'tidemark init --ci \(ci.rawValue) -C NEW-DIR' and merge by hand."
            )
            throw ExitCode.failure
        }
        let done = try write(written, into: root)
        var lines = [
            "Added the \(ci == .github ? "GitHub Actions" : "GitLab CI") pipeline to the tidemark project in \(directory):"
        ]
        lines += done.map { "  \($0)" }
        lines.append("")
        lines.append(Self.pipelineNeeds(ci))
        if !variables.isEmpty {
            lines.append(
                "Its jobs pass the inventory's \(variables.joined(separator: ", ")) from CI secrets of the same names (plan jobs the _READONLY one: a role that can only SELECT); see 'An inventory in a private database' in docs/ci.md."
            )
        }
        try Terminal.write(lines.joined(separator: "\n") + "\n")
    }

    /// Writes `files` under `root` in order, never over a file (one may appear after the check);
    /// returns their paths. A failed write is said with the files written before it.
    private func write(_ files: [(path: String, text: String)], into root: URL) throws -> [String] {
        var done: [String] = []
        do {
            for (path, text) in files {
                let url = root.appendingPathComponent(path)
                try FileManager.default.createDirectory(
                    at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
                try Data(text.utf8).write(to: url, options: .withoutOverwriting)
                done.append(path)
            }
        } catch {
            Terminal.err(
                "error: writing \(files[done.count].path) in \(directory) failed (\(ErrorText.describe(error)))\(done.isEmpty ? "" : "; written before it: \(done.joined(separator: ", "))")."
            )
            throw ExitCode.failure
        }
        return done
    }

    /// What the pipeline needs before it runs, as init says it.
    static func pipelineNeeds(_ ci: CI) -> String {
        switch ci {
        case .github:
            "The GitHub workflow signs in without a key (workload identity federation): it needs the variables GCP_WORKLOAD_IDENTITY_PROVIDER and GCP_SERVICE_ACCOUNT, the secrets TIDEMARK_STATE_URL, TIDEMARK_STATE_URL_READONLY and TIDEMARK_PLAN_KEY, and the environments 'fcm-production' and 'fcm-drift': see the comment at its top and 'Keyless sign-in' in docs/ci.md."
        case .gitlab:
            "The GitLab pipeline signs in without a key (id_tokens and workload identity federation): it needs the CI/CD variables listed at its top (GCP_WORKLOAD_IDENTITY_PROVIDER, GCP_SERVICE_ACCOUNT, TIDEMARK_STATE_URL, TIDEMARK_PLAN_KEY, GITLAB_API_TOKEN, …): see 'Keyless sign-in' in docs/ci.md."
        case .none:
            "For pipelines, run 'tidemark init --ci github' or '--ci gitlab' in the project, or see docs/ci.md."
        }
    }

    func run() throws {
        let root = URL(fileURLWithPath: directory)
        let fileManager = FileManager.default
        // In a project that exists, --ci adds the pipeline and touches nothing else.
        let pipelineOnly =
            ci != .none && fileManager.fileExists(atPath: root.appendingPathComponent("tidemark.yaml").path)
        if pipelineOnly { return try addPipeline(root) }
        var written = files()
        let existing = written.map(\.path).filter {
            fileManager.fileExists(atPath: root.appendingPathComponent($0).path)
        }
        if existing.contains("tidemark.yaml") {
            Terminal.err(
                "error: \(directory) is a tidemark project already (tidemark.yaml exists); nothing was written. To add a pipeline to it, run 'tidemark init --ci github' or '--ci gitlab'."
            )
            throw ExitCode.failure
        }
        guard existing.isEmpty else {
            Terminal.err(
                "error: tidemark init never overwrites a file, and \(existing.count == 1 ? "this one exists" : "these exist") in \(directory): \(existing.joined(separator: ", ")). Nothing was written; move \(existing.count == 1 ? "it" : "them") aside or start the project in another directory with -C DIR."
            )
            throw ExitCode.failure
        }
        // .tidemark/ holds local state and the embedded backend's data: kept out of git.
        let gitignore = root.appendingPathComponent(".gitignore")
        var ignoreHint: String?
        if !fileManager.fileExists(atPath: gitignore.path) {
            // .emulator/ is where docs/emulator.md keeps `emulator serve --data`: it holds a private key.
            written.append((".gitignore", ".tidemark/\n.emulator/\n"))
        } else if let text = try? String(contentsOf: gitignore, encoding: .utf8) {
            let missing = [".tidemark", ".emulator"].filter { !text.contains($0) }
            if !missing.isEmpty {
                ignoreHint =
                    "Add \(missing.map { "'\($0)/'" }.joined(separator: " and ")) to .gitignore: .tidemark/ holds local state and the embedded backend's data, .emulator/ the emulator's data and private key (emulator serve --data .emulator)."
            }
        }
        let done = try write(written, into: root)
        var lines = ["Started a tidemark project in \(directory):"]
        lines += done.map { "  \($0)" }
        lines.append("")
        lines.append("Next:")
        lines.append(
            "  tidemark validate        # check the manifests (editors check them as you type, through the schema line)"
        )
        lines.append("  tidemark plan            # what would change, on the embedded backend (no account needed)")
        lines.append("  tidemark apply           # make it so")
        lines.append(
            "Then replace manifests/inventory/devices.csv with your devices (or read them from PostgreSQL or a command: docs/inventory.md), and plan against FCM with --backend fcm and a service account key in GOOGLE_APPLICATION_CREDENTIALS: production (CI, tidemark serve) needs 'backend: fcm'."
        )
        lines.append(Self.pipelineNeeds(ci))
        if let ignoreHint { lines.append(ignoreHint) }
        try Terminal.write(lines.joined(separator: "\n") + "\n")
    }

    static func settings(project: String) -> String {
        """
        # tidemark's project settings, written by 'tidemark init'. Every key is described in docs/state.md,
        # docs/fcm.md and docs/concepts.md; flags on the command line win over them.

        # The Firebase project whose topics and device groups tidemark manages.
        project: \(project)

        # Where plan and apply read and change FCM: embedded (an emulator inside tidemark, to try things
        # out), emulator ('tidemark emulator serve') or fcm (the real FCM, with a service account key in
        # GOOGLE_APPLICATION_CREDENTIALS). Production needs fcm: the CI recipes pass --backend fcm, and
        # 'tidemark serve' refuses embedded (it reaches no FCM) unless given --allow-embedded.
        backend: embedded

        # State: a SQLite file (the default, .tidemark/state.db), or a PostgreSQL URL that every CI
        # runner shares (docs/state.md). Keep a URL with a password in TIDEMARK_STATE_URL instead.
        # state: postgres://tidemark@db.example.com:5432/tidemark?sslmode=verify-full

        # How much of FCM a plan reads first: touched, sample (the default), all or none.
        # refresh: sample

        """
    }

    static let manifest = """
        # yaml-language-server: $schema=tidemark-manifest.schema.json
        # Which devices belong to which topics and device groups. Every *.yaml file in this directory is
        # read and merged (docs/manifests.md); 'tidemark validate' checks them, 'tidemark plan' shows
        # what would change in FCM.
        inventory:
          files: [inventory/devices.csv]
        topics:
          # Additive (the default): tidemark adds the declared devices and removes only what it added.
          - name: news-en
            description: News in English, for devices with an English locale.
            members:
              - selector: {locale: [en-GB, en-US]}
          # Authoritative: exactly these devices, among the devices tidemark knows.
          - name: beta-testers
            mode: authoritative
            members:
              - devices: [phone-0003, phone-0004]

        """

    /// Four example devices; their tokens have FCM's shape but belong to no app.
    static var inventory: String {
        let rows = [
            ("phone-0001", "android", "en-GB"), ("phone-0002", "ios", "fr-FR"), ("phone-0003", "android", "en-US"),
            ("phone-0004", "ios", "en-GB"),
        ]
        var lines = ["device_id,token,platform,locale"]
        for (index, row) in rows.enumerated() {
            let prefix = "example\(String(format: "%04d", index + 1)):APA91b"
            let token = prefix + String(repeating: "ExampleTokenNotARealDevice", count: 6).prefix(152 - prefix.count)
            lines.append("\(row.0),\(token),\(row.1),\(row.2)")
        }
        return lines.joined(separator: "\n") + "\n"
    }
}
