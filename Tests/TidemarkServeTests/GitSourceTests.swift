import Foundation
import Synchronization
import Testing
import TidemarkCore
import TidemarkRuntime
import TidemarkTesting

@testable import TidemarkServe

/// A git repository on disk holding a project's manifests, edited and committed as a team would.
struct ManifestRepository {
    let root: URL

    init() throws {
        root = FileManager.default.temporaryDirectory.appendingPathComponent("tm-git-\(UUID().uuidString)")
        try FileManager.default.createDirectory(
            at: root.appendingPathComponent("manifests"), withIntermediateDirectories: true)
        try git("init", "--quiet", "-b", "main")
    }

    /// Runs git in the repository; its stdout.
    @discardableResult
    func git(_ arguments: String...) throws -> String {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments =
            ["git", "-C", root.path, "-c", "user.name=Test", "-c", "user.email=test@example.com"] + arguments
        let output = Pipe()
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        try process.run()
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        guard process.terminationStatus == 0 else { throw RuntimeError("git \(arguments) failed") }
        return String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// Writes the devices of `ids` (all phones, in the one topic of phones) and commits; the commit.
    @discardableResult
    func commitDevices(_ ids: [Int], on branch: String = "main") throws -> String {
        try git("checkout", "--quiet", "-B", branch)
        let devices = ids.map { "    - {id: d\($0), token: \"\(Fixtures.token($0))\", labels: {kind: phone}}" }
        try """
        inventory:
          devices:
        \(devices.joined(separator: "\n"))
        \(ServeProject.phones)
        """.write(to: root.appendingPathComponent("manifests/topics.yaml"), atomically: true, encoding: .utf8)
        try git("add", "-A")
        try git("commit", "--quiet", "-m", "devices \(ids)")
        let commit = try git("rev-parse", "HEAD")
        try git("checkout", "--quiet", "main")
        return commit
    }

    func remove() { try? FileManager.default.removeItem(at: root) }
}

@Suite struct GitSourceTests {
    @Test func sourceIsReadAndItsMistakesNamedByLine() throws {
        let text = """
            project: tidemark-test
            serve:
              source: {git: "https://github.com/acme/fcm-config", branch: release, path: fcm/manifests}
              workspaces:
                - name: prod
                - name: staging
                  source: {git: "git@github.com:acme/staging.git"}
                - name: local
                  manifests: manifests/local
            """
        let (settings, diagnostics) = ProjectSettings.decode(text, file: "tidemark.yaml")
        #expect(!diagnostics.hasErrors, "\(diagnostics)")
        let serve = try #require(settings.serve)
        #expect(serve.workspace("prod")?.source?.url == "https://github.com/acme/fcm-config")
        #expect(
            serve.workspace("prod")?.source?.branch == "release"
                && serve.workspace("prod")?.source?.path == "fcm/manifests")
        #expect(
            serve.workspace("staging")?.source?.branch == "main"
                && serve.workspace("staging")?.source?.path == "manifests")
        #expect(serve.workspace("local")?.source == nil)

