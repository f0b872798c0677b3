import Foundation
import Synchronization
import Testing

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// The issue-35 campaign's cases through the built binary: a saved plan applied against an FCM that
/// lost the fleet, and a lease holder paused past its lease while another run applies.
@Suite(.serialized) struct TrustUnderFaultsCLITests {
    struct Traffic: Decodable { var requests: Int }

    /// `plan --out` against the emulator that holds the fleet; `apply plan.json` (recent, so nothing is
    /// read first) against one restarted without its data: refused, no token called dead, no dead list.
    @Test func aSavedPlanAgainstAnEmulatorWithoutItsDataCallsNoTokenDead() async throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        let right = try EmulatorServeTests.Server.startForDemo(cli)
        let apply = try cli.run(["apply", "--auto-approve", "--backend", "emulator"], environment: right.environment)
        #expect(apply.status == 0, "\(apply.stderr)")
        try cli.write(
            "manifests/launch.yaml",
            "topics:\n  - name: launch-all\n    members: [{selector: {platform: [android, ios]}}]\n")
        let plan = try cli.run(["plan", "--backend", "emulator", "--out", "plan.json"], environment: right.environment)
        #expect(plan.status == 0, "\(plan.stderr)")
        _ = right.stop()
        // The same project, restarted without its data: it knows none of the fleet's registrations.
        let wrong = try EmulatorServeTests.Server.start(
            cli, data: nil, extra: ["--rate-limit", "0", "--project", "tidemark-demo"])
        defer { _ = wrong.stop() }
        let run = try cli.run(
            ["apply", "plan.json", "--backend", "emulator", "--dead-tokens", "dead.ndjson"],
            environment: wrong.environment)
        #expect(run.status == 1, "\(run.stdout)\(run.stderr)")
        #expect(run.stderr.contains("were answered as unregistered"), "\(run.stderr)")
        #expect(run.stderr.contains(String(wrong.base.dropFirst("http://".count))), "\(run.stderr)")
        #expect(run.stderr.contains("no token was recorded as dead"))
        let dead = (try? String(contentsOf: cli.project.appendingPathComponent("dead.ndjson"), encoding: .utf8)) ?? ""
        #expect(dead.isEmpty, "no dead token is reported")
        let state = try cli.run(["state", "list"])
        #expect(state.status == 0, "\(state.stderr)")
        #expect(state.stdout.contains(", 0 dead."), "\(state.stdout)")
    }

    /// Holder A is paused (SIGSTOP) past its 3 s lease; B takes the workspace over and finishes the
    /// apply; A, resumed, sends nothing more to FCM and says why.
    @Test(.enabled(if: PostgresForCLI.enabled)) func aPausedHolderSendsNothingAfterLosingItsLease() async throws {
        let cli = try InterruptedApplyTests().makeProject()
        defer { cli.remove() }
        try cli.write("tidemark.yaml", "project: zombie-test\n")
        let server = try EmulatorServeTests.Server.start(
            cli, data: nil,
            extra: ["--auto-register", "--rate-limit", "0", "--project", "zombie-test", "--latency", "1000"])
        defer { _ = server.stop() }
        let url = try #require(PostgresForCLI.url)
        var environment = server.environment
        environment["TIDEMARK_STATE_URL"] = url + (url.contains("?") ? "&" : "?") + "lease=3"
        let ws = PostgresStateCLITests.workspace()
        // IID: one request per operation, one at a time, so the requests in flight are few and known.
        let arguments = [
            "apply", "--auto-approve", "--no-refresh", "--parallelism", "1", "--backend", "emulator",
            "--transport", "iid", "--workspace", ws,
        ]
        let (holder, _, err) = try cli.start(arguments, environment: environment)
        defer {
            if holder.isRunning { kill(holder.processIdentifier, SIGKILL) }
            holder.waitUntilExit()
        }
        // Paused once three of its batches reached the emulator: polled through the emulator's
        // counters, without suspending this task. On a loaded 2-core runner the other tests' blocking
        // waits can hold the cooperative pool longer than the whole apply runs, and a poll that awaits
        // between reads once saw the apply finish first.
        let deadline = Date().addingTimeInterval(120)
        while Date() < deadline, holder.isRunning {
            if Self.requestsCounted(by: server.base) >= 3 { break }
            usleep(50_000)
        }
        guard holder.isRunning else {
            holder.waitUntilExit()
            let stderr = String(decoding: err.fileHandleForReading.readAll(), as: UTF8.self)
            Issue.record("the apply ended before it could be paused: \(stderr)")
            return
        }
        kill(holder.processIdentifier, SIGSTOP)
        try await Task.sleep(for: .seconds(5))
        let second = try cli.run(arguments + ["--lock-timeout", "60"], environment: environment)
        #expect(second.status == 0, "\(second.stdout)\(second.stderr)")
        let (_, before) = try await server.call("GET", "/emulator/v1/traffic")
        kill(holder.processIdentifier, SIGCONT)
        let waited = Date().addingTimeInterval(60)
        while holder.isRunning, Date() < waited { try await Task.sleep(for: .milliseconds(100)) }
        #expect(!holder.isRunning, "the resumed holder stops on its own")
        let (_, after) = try await server.call("GET", "/emulator/v1/traffic")
        #expect(
            (after["requests"] as? Int) == (before["requests"] as? Int),
            "the resumed holder sent no request: \(before) then \(after)")
        holder.waitUntilExit()
        let stderr = String(decoding: err.fileHandleForReading.readAll(), as: UTF8.self)
        #expect(holder.terminationStatus == 1, "\(stderr)")
        // It learns it from its lease check, or (paused inside a save) from the transaction the server
        // ended or the timer that ran out while it was stopped.
        #expect(
            stderr.contains("no longer holds the lease") || stderr.contains("did not answer within")
                || stderr.contains("terminating connection"), "\(stderr)")
        let plan = try cli.run(
            [
                "plan", "--backend", "emulator", "--transport", "iid", "--refresh", "all", "--workspace", ws,
                "--detailed-exitcode",
            ], environment: environment)
        #expect(plan.status == 0, "\(plan.stdout)\(plan.stderr)")
    }

    /// The requests the emulator at `base` counted, read on the calling thread (the answer comes on
    /// URLSession's own queue, not the cooperative pool); 0 when it does not answer within 5 s.
    static func requestsCounted(by base: String) -> Int {
        let answer = Mutex<Int>(0)
        let done = DispatchSemaphore(value: 0)
        let task = URLSession.shared.dataTask(with: URL(string: base + "/emulator/v1/traffic")!) { data, _, _ in
            let json = data.flatMap { try? JSONSerialization.jsonObject(with: $0) } as? [String: Any]
            answer.withLock { $0 = json?["requests"] as? Int ?? 0 }
            done.signal()
        }
        task.resume()
        if done.wait(timeout: .now() + 5) == .timedOut { task.cancel() }
        return answer.withLock { $0 }
    }
}
