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
            In a project that has a tidemark.yaml already, --ci adds only the pipeline. With --serve, \
            'tidemark serve' applies what merges and corrects drift, so the pipeline only checks and \
            plans each pull or merge request (the plan comment); it has no apply or drift job.
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

    @Flag(
        help:
            "'tidemark serve' applies and corrects drift: the pipeline only plans each pull or merge request (no apply or drift job)."
    )
    var serve = false

    func validate() throws {
        if serve, ci == .none {
            throw ValidationError("--serve shapes the CI pipeline: give --ci github or --ci gitlab.")
        }
        if let problem = ProjectSettings.projectIDProblem(project) {
            throw ValidationError("--project '\(project)' \(problem)")
        }
    }

    /// The files init writes, by path relative to the project directory, in the order written; with
    /// `pipelineOnly` (a project that exists), the pipeline's alone.
    func files(pipelineOnly: Bool = false, inventoryVariables: [String] = []) -> [(path: String, text: String)] {
        let serve = self.serve
        let recipe = { (path: String) in
            let text = Self.pipeline(EmbeddedFiles[path], inventoryVariables: inventoryVariables)
            return serve ? Self.planOnly(text) : text
        }
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

    /// A recipe for a project that `tidemark serve` applies: its header says so, and it keeps only the
    /// jobs that check and plan a request (the triggers of merges and schedules, and the apply and
    /// drift jobs, go).
    static func planOnly(_ text: String) -> String {
        var lines = text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        let github = lines.contains("jobs:")
        let header =
            github
            ? [
                "# tidemark on GitHub Actions beside 'tidemark serve': serve applies what merges and corrects drift",
                "# on its own (docs/serve.md); this workflow only plans every pull request, as one comment",
                "# updated in place on every push, which is what reviewers approve. It has no apply or drift job,",
                "# so CI and serve never both apply. Copy to .github/workflows/tidemark.yml. Secrets it needs:",
                "#   secrets.TIDEMARK_STATE_URL_READONLY the state through a role that can only SELECT (plans never",
                "#                                      write state)",
                "#   secrets.TIDEMARK_PLAN_KEY          base64 of 32 random bytes: seals the saved plan artifact",
                "#   vars.TIDEMARK_WORKSPACE            the state workspace serve reconciles (default: default)",
                "# See 'CI beside serve' in docs/ci.md.",
            ]
            : [
                "# tidemark on GitLab CI beside 'tidemark serve': serve applies what merges and corrects drift on",
                "# its own (docs/serve.md); this pipeline only checks and plans every merge request, as one note",
                "# updated in place on every push. It has no apply or drift job, so CI and serve never both apply.",
                "# Copy to .gitlab-ci.yml. CI/CD variables it needs: TIDEMARK_STATE_URL_READONLY (masked; a role",
                "# that can only SELECT), TIDEMARK_PLAN_KEY (masked), GITLAB_API_TOKEN (scope: api, to post the",
                "# note), TIDEMARK_WORKSPACE (the workspace serve reconciles). See 'CI beside serve' in docs/ci.md.",
            ]
        // The header is the comment block the recipe starts with.
        let body = lines.drop { $0.hasPrefix("#") }
        lines = header + body
        func cut(from start: (String) -> Bool, until end: (String) -> Bool) {
            guard let first = lines.firstIndex(where: start) else { return }
            let last = lines[(first + 1)...].firstIndex(where: end) ?? lines.endIndex
            lines.removeSubrange(first..<last)
        }
        if github {
            cut(from: { $0 == "  push:" }, until: { $0 == "  workflow_dispatch: {}" })
            cut(from: { $0 == "  apply:" }, until: { _ in false })
        } else {
            lines = lines.map { $0 == "stages: [check, plan, apply, drift]" ? "stages: [check, plan]" : $0 }
            cut(from: { $0 == "apply:" }, until: { _ in false })
        }
        while lines.last?.isEmpty == true { lines.removeLast() }
        return lines.joined(separator: "\n") + "\n"
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
        lines.append(serve ? Self.planOnlyNeeds(ci) : Self.pipelineNeeds(ci))
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

    /// What the plan-only pipeline (`--serve`) needs before it runs, as init says it.
    static func planOnlyNeeds(_ ci: CI) -> String {
        "The \(ci == .github ? "GitHub workflow" : "GitLab pipeline") only plans (tidemark serve applies and corrects drift): it needs \(ci == .github ? "the secrets" : "the CI/CD variables") TIDEMARK_STATE_URL_READONLY and TIDEMARK_PLAN_KEY\(ci == .gitlab ? " and GITLAB_API_TOKEN" : ""); see 'CI beside serve' in docs/ci.md."
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
        lines.append(serve ? Self.planOnlyNeeds(ci) : Self.pipelineNeeds(ci))
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
