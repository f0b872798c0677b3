import Foundation
import Testing
import TidemarkCore
import TidemarkTesting

/// The inventory read from the app's own PostgreSQL table, and dead tokens written back to it.
@Suite(.enabled(if: PostgresForCLI.enabled)) struct DatabaseInventoryCLITests {
    /// Runs SQL with psql (installed with the server by scripts/postgres.sh); returns its unaligned output.
    @discardableResult
    static func psql(_ sql: String) throws -> String {
        let url = try #require(PostgresForCLI.url, "no PostgreSQL server for the tests: run scripts/test.sh")
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["psql", url, "-v", "ON_ERROR_STOP=1", "-qAtc", sql]
        let out = Pipe()
        process.standardOutput = out
        try process.run()
        let data = out.fileHandleForReading.readAll()
        process.waitUntilExit()
        #expect(process.terminationStatus == 0, "psql failed on: \(sql)")
        return String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
    }

    @Test func plansFromATokenTableAndMarksDeadTokensInactive() async throws {
        let table = "fcm_tokens_\(UUID().uuidString.prefix(8).lowercased())"
        var rows: [String] = []
        for i in 0..<40 {
            let seen = i % 10 == 9 ? "now() - interval '400 days'" : "now() - interval '\(i) hours'"
            rows.append(
                "(\(i), 'u\(i / 2)', '\(Fixtures.token(i, prefix: "app"))', '\(i % 2 == 0 ? "ios" : "android")', \(i % 8 != 7), \(seen))"
            )
        }
        try Self.psql(
            "CREATE TABLE \(table) (id bigint primary key, user_id text, token text, platform text, active boolean not null, last_seen timestamptz); INSERT INTO \(table) VALUES \(rows.joined(separator: ","))"
        )
        defer { _ = try? Self.psql("DROP TABLE \(table)") }
        let cli = try CLIRunner()
        defer { cli.remove() }
        try cli.write(
            "tidemark.yaml",
            """
            project: tidemark-demo
            backend: emulator
            inventory:
              - name: app-db
                postgres:
                  url_env: TM_APP_DATABASE_URL
                  query: >
                    select 'd' || id as device_id, token, platform, user_id, last_seen
                    from \(table) where active
                on_dead: "update \(table) set active = false where token = $1"
                exclude_if: {last_seen_older_than: 270d}
            """)
        try cli.write(
            "manifests/topics.yaml",
            """
            topics:
              - name: ios-news
                members: [{selector: {platform: ios}}]
              - name: android-news
                members: [{selector: {platform: android}}]
            """)
        let server = try EmulatorServeTests.Server.startForDemo(cli)
        defer { _ = server.stop() }
        var environment = server.environment
        environment["TM_APP_DATABASE_URL"] = PostgresForCLI.url!
        // 40 rows, 5 inactive (i % 8 == 7), 4 last seen 400 days ago (d39 also inactive): 32 devices.
        let validate = try cli.run(["validate"], environment: environment)
        #expect(validate.status == 0, "\(validate.stdout)\(validate.stderr)")
        #expect(validate.stdout.contains("32 devices"), "\(validate.stdout)")
        let apply = try cli.run(["apply", "--auto-approve"], environment: environment)
        #expect(apply.status == 0, "\(apply.stdout)\(apply.stderr)")
        #expect(!apply.stdout.contains("Dead tokens"), "\(apply.stdout)")
        let again = try cli.run(["plan", "--detailed-exitcode"], environment: environment)
        #expect(again.status == 0, "\(again.stdout)\(again.stderr)")
        // The app uninstalls on device d2: FCM forgets its token.
        let token = Fixtures.token(2, prefix: "app")
        let (status, _) = try await server.call(
            "DELETE",
            "/emulator/v1/projects/tidemark-demo/registrations/\(token.addingPercentEncoding(withAllowedCharacters: .alphanumerics)!)"
        )
        #expect(status == 200)
        // plan reads it dead but writes nothing back.
        let plan = try cli.run(["plan"], environment: environment)
        #expect(plan.status == 0, "\(plan.stderr)")
        #expect(try Self.psql("select active from \(table) where id = 2") == "t", "plan never writes to a source")
        let dead = try cli.run(["apply", "--auto-approve", "--dead-tokens", "dead.ndjson"], environment: environment)
        #expect(dead.status == 0, "\(dead.stdout)\(dead.stderr)")
        #expect(dead.stdout.contains("reported 1 to 'app-db' (on_dead); 1 row changed"), "\(dead.stdout)")
        #expect(try Self.psql("select active from \(table) where id = 2") == "f")
        let file = cli.project.appendingPathComponent("dead.ndjson")
        let lines = try String(contentsOf: file, encoding: .utf8).split(separator: "\n")
        #expect(lines.count == 1)
        let line = try JSONSerialization.jsonObject(with: Data(lines[0].utf8)) as? [String: Any]
        #expect(line?["device_id"] as? String == "d2")
        #expect(line?["token"] as? String == token)
        #expect(line?["source"] as? String == "inventory source 'app-db'")
        #expect(line?["token_redacted"] as? String == Redaction.redact(token))
        let mode = try FileManager.default.attributesOfItem(atPath: file.path)[.posixPermissions] as? Int
        #expect(mode == 0o600, "the file holds full tokens")
        #expect(!dead.stdout.contains(token) && !dead.stderr.contains(token))
        // The row is inactive now, so the query no longer lists it: nothing to report again.
        let next = try cli.run(["apply", "--auto-approve", "--dead-tokens", "dead.ndjson"], environment: environment)
        #expect(next.status == 0, "\(next.stdout)\(next.stderr)")
        #expect(!next.stdout.contains("reported"), "\(next.stdout)")
        #expect(try String(contentsOf: file, encoding: .utf8).isEmpty)
        // A token rotated in the table: the plan moves the device's memberships to the new token.
        try Self.psql("update \(table) set token = '\(Fixtures.token(1003, prefix: "app"))' where id = 3")
        let rotated = try cli.run(["plan", "--detailed-exitcode"], environment: environment)
        #expect(rotated.status == 2, "\(rotated.stdout)\(rotated.stderr)")
        #expect(rotated.stdout.contains("(1 device rotated its token)"), "\(rotated.stdout)")
        #expect(rotated.stdout.contains("device d3: "), "\(rotated.stdout)")
        #expect(rotated.stdout.contains("(−1 +1 membership)"), "\(rotated.stdout)")
        let json = try cli.run(["plan", "--format", "json"], environment: environment)
        let saved = try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [String: Any]
        let rotations = saved?["rotations"] as? [[String: Any]]
        #expect(rotations?.count == 1 && rotations?.first?["device"] as? String == "d3", "\(json.stdout.prefix(400))")
        #expect(rotations?.first?["to"] as? String == Fixtures.token(1003, prefix: "app"))
        // Applied, the new token holds the device's topics and the next plan is clean.
        let moved = try cli.run(["apply", "--auto-approve"], environment: environment)
        #expect(moved.status == 0, "\(moved.stdout)\(moved.stderr)")
        let clean = try cli.run(["plan", "--detailed-exitcode"], environment: environment)
        #expect(clean.status == 0, "\(clean.stdout)\(clean.stderr)")
    }

    /// A query that fails, a missing variable, a hook that cannot run: one line naming tidemark.yaml's source.
    @Test func failuresNameTheSource() throws {
        let cli = try CLIRunner()
        defer { cli.remove() }
        try cli.write(
            "tidemark.yaml",
            """
            inventory:
              - name: app-db
                postgres: {url_env: TM_APP_DATABASE_URL, query: "select device_id, token from no_such_table"}
            """)
        try cli.write("manifests/topics.yaml", "topics: []\n")
        let unset = try cli.run(["plan"], environment: ["TM_APP_DATABASE_URL": ""])
        #expect(unset.status == 1)
        #expect(
            unset.stderr.contains(
                "tidemark.yaml:2:5: error: inventory source 'app-db' failed: the environment variable TM_APP_DATABASE_URL is not set"
            ), "\(unset.stderr)")
        let missing = try cli.run(["plan"], environment: ["TM_APP_DATABASE_URL": PostgresForCLI.url!])
        #expect(missing.status == 1)
        #expect(missing.stderr.contains("relation \"no_such_table\" does not exist"), "\(missing.stderr)")
        #expect(missing.stderr.split(separator: "\n").filter { $0.contains("error:") }.count == 1, "\(missing.stderr)")
    }
}
