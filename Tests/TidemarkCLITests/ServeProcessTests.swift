import Foundation
import Synchronization
import Testing
import TidemarkTesting
import Yams

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// `tidemark serve` as a real process against the HTTP emulator: it reconciles at start-up and on
/// its interval, answers its health endpoints and metrics (checked by `promtool`), reports a blocked
/// plan, and stops on SIGTERM with exit 0.
@Suite(.serialized) struct ServeProcessTests {
    /// A running `tidemark serve`, its stderr collected as it comes.
    final class Running: Sendable {
        let process: Process
        let base: String
        private let log: LogBuffer
        /// A session of its own: the shared one is shared by every test of the suite running at once,
        /// and its few connections per host made a /status poll wait for seconds under the whole suite.
        private let session: URLSession = {
            let configuration = URLSessionConfiguration.ephemeral
            configuration.timeoutIntervalForRequest = 10
            return URLSession(configuration: configuration)
        }()

        final class LogBuffer: Sendable {
            let text = Mutex("")
            func withLock<T>(_ body: (inout String) -> T) -> T { text.withLock { body(&$0) } }
        }

        init(process: Process, base: String, log: LogBuffer) {
            self.process = process
            self.base = base
            self.log = log
        }

        var logText: String { log.withLock { $0 } }

        static func start(_ cli: CLIRunner, _ arguments: [String], environment: [String: String]) throws -> Running {
            let (process, _, err) = try cli.start(
                ["serve", "--listen", "127.0.0.1:0"] + arguments, environment: environment)
            let log = LogBuffer()
            let reader = Thread {
                while true {
                    let chunk = err.fileHandleForReading.availableData
                    if chunk.isEmpty { return }
                    log.withLock { $0 += String(decoding: chunk, as: UTF8.self) }
                }
            }
            reader.start()
            let deadline = Date().addingTimeInterval(60)
            while Date() < deadline, process.isRunning {
                if let match = log.withLock({ $0.firstMatch(of: /listening on (http:\/\/127\.0\.0\.1:\d+)/) }) {
                    return Running(process: process, base: String(match.1), log: log)
                }
                Thread.sleep(forTimeInterval: 0.05)
            }
            process.terminate()
            Issue.record("serve did not say where it listens: \(log.withLock { $0 })")
            throw CancellationError()
        }

        /// The first log line that `matches`, waiting up to 10 s for it; "" when none came.
        func logLine(within seconds: Double = 10, _ matches: (Substring) -> Bool) async throws -> String {
            let deadline = Date().addingTimeInterval(seconds)
            repeat {
                if let line = logText.split(separator: "\n").first(where: matches) { return String(line) }
                try await Task.sleep(for: .milliseconds(50))
            } while Date() < deadline
            return ""
        }

        func get(_ path: String) async throws -> (Int, String) {
            let (data, response) = try await session.data(from: URL(string: base + path)!)
            return ((response as! HTTPURLResponse).statusCode, String(decoding: data, as: UTF8.self))
        }

        func status() async throws -> [String: Any] {
            let (_, text) = try await get("/status")
            let json = try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any]
            return ((json?["workspaces"] as? [[String: Any]]) ?? []).first ?? [:]
        }

        /// Waits until `/status` satisfies `condition` (at most `seconds`).
        func waitFor(
            _ what: String, seconds: Double = 90, _ condition: ([String: Any]) -> Bool
        ) async throws -> [String: Any] {
            let deadline = Date().addingTimeInterval(seconds)
            var last: [String: Any] = [:]
            while Date() < deadline {
                last = try await status()
                if condition(last) { return last }
                try await Task.sleep(for: .milliseconds(200))
            }
            Issue.record("timed out waiting for \(what); status: \(last); log: \(logText)")
            return last
        }

