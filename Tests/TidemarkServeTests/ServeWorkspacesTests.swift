import Foundation
import Synchronization
import Testing
import TidemarkCore
import TidemarkRuntime
import TidemarkServe
import TidemarkTesting

/// `serve:` in tidemark.yaml, and one owner per workspace.
struct ServeWorkspacesTests {
    static let section = """
        project: tidemark-serve-test
        serve:
          interval: 10m
          drift: warn
          workspaces:
            - name: prod
              state: postgres://tidemark@db.internal/tidemark
              manifests: manifests/prod
              project: acme-prod-1
              backend: fcm
              credentials_env: PROD_KEY
              max_unsubscribes: 2%
            - name: staging
              on_change: plan
              suspend: true
        """

    @Test func entriesTakeTheSectionDefaultsAndTheirOwnSettings() throws {
        let (settings, diagnostics) = ProjectSettings.decode(Self.section, file: "tidemark.yaml")
        #expect(!diagnostics.hasErrors)
        let serve = try #require(settings.serve)
        #expect(serve.workspaces.map(\.name) == ["prod", "staging"])
        let prod = try #require(serve.workspace("prod"))
        #expect(prod.state == "postgres://tidemark@db.internal/tidemark" && prod.manifests == "manifests/prod")
        #expect(prod.project == "acme-prod-1" && prod.backend == .fcm && prod.credentialsEnv == "PROD_KEY")
        #expect(prod.settings.interval == .seconds(600) && prod.settings.drift == .warn)
        #expect(prod.settings.maxUnsubscribes != nil && prod.location.line == 6)
        let staging = try #require(serve.workspace("staging"))
        #expect(staging.settings.onChange == .plan && staging.settings.suspend && staging.settings.drift == .warn)
        var flags = ServeSettings.Overrides()
        flags.drift = .off
        #expect(flags.applied(to: staging.settings).drift == .off)
        #expect(flags.applied(to: staging.settings).interval == .seconds(600))
    }

    @Test(arguments: [
        ("serve:\n  workspaces:\n    - name: a\n    - name: a\n", 4, "listed twice"),
        ("serve:\n  workspaces:\n    - state: x.db\n", 3, "has no 'name'"),
        (
            "serve:\n  workspaces:\n    - name: a\n      interval: soon\n", 4,
            "'serve.workspaces[a].interval' must be a duration"
        ),
        (
            "serve:\n  workspaces:\n    - name: a\n      credentials_env: /path/key.json\n", 4,
            "names an environment variable"
        ),
        ("serve:\n  interval: 5m\n  workspaces: []\n", 3, "lists no workspace"),
        ("serve:\n  workspaces:\n    - name: a\n      drfit: heal\n", 4, "did you mean 'drift'"),
    ])
    func mistakesAreNamedByLine(_ text: String, _ line: Int, _ says: String) {
        let (_, diagnostics) = ProjectSettings.decode(text, file: "tidemark.yaml")
        let errors = diagnostics.filter { $0.severity == .error }
        #expect(errors.count == 1)
        #expect(errors.first?.location?.line == line)
        #expect(errors.first?.message.contains(says) == true, "\(errors.first?.message ?? "none")")
    }

    @Test func anEntryIsLoadedWithItsOwnWorkspaceManifestsAndCredentials() throws {
        let project = try ServeProject()
        defer { project.remove() }
        try project.writeSettings(
            """
            project: tidemark-serve-test
            serve:
              workspaces:
                - name: eu
                  manifests: manifests
                  project: acme-eu-1
                  credentials_env: EU_KEY
            """)
        let runtime = try Runtime.load(project.flags, serveWorkspace: "eu", environment: ["EU_KEY": "/keys/eu.json"])
        #expect(runtime.workspaceName == "eu" && runtime.resolved.project.project == "acme-eu-1")
        #expect(runtime.resolved.credentialsPath == "/keys/eu.json")
        #expect(runtime.missingServeCredentials("eu") == nil)
        let without = try Runtime.load(project.flags, serveWorkspace: "eu", environment: [:])
        let missing = try #require(without.missingServeCredentials("eu"))
        #expect(missing.description.contains("tidemark.yaml:4") && missing.description.contains("EU_KEY"))
        #expect(throws: RuntimeError.self) { try Runtime.load(project.flags, serveWorkspace: "us", environment: [:]) }
    }

