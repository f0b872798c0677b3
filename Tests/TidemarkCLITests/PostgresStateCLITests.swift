import Foundation
import Testing

/// The CLI with its state in a real PostgreSQL server (`scripts/postgres.sh`, started by the test
/// command): the demo converges, two runners on one workspace exclude each other, and a killed apply
/// resumes from the database. Skipped only on a developer's machine without the server; required in CI.
@Suite(.serialized, .enabled(if: PostgresForCLI.enabled)) struct PostgresStateCLITests {
    func environment(latency: Int? = nil) throws -> [String: String] {
        let url = try #require(PostgresForCLI.url, "no PostgreSQL server: run the tests with scripts/test.sh")
        var environment = ["TIDEMARK_STATE_URL": url]
        if let latency { environment["TIDEMARK_EMBEDDED_LATENCY_MS"] = String(latency) }
        return environment
    }

    static func workspace() -> String { "cli-\(UUID().uuidString.prefix(8).lowercased())" }

    @Test func theDemoConvergesWithStateInPostgres() throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        let ws = Self.workspace()
        let env = try environment()
        let plan = try cli.run(["plan", "--workspace", ws, "--detailed-exitcode"], environment: env)
        #expect(plan.status == 2, "\(plan.stderr)")
        let apply = try cli.run(["apply", "--auto-approve", "--workspace", ws], environment: env)
        #expect(apply.status == 0, "\(apply.stderr)")
        #expect(apply.stdout.contains("Apply complete"))
        let again = try cli.run(["plan", "--workspace", ws, "--detailed-exitcode"], environment: env)
        #expect(again.status == 0, "\(again.stdout)\(again.stderr)")
        // The state is in the database's tables, not in a local file.
        let show = try cli.run(["state", "list", "--workspace", ws], environment: env)
        #expect(show.status == 0, "\(show.stderr)")
        #expect(show.stdout.contains("(workspace \(ws))"), "\(show.stdout)")
        #expect(!FileManager.default.fileExists(atPath: cli.project.appendingPathComponent(".tidemark/state.db").path))
        // Another workspace of the same database has no state of its own.
        let other = try cli.run(["drift", "--workspace", ws + "-other"], environment: env)
        #expect(other.status == 1)
        // `workspace list` names this one, current, with its size and last apply.
        let list = try cli.run(["workspace", "list", "--workspace", ws, "--format", "json"], environment: env)
        #expect(list.status == 0, "workspace list: \(list.stderr)")
        let listed = try #require(
            try? JSONSerialization.jsonObject(with: Data(list.stdout.utf8)) as? [String: Any],
            "workspace list printed no JSON: \(list.stdout)\(list.stderr)")
        let mine = (listed["workspaces"] as? [[String: Any]])?.first { $0["name"] as? String == ws }
        #expect(mine?["current"] as? Bool == true && (mine?["tokens"] as? Int ?? 0) > 0, "\(list.stdout)")
        #expect((mine?["last_apply"] as? [String: Any])?["status"] as? String == "finished", "\(list.stdout)")
        #expect(
            !((listed["workspaces"] as? [[String: Any]]) ?? []).contains { $0["name"] as? String == ws + "-other" })
        // Deleted (it manages memberships: only with --force), it is gone from the database's list.
        #expect(try cli.run(["workspace", "delete", ws], environment: env).status == 1)
        let deleted = try cli.run(["workspace", "delete", ws, "--force"], environment: env)
        #expect(deleted.status == 0 && deleted.stdout.contains("Deleted workspace '\(ws)'"), "\(deleted.stderr)")
        let after = try cli.run(["workspace", "list", "--format", "json"], environment: env)
        #expect(!after.stdout.contains("\"\(ws)\""), "\(after.stdout)")
        let replan = try cli.run(["plan", "--workspace", ws, "--detailed-exitcode"], environment: env)
        #expect(replan.status == 2, "a deleted workspace plans from nothing: \(replan.stdout)\(replan.stderr)")
        // --state wins over TIDEMARK_STATE_URL: a SQLite file here has no state.
        let local = try cli.run(["plan", "--state", "local.db", "--detailed-exitcode"], environment: env)
        #expect(local.status == 2)
    }

    @Test func aSecondRunnerIsRefusedNamingTheHolderAndAKilledApplyResumes() throws {
        // 400 devices and 40 topics: no refresh (reading 400 registrations one at a time would take
        // most of the time), then 40 subscribe calls slowed to 1 s each, so the window in which the
        // apply holds the lease with some operations journaled lasts about 40 s: a 'state list' on a
        // runner loaded by the whole suite can take seconds, and a 12 s window was once missed.
        let cli = try InterruptedApplyTests().makeProject()
        defer { cli.remove() }
        let ws = Self.workspace()
        let slow = try environment(latency: 1000)
        let (process, _, _) = try cli.start(
            ["apply", "--auto-approve", "--no-refresh", "--parallelism", "1", "--workspace", ws], environment: slow)
        defer {
            if process.isRunning { kill(process.processIdentifier, SIGKILL) }
            process.waitUntilExit()
        }
        // Wait until the apply holds the lease and has journaled a few operations.
        let deadline = Date().addingTimeInterval(120)
        var listing = ""
        while Date() < deadline, process.isRunning {
            let result = try cli.run(["state", "list", "--workspace", ws], environment: slow)
            listing = result.stdout
            if listing.contains("running"),
                listing.range(of: #"\b([3-9]|[1-9][0-9]+)/40"#, options: .regularExpression) != nil
            {
                break
            }
            Thread.sleep(forTimeInterval: 0.05)
        }
        #expect(process.isRunning, "the apply finished before the test could interrupt it: \(listing)")
        let started = Date()
        let second = try cli.run(["apply", "--auto-approve", "--workspace", ws], environment: try environment())
        // Refused, not queued behind the holder (whose apply runs about 40 s): a loaded runner takes
        // seconds to start a debug binary, so the bound is generous.
        #expect(Date().timeIntervalSince(started) < 30)
        #expect(second.status == 1)
        #expect(
            second.stderr.contains("is locked by tidemark apply (pid \(process.processIdentifier)"), "\(second.stderr)")
        let lock = try cli.run(["state", "lock", "--workspace", ws], environment: slow)
        #expect(lock.status == 2)
        #expect(lock.stdout.contains("pid \(process.processIdentifier)"), "\(lock.stdout)")

        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
        // The killed holder's lease is recognised as stale (its process is gone), and the apply resumes.
        let resumed = try cli.run(["apply", "--auto-approve", "--workspace", ws], environment: try environment())
        #expect(resumed.status == 0, "\(resumed.stderr)")
        #expect(resumed.stderr.contains("Resuming the apply"), "\(resumed.stderr)")
        let plan = try cli.run(["plan", "--workspace", ws, "--detailed-exitcode"], environment: try environment())
        #expect(plan.status == 0, "\(plan.stdout)")
    }
}