        /// SIGTERM, and the exit status and seconds it took to end.
        func terminate() -> (Int32, Double) {
            let start = Date()
            process.terminate()
            process.waitUntilExit()
            return (process.terminationStatus, Date().timeIntervalSince(start))
        }
    }

    static func devices(_ ids: [Int]) -> String {
        let lines = ids.map {
            "    - {id: d\($0), token: \"\(Fixtures.token($0, prefix: "srv"))\", labels: {kind: phone}}"
        }
        return """
            inventory:
              devices:
            \(lines.joined(separator: "\n"))
            topics:
              - name: phones
                members:
                  - selector: {kind: phone}
            """
    }

    static func subscribers(_ server: EmulatorServeTests.Server) async throws -> Int {
        let (_, body) = try await server.call("GET", "/emulator/v1/projects/serve-test/topics/phones/subscribers")
        return (body["subscribers"] as? [Any])?.count ?? 0
    }

    @Test func aNewDeviceIsSubscribedWithinAnIntervalAndTheEndpointsTellTheTruth() async throws {
        let cli = try CLIRunner()
        defer { cli.remove() }
        let server = try EmulatorServeTests.Server.start(
            cli, data: nil, extra: ["--auto-register", "--rate-limit", "0"])
        defer { _ = server.stop() }
        try cli.write("tidemark.yaml", "project: serve-test\nbackend: emulator\nrefresh: all\n")
        try cli.write("manifests/topics.yaml", Self.devices([0, 1, 2]))

        let serve = try Running.start(cli, ["--interval", "2s"], environment: server.environment)
        var ended = false
        defer { if !ended { _ = serve.terminate() } }

        let (live, liveBody) = try await serve.get("/livez")
        #expect(live == 200 && liveBody == "ok\n")
        let ready = try await serve.waitFor("the first reconcile") { $0["phase"] as? String == "ready" }
        #expect(ready["ready"] as? Bool == true, "\(ready)")
        #expect(try await Self.subscribers(server) == 3)

        // A new install: it joins its topic at the next reconcile, without anyone running apply.
        func reconciles() -> Int {
            serve.logText.components(separatedBy: "reconcile workspace=default result=").count - 1
        }
        let before = reconciles()
        try cli.write("manifests/topics.yaml", Self.devices([0, 1, 2, 3]))
        let added = Date()
        while try await Self.subscribers(server) < 4, Date().timeIntervalSince(added) < 120 {
            try await Task.sleep(for: .milliseconds(100))
        }
        #expect(try await Self.subscribers(server) == 4)
        // The emulator has the subscription before the reconcile has saved state, counted it in the
        // metrics and logged its line: wait for the line (the log is read from a pipe, later still).
        while !serve.logText.contains("applied 1 subscription"), Date().timeIntervalSince(added) < 120 {
            try await Task.sleep(for: .milliseconds(100))
        }
        // Within an interval and a reconcile: the reconcile after the one that may have been reading
        // the manifests as they were written. Counted in reconciles rather than seconds, which the
        // whole suite running beside this test stretches (40 s once on a loaded 2-core machine, 10 s
        // alone).
        // The reconcile that subscribed it, counted from the write.
        let lines = serve.logText.components(separatedBy: "\n").filter {
            $0.contains("reconcile workspace=default result=")
        }
        let took = lines.dropFirst(before).firstIndex { $0.contains("applied 1 subscription") }.map { $0 - before + 1 }
        #expect(
            took.map { $0 <= 2 } == true,
            "a new device waited \(took.map(String.init) ?? "more") reconciles (\(Int(Date().timeIntervalSince(added))) s): \(serve.logText)"
        )

        let (readyz, readyBody) = try await serve.get("/readyz?verbose")
        #expect(readyz == 200, "\(readyBody)")
        #expect(readyBody.contains("[+]settings ok") && readyBody.contains("[+]state ok"), "\(readyBody)")

        // The health port on loopback: only loopback host names (DNS rebinding), and a connection that
        // sends no complete request (a slowloris) is closed after the idle timeout.
        let port = try #require(Int(serve.base.split(separator: ":").last ?? ""))
        for (host, status) in [
            ("127.0.0.1", "200"), ("localhost:\(port)", "200"), ("evil.example", "403"), ("[127.0.0.1]", "403"),
            ("127.0.0.1.evil.example", "403"),
        ] {
            let answer = RawHTTP.exchange(
                port: port, "GET /livez HTTP/1.1\r\nHost: \(host)\r\nConnection: close\r\n\r\n")
            #expect(answer.hasPrefix("HTTP/1.1 \(status)"), "Host \(host): \(answer)")
        }
        let slow = Date()
        let dripped = RawHTTP.exchange(
            port: port, "GET /livez HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: a", waitSeconds: 40)
        let held = Date().timeIntervalSince(slow)
        #expect(dripped.isEmpty && held < 30, "a request never finished was held \(held) s: \(dripped)")

        let (metricsStatus, metrics) = try await serve.get("/metrics")
        #expect(metricsStatus == 200)
        #expect(metrics.contains(#"tidemark_reconcile_total{workspace="default",result="success"}"#), "\(metrics)")
        #expect(metrics.contains(#"tidemark_changes_total{workspace="default",op="subscribe"} 4"#), "\(metrics)")
        #expect(metrics.contains(#"tidemark_workspace_ready{workspace="default"} 1.0"#))
        #expect(!metrics.contains("srv"), "no token in a label")
        let check = try Self.promtool(metrics)
        #expect(check.status == 0, "promtool check metrics: \(check.output)")

        // Every reconcile builds its backend; the process fetched one access token for all of them.
        let (_, traffic) = try await server.call("GET", "/emulator/v1/traffic")
        #expect(reconciles() >= 2, "\(serve.logText)")
        #expect(traffic["token_grants"] as? Int == 1, "\(reconciles()) reconciles: \(traffic)")
        // And they send on the connections already open: three more reconciles, each reading every
        // registration, open at most one more (a client of its own per backend opens one or more
        // each time).
        let opened = try #require(traffic["connections"] as? Int, "\(traffic)")
        let seen = reconciles()
        let waited = Date()
        while reconciles() < seen + 3, Date().timeIntervalSince(waited) < 120 {
            try await Task.sleep(for: .milliseconds(100))
        }
        let (_, later) = try await server.call("GET", "/emulator/v1/traffic")
        let reopened = (later["connections"] as? Int ?? 0) - opened
        #expect(
            opened >= 1 && reopened <= 1, "\(reconciles() - seen) reconciles opened \(reopened) connections: \(later)")

        // A manifest change past the rail is not applied; the workspace shows blocked, and says why.
        try cli.write("tidemark.yaml", "project: serve-test\nbackend: emulator\nrefresh: all\nmax_unsubscribes: 1\n")
        try cli.write("manifests/topics.yaml", Self.devices([0]))
        let blocked = try await serve.waitFor("blocked") { $0["phase"] as? String == "blocked" }
        let last = blocked["last"] as? [String: Any] ?? [:]
        #expect(last["reason"] as? String == "rail.max_unsubscribes", "\(blocked)")
        #expect((last["message"] as? String)?.contains("unsubscribe 3") == true, "\(last)")
        #expect(try await Self.subscribers(server) == 4)
        let (blockedMetrics) = try await serve.get("/metrics").1
        #expect(blockedMetrics.contains(#"tidemark_workspace_ready{workspace="default"} 0.0"#))
        // Logged as a warning, at its level (the text log handler writes the level after the time).
        let blockedLine = try await serve.logLine { $0.contains("result=blocked") }
        #expect(blockedLine.contains(" warning tidemark.serve"), "\(blockedLine)")

        // A broken tidemark.yaml: /readyz says so, naming the file and line.
        try cli.write("tidemark.yaml", "project: serve-test\nbackend: emulator\nrefresh: sometimes\n")
        let deadline = Date().addingTimeInterval(90)
        var unready = (0, "")
        while Date() < deadline {
            unready = try await serve.get("/readyz")
            if unready.0 == 503 { break }
            try await Task.sleep(for: .milliseconds(200))
        }
        #expect(unready.0 == 503, "\(unready.1)")
        #expect(unready.1.contains("[-]settings failed:") && unready.1.contains("tidemark.yaml:3"), "\(unready.1)")

        let (status, seconds) = serve.terminate()
        ended = true
        #expect(status == 0, "SIGTERM is serve's normal stop: \(serve.logText)")
        #expect(seconds < 30)
        #expect(serve.logText.contains("tidemark serve stopped"))
        #expect(!serve.logText.contains("srv"), "no token in the log: \(serve.logText)")
    }

    /// Two workspaces of one SQLite file under `serve:`, while other processes (the control commands)
    /// read and write the same file: every request is acted on, every reconcile asked for is reported,
    /// and the file stays whole (this process's SQLite locks were once dropped by a second store
    /// object reading the file's header, and the file was damaged).
    @Test func controlCommandsReachTheWorkspacesOfAServeAndTheStateStaysWhole() async throws {
        let cli = try CLIRunner()
        defer { cli.remove() }
        try cli.write(
            "tidemark.yaml",
            """
            project: serve-test
            serve:
              interval: 1h
              workspaces:
                - name: alpha
                  manifests: a
                - name: beta
                  manifests: b
            """)
        try cli.write("a/topics.yaml", Self.devices([1, 2, 3]))
        try cli.write("b/topics.yaml", Self.devices([4, 5]))
        // Before any serve: the control commands create no state and say which they looked at.
        let state = cli.project.appendingPathComponent(".tidemark/state.db").path
        for command in [["suspend", "beta"], ["status"], ["reconcile", "alpha", "--no-wait"]] {
            let early = try cli.run(command)
            #expect(
                early.status == 1 && early.stderr.contains("there is no state at .tidemark/state.db (workspace ")
                    && early.stderr.contains("(chosen by the default (no --state, TIDEMARK_STATE_URL"),
                "\(command): \(early.stderr)")
            #expect(!FileManager.default.fileExists(atPath: state), "\(command) created the state")
        }
        let serve = try Running.start(cli, ["--allow-embedded"], environment: [:])
        defer { _ = serve.terminate() }
        let owned = Date().addingTimeInterval(30)
        while Date() < owned,
            !(serve.logText.contains("workspace=alpha owned by this replica")
                && serve.logText.contains("workspace=beta owned by this replica"))
        {
            try await Task.sleep(for: .milliseconds(50))
        }
        let unnamed = try cli.run(["suspend"])
        #expect(unnamed.status == 1 && unnamed.stderr.contains("lists several workspaces"), "\(unnamed.stderr)")
        for round in 1...3 {
            let suspended = try cli.run(["suspend", "beta"])
            #expect(
                suspended.status == 0 && suspended.stdout.contains("Suspended workspace 'beta'"), "\(suspended.stderr)")
            let resumed = try cli.run(["resume", "beta"])
            #expect(resumed.status == 0, "\(resumed.stderr)")
            let asked = try cli.run(["reconcile", "alpha", "--timeout", "60s"])
            #expect(
                asked.status == 0 && asked.stdout.contains("alpha: ready"),
                "round \(round): \(asked.stdout) \(asked.stderr)")
        }
        let status = try cli.run(["status", "--format", "json"])
        let json = try JSONSerialization.jsonObject(with: Data(status.stdout.utf8)) as? [String: Any]
        let workspaces = (json?["workspaces"] as? [[String: Any]]) ?? []
        #expect(workspaces.map { $0["workspace"] as? String } == ["alpha", "beta"])
        #expect(workspaces.allSatisfy { $0["owner"] is String }, "\(status.stdout)")
        // The one replica is present in each workspace's record, as its owner.
        #expect(
            workspaces.allSatisfy { ($0["replicas"] as? [String]) == [$0["owner"] as? String ?? "?"] },
            "\(status.stdout)")
        let text = try cli.run(["status", "alpha"])
        #expect(text.stdout.contains("owner: replica ") && !text.stdout.contains("standing by"), "\(text.stdout)")
        #expect(text.stdout.contains("  backend: embedded (project serve-test)"), "\(text.stdout)")
        #expect(!serve.logText.contains("cannot claim"), "\(serve.logText)")
        // Who asked and why go with the request: in status, in /status and in the owner's log.
        let frozen = try cli.run([
            "suspend", "alpha", "--actor", "release-bot", "--reason", "deploy freeze until 14:00",
        ])
        #expect(frozen.status == 0, "\(frozen.stderr)")
        let shown = try cli.run(["status", "alpha"])
        #expect(
            shown.stdout.contains("suspended by release-bot on ")
                && shown.stdout.contains(": deploy freeze until 14:00"),
            "\(shown.stdout)")
        // The owner acts on the request at its next read of the record, after a reconcile in flight: on
        // a loaded runner that can take a while.
        let said = try await serve.logLine(within: 90) { $0.contains("workspace=alpha suspended by release-bot on ") }
        #expect(said.hasSuffix(": deploy freeze until 14:00"), "\(serve.logText)")
        let badReason = try cli.run(["resume", "alpha", "--reason", "two\nlines"])
        #expect(badReason.status == 64 && badReason.stderr.contains("--reason must be one line"), "\(badReason.stderr)")
        #expect(try cli.run(["resume", "alpha"]).status == 0)
        let unknown = try cli.run(["suspend", "gamma"])
        #expect(unknown.status != 0 && unknown.stderr.contains("lists no workspace 'gamma'"), "\(unknown.stderr)")
    }

    /// A state that tidemark apply made but no serve ever ran: the control commands refuse, naming the
    /// workspace and the state, and write nothing.
    @Test func controlCommandsRefuseAWorkspaceNoServeHasRecorded() throws {
        let cli = try CLIRunner()
        defer { cli.remove() }
        try cli.write("tidemark.yaml", "project: serve-test\n")
        try cli.write("manifests/topics.yaml", Self.devices([1, 2]))
        let applied = try cli.run(["apply", "--auto-approve"])
        #expect(applied.status == 0, "\(applied.stderr)")
        for command in [["status"], ["suspend"], ["resume", "default"], ["status", "--format", "json"], ["suspend"]] {
            let refused = try cli.run(command)
            #expect(
                refused.status == 1
                    && refused.stderr.contains(
                        "no 'tidemark serve' has run workspace 'default' with the state .tidemark/state.db (chosen by the default"
                    ),
                "\(command): \(refused.stdout) \(refused.stderr)")
            #expect(refused.stdout.isEmpty)
        }
        let staging = try cli.run(["status", "staging"])
        #expect(staging.status == 1 && staging.stderr.contains("workspace 'staging'"), "\(staging.stderr)")
    }

    /// tidemark.yaml edited under a running serve: a workspace added is reconciled, one removed is let
    /// go, new settings show; a broken file changes nothing; SIGHUP reloads too. No restart.
    @Test func settingsReloadWhenTidemarkYamlChangesOrOnSIGHUP() async throws {
        let cli = try CLIRunner()
        defer { cli.remove() }
        func settings(_ workspaces: [String], interval: String) -> String {
            "project: serve-test\nserve:\n  interval: \(interval)\n  workspaces:\n"
                + workspaces.map { "    - {name: \($0), manifests: \($0)}\n" }.joined()
        }
        try cli.write("tidemark.yaml", settings(["alpha"], interval: "1h"))
        try cli.write("alpha/topics.yaml", Self.devices([1, 2]))
        try cli.write("beta/topics.yaml", Self.devices([3]))
        let serve = try Running.start(cli, ["--allow-embedded"], environment: [:])
        defer { _ = serve.terminate() }
        func workspaces() async throws -> [String: [String: Any]] {
            let (_, text) = try await serve.get("/status")
            let json = try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any]
            let list = (json?["workspaces"] as? [[String: Any]]) ?? []
            return Dictionary(uniqueKeysWithValues: list.map { ($0["workspace"] as? String ?? "?", $0) })
        }
        func waitUntil(_ what: String, _ condition: ([String: [String: Any]]) -> Bool) async throws {
            let deadline = Date().addingTimeInterval(90)
            var last: [String: [String: Any]] = [:]
            while Date() < deadline {
                last = try await workspaces()
                if condition(last) { return }
                try await Task.sleep(for: .milliseconds(200))
            }
            Issue.record("timed out waiting for \(what): \(last); log: \(serve.logText)")
        }
        try await waitUntil("alpha ready") { $0["alpha"]?["phase"] as? String == "ready" }

        try cli.write("tidemark.yaml", settings(["alpha", "beta"], interval: "30m"))
        try await waitUntil("beta added and reconciled") { $0["beta"]?["phase"] as? String == "ready" }
        let reloaded = try await workspaces()
        #expect((reloaded["alpha"]?["settings"] as? [String: String])?["interval"] == "30m", "\(reloaded)")
        #expect(
            serve.logText.contains("settings reloaded (tidemark.yaml changed): 2 workspaces (1 added, 0 removed)"),
            "\(serve.logText)")
        // alpha and beta both declare 'phones' in one project: said once, not again at every reload.
        func shared() -> Int { serve.logText.components(separatedBy: "both manage topic:phones").count - 1 }
        #expect(shared() == 1, "\(serve.logText)")
        try cli.write("tidemark.yaml", settings(["alpha", "beta"], interval: "20m"))
        try await waitUntil("alpha at 20m") {
            ($0["alpha"]?["settings"] as? [String: String])?["interval"] == "20m"
        }
        #expect(shared() == 1, "a reload that leaves the overlap as it was does not repeat it: \(serve.logText)")

        try cli.write("tidemark.yaml", "project: serve-test\nserve:\n  interval: soon\n")
        let deadline = Date().addingTimeInterval(90)
        while Date() < deadline, !serve.logText.contains("tidemark.yaml changed, but the settings do not load") {
            try await Task.sleep(for: .milliseconds(200))
        }
        #expect(serve.logText.contains("keeps those it runs with") && serve.logText.contains("tidemark.yaml:3"))
        let unloaded = try await serve.logLine { $0.contains("keeps those it runs with") }
        #expect(unloaded.contains(" error tidemark.serve"), "\(unloaded)")
        #expect(try await workspaces().count == 2, "a broken file changes nothing")

        // SIGHUP reloads (the broken file is still there: it says so, and serve goes on).
        kill(serve.process.processIdentifier, SIGHUP)
        let hup = Date().addingTimeInterval(90)
        while Date() < hup, !serve.logText.contains("SIGHUP received, but the settings do not load") {
            try await Task.sleep(for: .milliseconds(200))
        }
        #expect(serve.logText.contains("SIGHUP received, but the settings do not load"), "\(serve.logText)")
        #expect(serve.process.isRunning, "SIGHUP reloads; it does not end serve")

        // Mended without alpha: alpha is let go, beta goes on.
        try cli.write("tidemark.yaml", settings(["beta"], interval: "1h"))
        try await waitUntil("alpha removed") { $0.keys.sorted() == ["beta"] }
        #expect(serve.logText.contains("workspace=alpha is no longer listed"), "\(serve.logText)")
        #expect(
            serve.logText.contains("no two workspaces declare one topic or device group in one FCM project any more"),
            "\(serve.logText)")

        // beta's state moves to another file: a runner of its own claims it there.
        try cli.write(
            "tidemark.yaml",
            "project: serve-test\nserve:\n  interval: 1h\n  workspaces:\n    - {name: beta, manifests: beta, state: moved.db}\n"
        )
        try await waitUntil("beta reconciled in moved.db") {
            ($0["beta"]?["state"] as? String)?.contains("moved.db") == true
                && $0["beta"]?["phase"] as? String == "ready"
        }
        #expect(serve.logText.contains("workspace=beta is no longer listed in tidemark.yaml with this state"))
        let moved = try cli.run(["status", "beta", "--format", "json"])
        let json = try JSONSerialization.jsonObject(with: Data(moved.stdout.utf8)) as? [String: Any]
        let owner = ((json?["workspaces"] as? [[String: Any]])?.first)?["owner"]
        #expect(owner is String, "the runner claims beta in moved.db: \(moved.stdout) \(moved.stderr)")
        let (status, _) = serve.terminate()
        #expect(status == 0)
    }

    @Test func aSettingsErrorAtStartEndsServeWithExit1NamingTheFile() throws {
        let cli = try CLIRunner()
        defer { cli.remove() }
        try cli.write("tidemark.yaml", "project: serve-test\nrefresh: sometimes\n")
        let result = try cli.run(["serve", "--listen", "127.0.0.1:0"])
        #expect(result.status == 1)
        #expect(result.stderr.contains("tidemark.yaml:2"), "\(result.stderr)")
        let bad = try cli.run(["serve", "--interval", "soon"])
        #expect(bad.status == 64 && bad.stderr.contains("--interval must be a duration"), "\(bad.stderr)")
        let listen = try cli.run(["serve", "--listen", "nowhere"])
        #expect(listen.status == 64 && listen.stderr.contains("--listen must be HOST:PORT"), "\(listen.stderr)")
        // The embedded backend reaches no FCM: serve refuses it unless told, in one line naming the fix.
        try cli.write("tidemark.yaml", "project: serve-test\n")
        let embedded = try cli.run(["serve", "--listen", "127.0.0.1:0"])
        #expect(embedded.status == 1, "\(embedded.stderr)")
        #expect(
            embedded.stderr.contains("workspace 'default' reconciles against the embedded backend")
                && embedded.stderr.contains("'backend: fcm'") && embedded.stderr.contains("--allow-embedded"),
            "\(embedded.stderr)")
        #expect(embedded.stderr.split(separator: "\n").count == 1, "\(embedded.stderr)")
    }

    /// The shipped rules load, and `promtool test rules` runs their unit tests: each rule against the
    /// failure it names and the healthy two-replica cases it must stay quiet on.
    @Test func theExampleAlertRulesAreValidAndTested() throws {
        let directory = CLIRunner.repositoryRoot.appendingPathComponent("examples/serve")
        func promtool(_ arguments: [String]) throws -> (status: Int32, output: String) {
            let process = Process()
            process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
            process.arguments = ["promtool"] + arguments
            process.currentDirectoryURL = directory
            let output = Pipe()
            process.standardOutput = output
            process.standardError = output
            try process.run()
            let text = String(decoding: output.fileHandleForReading.readAll(), as: UTF8.self)
            process.waitUntilExit()
            return (process.terminationStatus, text)
        }
        let check = try promtool(["check", "rules", "alerts.yml"])
        #expect(check.status == 0, "\(check.output)")
        #expect(check.output.contains("SUCCESS: 8 rules found"), "\(check.output)")
        let tested = try promtool(["test", "rules", "alerts.test.yml"])
        #expect(tested.status == 0 && tested.output.contains("SUCCESS"), "\(tested.output)")
        // Every rule is tested, firing at least once.
        let tests = try String(contentsOf: directory.appendingPathComponent("alerts.test.yml"), encoding: .utf8)
        let rules = try String(contentsOf: directory.appendingPathComponent("alerts.yml"), encoding: .utf8)
        let names = rules.split(separator: "\n").compactMap { line -> String? in
            let trimmed = line.trimmingCharacters(in: .whitespaces)
            return trimmed.hasPrefix("- alert: ") ? String(trimmed.dropFirst("- alert: ".count)) : nil
        }
        #expect(names.count == 8)
        for name in names {
            #expect(
                tests.contains("alertname: \(name)\n    exp_alerts:\n    - exp_labels:"),
                "\(name) never fires in a test")
        }
    }

    /// The deployment recipes run what exists: the arguments they pass parse as `serve`'s, the probes
    /// and the scrape reach the endpoints `serve` answers, the container image unpacks the tarball
    /// `scripts/release.sh` makes, and the unit stops with the signal `serve` treats as a normal stop.
    @Test func theDeploymentRecipesMatchWhatServeDoes() throws {
        let cli = try CLIRunner()
        defer { cli.remove() }
        /// Runs the recipe's arguments where its project directory does not exist: they parse (no
        /// usage error, 64), and serve stops at its settings (exit 1, naming the directory).
        func parses(_ arguments: [String]) throws {
            let result = try cli.run(arguments)
            #expect(result.status == 1, "\(arguments): \(result.status) \(result.stderr)")
            #expect(!result.stderr.contains("Usage:"), "\(result.stderr)")
        }
        let root = CLIRunner.repositoryRoot.appendingPathComponent("examples/serve")
        let kubernetes = try String(contentsOf: root.appendingPathComponent("kubernetes.yaml"), encoding: .utf8)
        let documents = try Yams.load_all(yaml: kubernetes).compactMap { $0 as? [String: Any] }
        let kinds = documents.compactMap { $0["kind"] as? String }
        #expect(kinds == ["ServiceAccount", "Deployment", "Service", "ServiceMonitor"], "\(kinds)")
        let deployment = try #require(documents.first { $0["kind"] as? String == "Deployment" })
        let spec = try #require(deployment["spec"] as? [String: Any])
        #expect(spec["replicas"] as? Int == 2)
        let pod = try #require((spec["template"] as? [String: Any])?["spec"] as? [String: Any])
        #expect((pod["terminationGracePeriodSeconds"] as? Int ?? 0) > 30)
        let container = try #require((pod["containers"] as? [[String: Any]])?.first)
        let args = try #require(container["args"] as? [String])
        #expect(args.first == "serve")
        #expect(args.contains("0.0.0.0:9464"))
        try parses(args)
        for (probe, path) in [("livenessProbe", "/livez"), ("readinessProbe", "/readyz")] {
            let get = (container[probe] as? [String: Any])?["httpGet"] as? [String: Any]
            #expect(get?["path"] as? String == path, "\(probe)")
        }
        let ports = try #require(container["ports"] as? [[String: Any]])
        #expect(ports.first?["containerPort"] as? Int == 9464)
        let monitor = try #require(documents.last?["spec"] as? [String: Any])
        #expect(((monitor["endpoints"] as? [[String: Any]])?.first?["path"]) as? String == "/metrics")
        let secretNames = ((container["env"] as? [[String: Any]]) ?? []).compactMap { $0["name"] as? String }
        #expect(secretNames.contains("TIDEMARK_STATE_URL"), "PostgreSQL state: two replicas share it")

        let containerfile = try String(contentsOf: root.appendingPathComponent("Containerfile"), encoding: .utf8)
        let release = try String(
            contentsOf: CLIRunner.repositoryRoot.appendingPathComponent("scripts/release.sh"), encoding: .utf8)
        #expect(release.contains(#"NAME="tidemark-$VERSION-linux-$ARCH""#))
        #expect(containerfile.contains("tidemark-${VERSION}-linux-${ARCH}.tar.gz.sha256"))
        #expect(containerfile.contains("sha256sum -c"))
        let entrypoint = try #require(
            containerfile.split(separator: "\n").first { $0.hasPrefix("ENTRYPOINT") }.map(String.init))
        let words = try #require(
            try JSONSerialization.jsonObject(with: Data(entrypoint.dropFirst("ENTRYPOINT ".count).utf8)) as? [String])
        #expect(words.first == "/usr/local/bin/tidemark")
        try parses(Array(words.dropFirst()))

        let unit = try String(contentsOf: root.appendingPathComponent("tidemark.service"), encoding: .utf8)
        let exec = try #require(unit.split(separator: "\n").first { $0.hasPrefix("ExecStart=") })
        let command = exec.dropFirst("ExecStart=".count).split(separator: " ").map(String.init)
        try parses(Array(command.dropFirst()))
        #expect(unit.contains("KillSignal=SIGTERM") && unit.contains("User=tidemark"))
    }

    /// `promtool check metrics` on `text` (Debian's prometheus package, which the test command installs).
    static func promtool(_ text: String) throws -> (status: Int32, output: String) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["promtool", "check", "metrics"]
        let input = Pipe()
        let output = Pipe()
        process.standardInput = input
        process.standardOutput = output
        process.standardError = output
        try process.run()
        input.fileHandleForWriting.write(Data(text.utf8))
        try input.fileHandleForWriting.close()
        let data = output.fileHandleForReading.readAll()
        process.waitUntilExit()
        return (process.terminationStatus, String(decoding: data, as: UTF8.self))
    }
}

/// HTTP/1.1 by hand on a loopback socket: what a hostile client sends, byte for byte.
enum RawHTTP {
    /// Sends `request` to 127.0.0.1:`port` and returns what comes back until the server closes the
    /// connection (or `waitSeconds` pass).
    static func exchange(port: Int, _ request: String, waitSeconds: Int = 10) -> String {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return "no socket" }
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard connected == 0 else { return "no connection" }
        var timeout = timeval(tv_sec: waitSeconds, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        _ = request.withCString { send(fd, $0, strlen($0), 0) }
        var received = [UInt8]()
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = recv(fd, &buffer, buffer.count, 0)
            if n <= 0 { break }
            received += buffer[0..<n]
        }
        return String(decoding: received, as: UTF8.self)
    }
}