    /// Two runners of one workspace (two replicas) over one store: one reconciles, the other stands by;
    /// a suspend request stops the owner; when the owner stops, the other takes over and reconciles.
    /// Claims last an hour, so a test process starved by the suite beside it never lets one lapse: the
    /// takeover comes from the owner giving its claim up.
    @Test
    func oneReplicaOwnsAWorkspaceAndAnotherTakesOver() async throws {
        let project = try ServeProject()
        defer { project.remove() }
        try project.writeDevices([1, 2, 3])
        let store = InMemoryStateStore(workspace: "default")
        let lines = Mutex<[String]>([])
        func runner(_ replica: String) throws -> WorkspaceRunner {
            let runtime = try project.runtime()
            var settings = ServeSettings()
            settings.interval = .seconds(3600)
            return WorkspaceRunner(
                status: Serve.initialStatus(runtime, settings: settings),
                reconciler: try project.reconciler(),
                ownership: .init(
                    records: store, replica: replica, duration: .seconds(3600), poll: .milliseconds(50)),
                metrics: ServeMetrics(),
                log: ServeLog(lines: { line in lines.withLock { $0.append("\(replica): \(line)") } }))
        }
        let first = try runner("replica-a")
        let second = try runner("replica-b")
        let a = Task { try await first.run() }
        /// What the runners did, when a wait fails.
        func story() -> String {
            "first: \(first.status.phase), second: \(second.status.phase)\n"
                + lines.withLock { $0.joined(separator: "\n") }
        }
        try await waitUntil(story) { first.status.phase == .ready }
        let b = Task { try await second.run() }
        try await waitUntil(story) { second.status.phase == .standby }
        #expect(second.status.replica == "replica-a")
        try await store.requestControl(.suspend, by: "test")
        try await waitUntil(story) { first.status.phase == .suspended }
        try await store.requestControl(.resume, by: "test")
        try await waitUntil(story) { first.status.phase == .ready }
        a.cancel()
        _ = try? await a.value
        try await waitUntil(story) { second.status.phase == .ready && second.status.replica == "replica-b" }
        let published = try await store.serveRecord()
        #expect(published.owner == "replica-b" && published.ownerFence == 2)
        b.cancel()
        _ = try? await b.value
    }

