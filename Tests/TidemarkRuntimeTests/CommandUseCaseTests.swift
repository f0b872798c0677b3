import Foundation
import Testing
import TidemarkCore
import TidemarkRuntime
import TidemarkTesting

/// The use cases the CLI's `fmt`, `apply PLANFILE`, `state show` and `audience --name` call: each is
/// one runtime call, its settings merged by the runtime, its refusals typed.
@Suite struct CommandUseCaseTests {
    /// A project with `settings` and `manifests` (file name to text) in a fresh directory.
    static func project(_ settings: String, manifests: [String: String] = [:]) throws -> (Runtime, URL) {
        let root = FileManager.default.temporaryDirectory.appendingPathComponent("tm-use-\(UUID().uuidString)")
        let directory = root.appendingPathComponent("manifests")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        try settings.write(to: root.appendingPathComponent("tidemark.yaml"), atomically: true, encoding: .utf8)
        for (name, text) in manifests {
            let url = directory.appendingPathComponent(name)
            try FileManager.default.createDirectory(
                at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
            try text.write(to: url, atomically: true, encoding: .utf8)
        }
        var flags = RuntimeFlags()
        flags.directory = root.path
        return (try Runtime.load(flags, environment: [:]), root)
    }

    @Test func formatRewritesWhatIsNotCanonicalKeepsModesAndReportsWhatItCannotRead() throws {
        let messy = "topics:\n  - members:\n      - devices: [b, a]\n    name: news\n"
        let (runtime, root) = try Self.project(
            "project: tidemark-fmt\n",
            manifests: [
                "a.yaml": messy, "nested/b.yml": "topics: []\n", "broken.yaml": "topics: [\n",
                "notes.txt": "not a manifest\n",
            ])
        defer { try? FileManager.default.removeItem(at: root) }
        let path = root.appendingPathComponent("manifests/a.yaml").path
        try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: path)

        let checked = try runtime.format(check: true)
        #expect(checked.changed.map(\.file) == [runtime.manifestsDisplay + "/a.yaml"])
        #expect(checked.changed.first?.original == messy)
        #expect(checked.problems.count >= 1 && checked.problems.allSatisfy { $0.description.contains("broken.yaml") })
        #expect(try String(contentsOfFile: path, encoding: .utf8) == messy, "--check writes nothing")

        let written = try runtime.format(check: false)
        let formatted = try String(contentsOfFile: path, encoding: .utf8)
        #expect(formatted == written.changed.first?.formatted && formatted != messy)
        #expect(formatted.contains("name: news") && formatted.contains("[a, b]"))
        let mode = try FileManager.default.attributesOfItem(atPath: path)[.posixPermissions] as? Int
        #expect(mode == 0o600, "the file keeps its mode")
        #expect(try runtime.format(check: true).changed.isEmpty, "canonical once formatted")

        try FileManager.default.removeItem(at: root.appendingPathComponent("manifests"))
        let missing = #expect(throws: RuntimeError.self) { try runtime.format(check: true) }
        #expect(missing?.description.contains("does not exist; pass --manifests DIR or -C DIR") == true)
    }

    @Test func anApplyRequestTakesTidemarkYAMLsSettingsAndReadsTheSavedPlan() throws {
        let (runtime, root) = try Self.project(
            "project: tidemark-apply\nprune_after: 30d\nsaved_plan_reread_after: 0s\n")
        defer { try? FileManager.default.removeItem(at: root) }
        let fresh = try runtime.applyRequest(PlanRequest())
        #expect(fresh.pruneAfter == 30 * 86_400 && fresh.rereadAfter == 0 && fresh.savedPlan == nil)

        let plan = StateStoreConformance.plan(
            [
                PlannedOperation(
                    kind: .subscribe, target: "news", tokens: ["t1:APA91b" + String(repeating: "x", count: 40)])
            ],
            state: State(lineage: "l", serial: 1))
        let file = root.appendingPathComponent("plan.json").path
        try Plan.encoder().encode(plan).write(to: URL(fileURLWithPath: file))
        let saved = try runtime.applyRequest(PlanRequest(), savedPlan: file)
        #expect(saved.savedPlan?.file == file && saved.savedPlan?.plan.operations.count == 1)

        let gone = #expect(throws: SavedPlanError.self) {
            try runtime.applyRequest(PlanRequest(), savedPlan: root.appendingPathComponent("gone.json").path)
        }
        #expect(gone?.description.contains("cannot read the plan file") == true)
        #expect(gone?.reason == "unreadable_plan")