        let mistakes: [(String, Int, String)] = [
            ("serve:\n  source: {branch: main}\n", 2, "must name the repository with 'git:'"),
            ("serve:\n  source: {git: --upload-pack=x}\n", 2, "must be a repository URL"),
            ("serve:\n  source: {git: r, branch: 'a..b'}\n", 2, "not a branch name"),
            ("serve:\n  source: {git: r, path: ../etc}\n", 2, "a directory inside the repository"),
            ("serve:\n  workspaces:\n    - name: a\n      manifests: m\n      source: {git: r}\n", 5, "keep one"),
        ]
        for (text, line, says) in mistakes {
            let errors = ProjectSettings.decode(text, file: "tidemark.yaml").1.filter { $0.severity == .error }
            #expect(errors.count == 1 && errors.first?.location?.line == line, "\(text): \(errors)")
            #expect(errors.first?.message.contains(says) == true, "\(errors.first?.message ?? "none")")
        }
        #expect(
            ServeSection.GitSource.redact("https://ci:s3cret@git.example.com/acme/x.git")
                == "https://ci:***@git.example.com/acme/x.git")
        #expect(ServeSection.GitSource.redact("git@github.com:acme/x.git") == "git@github.com:acme/x.git")
    }

    @Test func onlyTheBranchNamedIsAppliedAndEachReconcileNamesItsCommit() async throws {
        let repository = try ManifestRepository()
        defer { repository.remove() }
        let project = try ServeProject()
        defer { project.remove() }
        let first = try repository.commitDevices([0, 1, 2])
        let source = GitManifests(
            source: ServeSection.GitSource(
                url: repository.root.path, location: SourceLocation(file: "tidemark.yaml", line: 3, column: 3)),
            cache: GitManifests.cache(root: project.root.path, workspace: "default"))
        let flags = project.flags
        let reconciler = Reconciler(
            runtime: try Runtime.load(flags, environment: [:]), settings: ServeSettings(),
            source: source)

        let applied = await reconciler.reconcile()
        #expect(applied.outcome == .success && applied.subscribed == 3, "\(applied)")
        #expect(applied.commit == first)

        // A pull request's branch is never applied.
        try repository.commitDevices([0, 1, 2, 3, 4], on: "feature")
        let unchanged = await reconciler.reconcile()
        #expect(unchanged.outcome == .success && unchanged.subscribed == 0 && unchanged.commit == first, "\(unchanged)")

        // Merged into main: applied at the next reconcile, which names the new commit.
        let second = try repository.commitDevices([0, 1, 2, 3])
        let merged = await reconciler.reconcile()
        #expect(merged.outcome == .success && merged.subscribed == 1 && merged.commit == second, "\(merged)")
        #expect(try await project.subscribers("phones", of: [0, 1, 2, 3, 4]) == 4)
        let checkouts = try FileManager.default.contentsOfDirectory(
            atPath: GitManifests.cache(root: project.root.path, workspace: "default") + "/checkouts")
        #expect(checkouts == [second], "the older commit's checkout is removed")
    }

    @Test func aSourceThatCannotBeFetchedFailsNamingTheRepositoryBranchAndCause() async throws {
        let repository = try ManifestRepository()
        defer { repository.remove() }
        let project = try ServeProject()
        defer { project.remove() }
        let commit = try repository.commitDevices([0])
        let runtime = try Runtime.load(project.flags, environment: [:])
        let location = SourceLocation(file: "tidemark.yaml", line: 3, column: 3)
        func reconcile(_ source: ServeSection.GitSource) async -> ReconcileResult {
            await Reconciler(
                runtime: runtime, settings: ServeSettings(),
                source: GitManifests(
                    source: source, cache: GitManifests.cache(root: project.root.path, workspace: "default"))
            ).reconcile()
        }

        let noPath = await reconcile(
            ServeSection.GitSource(url: repository.root.path, path: "nope", location: location))
        #expect(noPath.outcome == .failure && noPath.reason == "source_unavailable", "\(noPath)")
        #expect(noPath.message?.contains("has no directory 'nope'") == true, "\(noPath.message ?? "")")
        #expect(noPath.message?.contains(String(commit.prefix(12))) == true)

        let noBranch = await reconcile(
            ServeSection.GitSource(url: repository.root.path, branch: "release", location: location))
        #expect(noBranch.outcome == .failure && noBranch.reason == "source_unavailable", "\(noBranch)")
        #expect(noBranch.message?.contains("fetch branch 'release'") == true, "\(noBranch.message ?? "")")

        let secret = "https://ci:s3cret-token@127.0.0.1:1/acme/manifests.git"
        let closed = await reconcile(ServeSection.GitSource(url: secret, location: location))
        #expect(closed.outcome == .failure && closed.reason == "source_unavailable", "\(closed)")
        #expect(
            closed.message?.contains("https://ci:***@127.0.0.1:1/acme/manifests.git") == true, "\(closed.message ?? "")"
        )
        #expect(closed.message?.contains("s3cret") == false, "\(closed.message ?? "")")
        #expect(closed.message?.contains("tidemark.yaml:3") == true)
    }

    /// A workspace whose manifests come from git is compared with the others once its checkout is
    /// fetched: an overlap is warned of at the first fetch that shows it, not again for the same
    /// commit, and a commit that ends it says so.
    @Test func aGitSourcedWorkspaceThatDeclaresAnotherWorkspacesTopicIsNamedOnceFetched() async throws {
        let repository = try ManifestRepository()
        defer { repository.remove() }
        let project = try ServeProject()
        defer { project.remove() }
        try project.writeDevices([5])  // the workspace on disk declares 'phones'
        try repository.commitDevices([0, 1])  // so does the branch the other one follows
        func runtime(_ workspace: String) throws -> Runtime {
            var flags = project.flags
            flags.workspace = workspace
            return try Runtime.load(flags, environment: [:])
        }
        let source = GitManifests(
            source: ServeSection.GitSource(
                url: repository.root.path, location: SourceLocation(file: "tidemark.yaml", line: 3, column: 3)),
            cache: GitManifests.cache(root: project.root.path, workspace: "from-git"))
        let (onDisk, fromGit) = (try runtime("on-disk"), try runtime("from-git"))
        let lines = Mutex<[String]>([])
        let shared = SharedDeclarations(log: ServeLog(lines: { line in lines.withLock { $0.append(line) } }))
        shared.planned([
            .init(
                entry: nil, runtime: onDisk, settings: ServeSettings(), source: nil, records: try onDisk.serveRecords()),
            .init(
                entry: nil, runtime: fromGit, settings: ServeSettings(), source: source,
                records: try fromGit.serveRecords()),
        ])
        #expect(lines.withLock { $0 }.isEmpty, "the checkout is not read before it is fetched")

        var reconciler = Reconciler(runtime: fromGit, settings: ServeSettings(), source: source)
        reconciler.fetched = { runtime, commit in shared.fetched(runtime, commit: commit) }
        #expect(await reconciler.reconcile().outcome == .success)
        let warned = lines.withLock { $0 }
        #expect(warned.count == 1, "\(warned)")
        #expect(warned.first?.contains("workspaces 'on-disk' (") == true, "\(warned)")
        #expect(
            warned.first?.contains("'from-git' (") == true && warned.first?.contains("both manage topic:phones") == true
        )

        _ = await reconciler.reconcile()
        #expect(lines.withLock { $0 }.count == 1, "the same commit says nothing again")

        try
            "topics:\n  - name: tablets\n    members: [{devices: [d0]}]\ninventory:\n  devices:\n    - {id: d0, token: \"\(Fixtures.token(0))\"}\n"
            .write(
                to: repository.root.appendingPathComponent("manifests/topics.yaml"), atomically: true, encoding: .utf8)
        try repository.git("commit", "--quiet", "-am", "tablets only")
        _ = await reconciler.reconcile()
        #expect(
            lines.withLock { $0 }.last
                == "no two workspaces declare one topic or device group in one FCM project any more",
            "\(lines.withLock { $0 })")
    }
}