extension PostgresStateCLITests {
    /// State moves between stores whole (lineage, serial, versions): SQLite to PostgreSQL with
    /// `migrate`, back to a file with `pull`; an older snapshot is never pushed over newer state.
    @Test func stateMovesBetweenStoresWhole() throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        let url = try #require(PostgresForCLI.url)
        let ws = Self.workspace()
        #expect(try cli.run(["apply", "--auto-approve"]).status == 0)
        let saved = try cli.run(["plan", "--no-refresh", "--out", "plan.json"])
        #expect(saved.status == 0)
        let migrate = try cli.run(["state", "migrate", "--to", url, "--to-workspace", ws])
        #expect(migrate.status == 0, "\(migrate.stderr)")
        let env = ["TIDEMARK_STATE_URL": url]
        // The same serial and versions: a plan saved against the SQLite state applies against PostgreSQL.
        let apply = try cli.run(["apply", "plan.json", "--workspace", ws], environment: env)
        #expect(apply.status == 0, "\(apply.stdout)\(apply.stderr)")
        #expect(
            try cli.run(["state", "migrate", "--to", url, "--to-workspace", ws]).status == 1, "the target holds state")
        let pull = try cli.run(["state", "pull", "snapshot.db", "--workspace", ws], environment: env)
        #expect(pull.status == 0, "\(pull.stderr)")
        let fromFile = try cli.run(["plan", "--state", "snapshot.db", "--no-refresh", "--detailed-exitcode"])
        #expect(fromFile.status == 0, "\(fromFile.stdout)\(fromFile.stderr)")
        let push = try cli.run(["state", "push", "snapshot.db", "--workspace", ws], environment: env)
        #expect(push.status == 1)
        #expect(push.stderr.contains("not newer than"), "\(push.stderr)")
    }
}

enum PostgresForCLI {
    static let url = ProcessInfo.processInfo.environment["TIDEMARK_TEST_POSTGRES_URL"]
    static var enabled: Bool {
        url != nil || ProcessInfo.processInfo.environment["TIDEMARK_REQUIRE_POSTGRES"] != nil
            || ProcessInfo.processInfo.environment["CI"] != nil
    }
}

/// The CLI with its state reached through PgBouncer in transaction pooling (`scripts/pgbouncer.sh`):
/// the demo converges, and a second runner is refused while the first holds the workspace.
@Suite(.serialized, .enabled(if: PgBouncerForCLI.enabled)) struct PgBouncerStateCLITests {
    @Test func theDemoConvergesThroughPgBouncer() throws {
        let url = try #require(PgBouncerForCLI.url, "no PgBouncer: run the tests with scripts/test.sh")
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        let ws = "bouncer-cli-\(UUID().uuidString.prefix(8).lowercased())"
        let env = ["TIDEMARK_STATE_URL": url]
        let apply = try cli.run(["apply", "--auto-approve", "--workspace", ws], environment: env)
        #expect(apply.status == 0, "\(apply.stderr)")
        let again = try cli.run(["plan", "--workspace", ws, "--detailed-exitcode"], environment: env)
        #expect(again.status == 0, "\(again.stdout)\(again.stderr)")
        let list = try cli.run(["state", "list", "--workspace", ws], environment: env)
        #expect(list.status == 0 && list.stdout.contains("(workspace \(ws))"), "\(list.stdout)")
        let pulled = try cli.run(["state", "pull", "copy.db", "--workspace", ws], environment: env)
        #expect(pulled.status == 0, "\(pulled.stderr)")
        let local = try cli.run(["plan", "--state", "copy.db", "--no-refresh", "--detailed-exitcode"])
        #expect(local.status == 0, "the snapshot taken through the bouncer is whole: \(local.stdout)")
    }
}

enum PgBouncerForCLI {
    static let url = ProcessInfo.processInfo.environment["TIDEMARK_TEST_PGBOUNCER_URL"]
    static var enabled: Bool { url != nil || ProcessInfo.processInfo.environment["TIDEMARK_REQUIRE_PGBOUNCER"] != nil }
}