        let (defaults, other) = try Self.project("project: tidemark-apply\n")
        defer { try? FileManager.default.removeItem(at: other) }
        let plain = try defaults.applyRequest(PlanRequest())
        #expect(plain.pruneAfter == nil && plain.rereadAfter == 15 * 60)
    }

    static let token = "t1:APA91b" + String(repeating: "y", count: 140)

    @Test func stateShowAndAudienceNamesFindTheirEntryOrSayWhatThereIs() async throws {
        let (runtime, root) = try Self.project(
            "project: tidemark-show\n",
            manifests: [
                "topics.yaml":
                    "inventory:\n  files: [devices.csv]\ngroups:\n  - notification_key_name: family\n    members:\n      - devices: [d1]\n",
                "devices.csv": "device_id,token\nd1,\(Self.token)\n",
            ])
        defer { try? FileManager.default.removeItem(at: root) }
        let none = await #expect(throws: RuntimeError.self) { try await runtime.stateEntry("news") }
        #expect(none?.description.contains("there is no state at") == true)

        var state = State(lineage: "l", serial: 0)
        let token = Self.token
        let id = state.intern(token)
        state.setTopic(
            "news", TopicState(mode: .authoritative, protect: false, managed: TokenSet([id]), observed: TokenSet([id])))
        state.setGroup("news", GroupState(key: nil, members: TokenSet([id])))
        try await runtime.stateStore().save(&state, StateStoreConformance.writeAll(state), at: 1)

        let topic = try await runtime.stateEntry("news")
        guard case .topic(let found) = topic.kind else {
            Issue.record("a bare name is a topic first")
            return
        }
        #expect(found.mode == .authoritative && topic.device(ofToken: token, id: id) == "d1")
        let group = try await runtime.stateEntry("group:news")
        guard case .group = group.kind else {
            Issue.record("group: names the group")
            return
        }
        let missing = await #expect(throws: RuntimeError.self) { try await runtime.stateEntry("topic:sports") }
        #expect(missing?.description.contains("state has no topic named 'sports'") == true)

        let family = try await runtime.namedAudience("family", source: .desired, output: SilentOutput())
        #expect(family.tokens == [token] && !family.isAudience)
        let unknown = await #expect(throws: RuntimeError.self) {
            try await runtime.namedAudience("friends", source: .desired, output: SilentOutput())
        }
        #expect(
            unknown?.description.contains("the manifests declare no audience or device group named 'friends'") == true)
    }

    @Test func locksAndRequestsNameAPersonNeverABareUID() throws {
        let (runtime, root) = try Self.project("project: tidemark-user\n")
        defer { try? FileManager.default.removeItem(at: root) }
        // No USER (a container's shell): the account's name, as the system knows it.
        let account = getpwuid(getuid()).map { String(cString: $0.pointee.pw_name) }
        #expect(runtime.userName == account ?? "uid \(getuid())")
        #expect(runtime.userName != String(getuid()))
        #expect(runtime.requester.hasPrefix(runtime.userName + " on "))
        #expect(runtime.lockHolder("tidemark serve (reconcile)").user == runtime.userName)
        var flags = RuntimeFlags()
        flags.directory = root.path
        let named = try Runtime.load(flags, environment: ["USER": "ana"])
        #expect(named.userName == "ana" && named.requester.hasPrefix("ana on "))
    }

    /// `state rm` and `state mv` beside a `tidemark serve` that owns the workspace: refused while the
    /// manifests still declare the entry (serve would adopt it again at once), allowed otherwise.
    @Test func lifecycleCommandsAreRefusedWhileServeOwnsAndTheManifestsDeclare() async throws {
        let (runtime, root) = try Self.project(
            "project: tidemark-served\n",
            manifests: ["t.yaml": "topics:\n  - name: news\n    members: [{devices: [a]}]\n"])
        defer { try? FileManager.default.removeItem(at: root) }
        // No serve: nothing to refuse.
        try await runtime.refuseWhileServed([StateAddress(.topic, "news")], command: "tidemark state rm")
        let records = try runtime.serveRecords()
        _ = try await records.claimOwnership("vm/1#a", for: .seconds(60))
        let refused = await #expect(throws: RuntimeError.self) {
            try await runtime.refuseWhileServed([StateAddress(.topic, "news")], command: "tidemark state rm")
        }
        #expect(refused?.description.contains("'tidemark serve' on replica vm/1#a owns workspace 'default'") == true)
        #expect(refused?.description.contains("still declare topic:news (") == true, "\(refused?.description ?? "")")
        #expect(refused?.description.contains("'tidemark suspend default'") == true)
        // What the manifests no longer declare may go.
        try await runtime.refuseWhileServed([StateAddress(.topic, "old")], command: "tidemark state rm")
    }

    /// Two served workspaces of one FCM project that declare the same topic or group are named, with
    /// where each declares it; another project's workspace, and audiences (a workspace's own), are not.
    @Test func topicsTwoWorkspacesOfOneProjectDeclareAreNamed() throws {
        let (_, root) = try Self.project(
            """
            project: tidemark-shared
            serve:
              workspaces:
                - {name: a, manifests: manifests/a}
                - {name: b, manifests: manifests/b}
                - {name: c, manifests: manifests/c, project: tidemark-other}

            """,
            manifests: [
                "a/t.yaml":
                    "topics:\n  - name: news\n    members: [{devices: [d1]}]\n  - name: only-a\n    members: [{devices: [d1]}]\naudiences:\n  - name: fans\n    members: [{devices: [d1]}]\n",
                "b/t.yaml":
                    "topics:\n  - name: news\n    members: [{devices: [d2]}]\naudiences:\n  - name: fans\n    members: [{devices: [d2]}]\n",
                "c/t.yaml": "topics:\n  - name: news\n    members: [{devices: [d3]}]\n",
            ])
        defer { try? FileManager.default.removeItem(at: root) }
        var flags = RuntimeFlags()
        flags.directory = root.path
        let runtimes = try ["a", "b", "c"].map { try Runtime.load(flags, serveWorkspace: $0, environment: [:]) }
        let shared = Runtime.sharedDeclarations(runtimes)
        #expect(shared.count == 1, "\(shared)")
        let sentence = try #require(shared.first)
        #expect(sentence.hasPrefix("workspaces 'a' (") && sentence.contains("manifests/a/t.yaml:2:"), "\(sentence)")
        #expect(sentence.contains(") and 'b' (") && sentence.contains("manifests/b/t.yaml:2:"), "\(sentence)")
        #expect(shared.first?.contains("manage topic:news in FCM project 'tidemark-shared'") == true)
        #expect(Runtime.sharedDeclarations([runtimes[0], runtimes[2]]).isEmpty)
    }

    /// serve's git checkouts go under TIDEMARK_CACHE_DIR when it is set (the chart's writable volume
    /// beside a read-only project), else under the project's `.tidemark/`.
    @Test func theCacheDirectoryFollowsTIDEMARK_CACHE_DIR() throws {
        let (runtime, root) = try Self.project("project: tidemark-cache\n")
        defer { try? FileManager.default.removeItem(at: root) }
        #expect(runtime.cacheDirectory == root.appendingPathComponent(".tidemark").path)
        var flags = RuntimeFlags()
        flags.directory = root.path
        let absolute = try Runtime.load(flags, environment: ["TIDEMARK_CACHE_DIR": "/var/cache/tidemark"])
        #expect(absolute.cacheDirectory == "/var/cache/tidemark")
        let relative = try Runtime.load(flags, environment: ["TIDEMARK_CACHE_DIR": "cache"])
        #expect(relative.cacheDirectory == root.appendingPathComponent("cache").path)
    }
}