    /// Two replicas running four workspaces spread them: the first, alone, takes all four; the second,
    /// started later, gets two by handovers between reconciles (and reconciles each at once: a change
    /// made while it changed hands is read), and no more move; when it stops, the first takes them back.
    @Test
    func replicasSpreadTheWorkspacesTheyShare() async throws {
        let projects = try (0..<4).map { _ in try ServeProject() }
        defer { for project in projects { project.remove() } }
        for project in projects { try project.writeDevices([1, 2, 3]) }
        let stores = (0..<4).map { InMemoryStateStore(workspace: "w\($0)") }
        let lines = Mutex<[String]>([])
        func replica(_ name: String) throws -> [WorkspaceRunner] {
            let balance = ReplicaBalance(
                replica: name, grace: .seconds(1), cooldown: .milliseconds(300), now: Timing.live.now)
            return try projects.indices.map { index in
                var settings = ServeSettings()
                settings.interval = .seconds(3600)
                var status = Serve.initialStatus(try projects[index].runtime(), settings: settings)
                status.workspace = "w\(index)"
                return WorkspaceRunner(
                    status: status, reconciler: try projects[index].reconciler { $0.interval = .seconds(3600) },
                    ownership: .init(
                        records: stores[index], replica: name, duration: .seconds(3600), poll: .milliseconds(50),
                        balance: balance),
                    metrics: ServeMetrics(),
                    watched: WatchedInputs(manifests: projects[index].root.appendingPathComponent("manifests").path),
                    log: ServeLog(lines: { line in lines.withLock { $0.append("\(name): \(line)") } }))
            }
        }
        func owners() async throws -> [String?] {
            var owners: [String?] = []
            for store in stores { owners.append(try await store.serveRecord().owner) }
            return owners
        }
        let owned = Mutex<[String?]>([])
        func story() -> String {
            "owners: \(owned.withLock { $0 })\n" + lines.withLock { $0.joined(separator: "\n") }
        }
        func waitForOwners(_ condition: @escaping ([String?]) -> Bool) async throws {
            let end = ContinuousClock.now + .seconds(120)
            while true {
                let now = try await owners()
                owned.withLock { $0 = now }
                if condition(now) { return }
                guard ContinuousClock.now < end else {
                    Issue.record("owners never settled\n\(story())")
                    return
                }
                try await Task.sleep(for: .milliseconds(20))
            }
        }
        let first = try replica("replica-a")
        let a = first.map { runner in Task { try await runner.run() } }
        try await waitUntil(story) { first.allSatisfy { $0.status.phase == .ready } }
        try await waitForOwners { $0.allSatisfy { $0 == "replica-a" } }
        // A device added just before the handovers: the workspaces' new owner reads it (its watches start
        // after the edit, and the old owner's had no time to see it).
        for project in projects { try project.writeDevices([1, 2, 3, 4]) }
        let second = try replica("replica-b")
        let b = second.map { runner in Task { try await runner.run() } }
        try await waitForOwners { $0.filter { $0 == "replica-b" }.count == 2 && !$0.contains(nil) }
        // The new owner's reconciles (each after its watches have their starting point) end.
        try await waitUntil(story) {
            second.count { $0.status.replica == "replica-b" && $0.status.phase == .ready } == 2
        }
        try await Task.sleep(for: .seconds(1))
        try await waitForOwners { $0.filter { $0 == "replica-b" }.count == 2 && !$0.contains(nil) }
        let said = lines.withLock { $0 }
        #expect(said.filter { $0.hasPrefix("replica-a: ") && $0.contains("handed over") }.count == 2, "\(story())")
        // Each workspace handed over is reconciled at once by its new owner (what changed while it changed
        // hands was seen by neither replica's watches), once, and by the replica it was handed to only.
        #expect(said.count { $0.hasPrefix("replica-b: reconcile workspace=") } == 2, "\(story())")
        #expect(
            said.count { $0.hasPrefix("replica-b: ") && $0.contains("handed over to this replica") } == 2,
            "\(story())")
        for runner in second where runner.status.replica == "replica-b" && runner.status.phase != .standby {
            #expect(runner.status.phase == .ready && runner.status.last != nil && runner.status.nextRunAt != nil)
        }
        for (index, project) in projects.enumerated() {
            let end = ContinuousClock.now + .seconds(60)
            while try await project.subscribers("phones", of: [4]) == 0, ContinuousClock.now < end {
                try await Task.sleep(for: .milliseconds(100))
            }
            #expect(
                try await project.subscribers("phones", of: [4]) == 1, "w\(index): the new device joined\n\(story())")
        }
        for task in b { task.cancel() }
        for task in b { _ = try? await task.value }
        try await waitForOwners { $0.allSatisfy { $0 == "replica-a" } }
        #expect(try await stores[0].serveRecord().replicas.keys.sorted() == ["replica-a"])
        for task in a { task.cancel() }
        for task in a { _ = try? await task.value }
    }

    /// Two replicas with one host name and one PID (containers with host networking, each running
    /// tidemark as PID 1) are two replicas: their names carry each process's instance, so one owns the
    /// workspace and the other stands by, and the standby stopping leaves the owner's claim alone.
    @Test
    func twoReplicasWithOneHostNameAndPIDAreTwoReplicas() async throws {
        #expect(Serve.replica.hasSuffix("#\(LockHolder.currentInstance.prefix(8))"))
        let names = [UUID(), UUID()].map { Serve.replicaName(host: "vm", pid: 1, instance: $0.uuidString.lowercased()) }
        #expect(names[0] != names[1] && names.allSatisfy { $0.hasPrefix("vm/1#") })
        let project = try ServeProject()
        defer { project.remove() }
        try project.writeDevices([1, 2, 3])
        let store = InMemoryStateStore(workspace: "default")
        let lines = Mutex<[String]>([])
        let runners = try names.map { name in
            var settings = ServeSettings()
            settings.interval = .seconds(3600)
            return WorkspaceRunner(
                status: Serve.initialStatus(try project.runtime(), settings: settings),
                reconciler: try project.reconciler { $0.interval = .seconds(3600) },
                ownership: .init(records: store, replica: name, duration: .seconds(3600), poll: .milliseconds(50)),
                metrics: ServeMetrics(),
                log: ServeLog(lines: { line in lines.withLock { $0.append("\(name): \(line)") } }))
        }
        func story() -> String {
            runners.map { "\($0.status.phase) \($0.status.replica)" }.joined(separator: ", ") + "\n"
                + lines.withLock { $0.joined(separator: "\n") }
        }
        let first = Task { try await runners[0].run() }
        try await waitUntil(story) { runners[0].status.phase == .ready }
        let second = Task { try await runners[1].run() }
        try await waitUntil(story) { runners[1].status.phase == .standby }
        try await Task.sleep(for: .milliseconds(300))
        #expect(runners[1].status.phase == .standby && runners[1].status.replica == names[0], "\(story())")
        #expect(!lines.withLock { $0.contains { $0.hasPrefix("\(names[1]): reconcile ") } }, "\(story())")
        second.cancel()
        _ = try? await second.value
        let record = try await store.serveRecord()
        #expect(record.owner == names[0], "the standby stopping left the owner's claim alone\n\(story())")
        first.cancel()
        _ = try? await first.value
    }

    private func waitUntil(
        _ story: () -> String = { "" }, seconds: Double = 120,
        sourceLocation: Testing.SourceLocation = #_sourceLocation,
        _ condition: () -> Bool
    ) async throws {
        let end = ContinuousClock.now + .seconds(seconds)
        while !condition() {
            guard ContinuousClock.now < end else {
                Issue.record("condition not met within \(seconds) s\n\(story())", sourceLocation: sourceLocation)
                return
            }
            try await Task.sleep(for: .milliseconds(20))
        }
    }
}
