import Foundation
import Testing

/// Plans you can trust: answers tidemark did not expect stop the command; they never read as dead
/// devices or "No changes".
@Suite(.serialized) struct TrustworthyPlanTests {
    struct Listing: Decodable {
        var serial: Int
        var tokens: Int
        var dead: Int
    }

    func stateListing(_ cli: CLIRunner) throws -> Listing {
        let listed = try cli.run(["state", "list", "--format", "json"])
        return try JSONDecoder().decode(Listing.self, from: Data(listed.stdout.utf8))
    }

    /// A URL that answers HTML 404 pages (a wrong path, a proxy) fails plan and apply over both
    /// transports with exit 1, naming the URL and the setting; state keeps every token live.
    @Test func aWrongURLStopsTheRunAndKillsNoDevice() throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        let server = try EmulatorServeTests.Server.startForDemo(cli)
        defer { _ = server.stop() }
        // The fcm backend throughout (state belongs to one backend), first at the right URL.
        let right = [
            "GOOGLE_APPLICATION_CREDENTIALS": server.keyFile, "TIDEMARK_FCM_URL": server.base,
            "TIDEMARK_IID_URL": server.base,
        ]
        let apply = try cli.run(["apply", "--auto-approve", "--backend", "fcm"], environment: right)
        #expect(apply.status == 0, "\(apply.stderr)")
        let before = try stateListing(cli)
        #expect(before.dead == 0 && before.tokens > 3000)

        let wrong = server.base + "/fcm-proxy/wrong"
        let environment = [
            "GOOGLE_APPLICATION_CREDENTIALS": server.keyFile, "TIDEMARK_FCM_URL": wrong, "TIDEMARK_IID_URL": wrong,
        ]
        for transport in ["v1", "iid"] {
            for command in [["plan"], ["apply", "--auto-approve"], ["drift"]] {
                let run = try cli.run(
                    command + ["--backend", "fcm", "--transport", transport], environment: environment)
                #expect(run.status == 1, "\(command) over \(transport): \(run.stdout)\(run.stderr)")
                #expect(run.stderr.contains("answered HTTP 404 with a body that is not JSON"), "\(run.stderr)")
                // The refresh fails first: v1 reads on fcm_url, IID reads on iid_url.
                let setting = transport == "v1" ? "TIDEMARK_FCM_URL" : "TIDEMARK_IID_URL"
                #expect(run.stderr.contains(setting), "\(run.stderr)")
                #expect(run.stderr.contains(wrong))
                #expect(!run.stdout.contains("No changes"))
                #expect(!run.stderr.contains(":APA91b"), "tokens are redacted in the message")
            }
        }
        let after = try stateListing(cli)
        #expect(after.dead == 0, "a wrong URL marks no device dead")
        #expect(after.serial == before.serial, "nothing was written")
        // The right URL still finds nothing to do.
        let plan = try cli.run(["plan", "--backend", "fcm", "--detailed-exitcode"], environment: right)
        #expect(plan.status == 0, "\(plan.stdout)\(plan.stderr)")
    }

    /// When a fifth of the fleet comes back dead at once, the refresh is refused unless --accept-dead.
    @Test func massDeathIsRefusedUnlessAccepted() async throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        let server = try EmulatorServeTests.Server.startForDemo(cli)
        defer { _ = server.stop() }
        let environment = server.environment
        #expect(
            try cli.run(["apply", "--auto-approve", "--backend", "emulator"], environment: environment).status == 0)
        // 700 of the demo's 3,000 devices uninstall the app at once: more than a fifth.
        let csv = try String(
            contentsOf: cli.project.appendingPathComponent("manifests/inventory/devices.csv"), encoding: .utf8)
        let tokens = csv.split(separator: "\n").dropFirst().prefix(700).map { String($0.split(separator: ",")[1]) }
        for token in tokens {
            let (status, _) = try await server.call(
                "DELETE",
                "/emulator/v1/projects/tidemark-demo/registrations/\(token.addingPercentEncoding(withAllowedCharacters: .alphanumerics)!)"
            )
            #expect(status == 200)
        }
        // A full read sees all 700 (a sample sees its share of them, and is refused the same way).
        let refused = try cli.run(["plan", "--backend", "emulator", "--refresh", "all"], environment: environment)
        #expect(refused.status == 1, "\(refused.stdout)\(refused.stderr)")
        #expect(refused.stderr.contains("came back unregistered at once"), "\(refused.stderr)")
        #expect(refused.stderr.contains("--accept-dead"))
        let accepted = try cli.run(
            ["plan", "--backend", "emulator", "--accept-dead", "--refresh", "all"], environment: environment)
        #expect(accepted.status == 0, "\(accepted.stderr)")
        #expect(
            !accepted.stdout.contains("FCM matches the manifests"),
            "700 dead devices are no all-clear: \(accepted.stdout)")
        #expect(accepted.stdout.contains("700 tokens are no longer registered in FCM"), "\(accepted.stdout)")
        #expect(try stateListing(cli).dead == 0, "plan never writes state")
    }

    /// `--out` replaces an older plan, never a manifest; applying a manifest names the mistake.
    @Test func plansNeverOverwriteManifests() throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        let manifest = cli.project.appendingPathComponent("manifests/ops.yaml").path
        let original = try String(contentsOfFile: manifest, encoding: .utf8)
        let overwrite = try cli.run(["plan", "--out", "manifests/ops.yaml"])
        #expect(overwrite.status == 1)
        #expect(
            overwrite.stderr.contains("manifests/ops.yaml exists and is not a tidemark plan"), "\(overwrite.stderr)")
        #expect(try String(contentsOfFile: manifest, encoding: .utf8) == original)
        let apply = try cli.run(["apply", "manifests/ops.yaml"])
        #expect(apply.status == 1)
        #expect(apply.stderr.contains("is not a tidemark plan file"))
        #expect(!apply.stderr.contains("--out manifests/ops.yaml"), "\(apply.stderr)")
        // An older plan is replaced.
        #expect(try cli.run(["plan", "--out", "plan.json"]).status == 0)
        #expect(try cli.run(["plan", "--out", "plan.json"]).status == 0)
        // A plan edited after review (an unsubscribe inserted) is named as such and nothing is applied.
        let planURL = cli.project.appendingPathComponent("plan.json")
        var object = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: planURL)) as? [String: Any])
        var operations = try #require(object["operations"] as? [[String: Any]])
        let victim = try #require(operations.first { $0["kind"] as? String == "subscribe" })
        operations.insert(["kind": "unsubscribe", "target": "ops-canary", "tokens": victim["tokens"]!], at: 0)
        object["operations"] = operations
        try JSONSerialization.data(withJSONObject: object).write(to: planURL)
        let edited = try cli.run(["apply", "plan.json"])
        #expect(edited.status == 1)
        #expect(edited.stderr.contains("plan.json was edited or damaged"), "\(edited.stderr)")
        #expect(try cli.run(["state", "list"]).status == 1, "no state was written")
        // A selector with a typo is an error naming the closest topic.
        let typo = try cli.run(["plan", "--target", "topic:weather-north-see"])
        #expect(typo.status == 1)
        #expect(typo.stderr.contains("matches no topic or group"), "\(typo.stderr)")
        #expect(typo.stderr.contains("closest: topic:weather-"), "\(typo.stderr)")
        // Drift with no state has nothing to compare.
        let fresh = try CLIRunner(demo: true)
        defer { fresh.remove() }
        let drift = try fresh.run(["drift", "--detailed-exitcode"])
        #expect(drift.status == 1 && drift.stderr.contains("nothing to compare"), "\(drift.stdout)\(drift.stderr)")
    }

    /// A user who turns a topic off in the app (the app unsubscribes itself) stays unsubscribed from an
    /// additive topic: drift reports an opt-out (exit 0 with --detailed-exitcode) and apply leaves it.
    @Test func anInAppOptOutIsRespected() async throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        let server = try EmulatorServeTests.Server.startForDemo(cli)
        defer { _ = server.stop() }
        let environment = server.environment
        let planned = try cli.run(["plan", "--backend", "emulator", "--format", "json"], environment: environment)
        struct PlanJSON: Decodable {
            struct Operation: Decodable {
                var kind: String
                var target: String
                var tokens: [String]
            }
            struct Topic: Decodable {
                var topic: String
                var mode: String
            }
            var operations: [Operation]
            var topics: [Topic]
        }
        let decoder = JSONDecoder()
        decoder.keyDecodingStrategy = .convertFromSnakeCase
        let plan = try decoder.decode(PlanJSON.self, from: Data(planned.stdout.utf8))
        let additive = Set(plan.topics.filter { $0.mode == "additive" }.map(\.topic))
        let op = try #require(plan.operations.first { $0.kind == "subscribe" && additive.contains($0.target) })
        let token = try #require(op.tokens.first)
        #expect(
            try cli.run(["apply", "--auto-approve", "--backend", "emulator"], environment: environment).status == 0)
        // The app unsubscribes itself, as the client SDK does when the user opts out.
        let bearer = try await server.accessToken()
        let encoded = token.addingPercentEncoding(withAllowedCharacters: .alphanumerics)!
        let (status, _) = try await server.call(
            "DELETE", "/v1/projects/tidemark-demo/registrations/\(encoded)/topicSubscriptions/\(op.target)",
            headers: ["Authorization": "Bearer \(bearer)"])
        #expect(status == 200)
        // The device is in no plan, so only a full read (or the sweep reaching it) sees the opt-out.
        let all = ["--backend", "emulator", "--refresh", "all"]
        let drift = try cli.run(["drift", "--detailed-exitcode"] + all, environment: environment)
        #expect(drift.status == 0, "an opt-out is not drift: \(drift.stdout)\(drift.stderr)")
        #expect(drift.stdout.contains("1 opt-out in the app, respected"), "\(drift.stdout)")
        let apply = try cli.run(["apply", "--auto-approve"] + all, environment: environment)
        #expect(apply.status == 0, "\(apply.stderr)")
        let (_, registration) = try await server.call(
            "GET", "/emulator/v1/projects/tidemark-demo/registrations/\(encoded)")
        let topics = try #require(registration["topics"] as? [String])
        #expect(!topics.contains(op.target), "the opt-out was respected")
        let again = try cli.run(["plan"] + all, environment: environment)
        #expect(again.stdout.contains("but for 1 device that opted out in the app (respected)"), "\(again.stdout)")
    }
}
