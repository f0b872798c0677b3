import Foundation
import Testing

/// `tidemark apply --backend emulator`: the demo project through tidemark's HTTP client, against
/// `tidemark emulator serve` on a live socket, with the emulator's key file as the credential.
@Suite(.serialized) struct EmulatorBackendTests {
    @Test func demoAppliesOverHTTPAndConvergesOverBothTransports() async throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        let server = try EmulatorServeTests.Server.startForDemo(cli)
        defer { _ = server.stop() }
        let environment = server.environment
        let apply = try cli.run(["apply", "--auto-approve", "--backend", "emulator"], environment: environment)
        #expect(apply.status == 0, "\(apply.stderr)")
        #expect(apply.stdout.contains("Apply complete"))
        for transport in ["v1", "iid"] {
            let plan = try cli.run(
                ["plan", "--backend", "emulator", "--transport", transport, "--detailed-exitcode"],
                environment: environment)
            #expect(plan.status == 0, "\(transport): \(plan.stdout)\(plan.stderr)")
        }
        // What the emulator holds matches: a demo topic has subscribers, read through the admin API.
        let (_, topics) = try await server.call("GET", "/emulator/v1/projects/tidemark-demo/topics")
        #expect(((topics["topics"] as? [[String: Any]]) ?? []).count >= 20)

        // Missing credentials: one clear line, exit 1.
        let missing = try cli.run(
            ["plan", "--backend", "emulator"],
            environment: ["FCM_EMULATOR_HOST": environment["FCM_EMULATOR_HOST"]!, "GOOGLE_APPLICATION_CREDENTIALS": ""])
        #expect(missing.status == 1)
        #expect(missing.stderr.contains("GOOGLE_APPLICATION_CREDENTIALS is not set"))
    }

    /// FCM_EMULATOR_HOST at a closed port, or at something that does not speak HTTP: the plan ends in
    /// seconds, not after the five-minute retry budget, naming the cause and the setting.
    @Test func anAddressWhereNothingAnswersFailsAtOnceNamingTheSetting() throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        let server = try EmulatorServeTests.Server.startForDemo(cli)
        defer { _ = server.stop() }
        // A port nothing listens on: bound, then closed.
        let closed = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(closed, $0, length) }
        }
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(closed, $0, &length) }
        }
        let port = Int(UInt16(bigEndian: address.sin_port))
        close(closed)
        var environment = server.environment
        environment["FCM_EMULATOR_HOST"] = "127.0.0.1:\(port)"
        let started = Date()
        let refused = try cli.run(["plan", "--backend", "emulator"], environment: environment)
        #expect(Date().timeIntervalSince(started) < 120, "not the retry budget's five minutes")
        #expect(refused.status == 1)
        #expect(refused.stderr.contains("the connection was refused"), "\(refused.stderr)")
        #expect(refused.stderr.contains("check FCM_EMULATOR_HOST (now http://127.0.0.1:\(port))"), "\(refused.stderr)")
    }

    /// A plan says the requests its apply sends on the configured transport (v1: one per membership
    /// change; IID: one per batch), and an apply counts the requests FCM answered.
    @Test func plansCountTheRequestsOfTheirTransport() throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        let server = try EmulatorServeTests.Server.startForDemo(cli)
        defer { _ = server.stop() }
        struct PlanJSON: Decodable {
            struct Operation: Decodable {
                var kind: String
                var tokens: [String]
            }
            var operations: [Operation]
            var requests: Int?
        }
        for transport in ["v1", "iid"] {
            let run = try cli.run(
                ["plan", "--backend", "emulator", "--transport", transport, "--format", "json"],
                environment: server.environment)
            #expect(run.status == 0, "\(transport): \(run.stderr)")
            guard let plan = try? JSONDecoder().decode(PlanJSON.self, from: Data(run.stdout.utf8)) else {
                Issue.record("\(transport): not a JSON plan: \(run.stdout.prefix(300)) \(run.stderr.prefix(300))")
                continue
            }
            let groupCalls = plan.operations.filter { $0.kind.hasPrefix("group") }.count
            let changes = plan.operations.filter { !$0.kind.hasPrefix("group") }.reduce(0) { $0 + $1.tokens.count }
            let expected = transport == "v1" ? changes + groupCalls : plan.operations.count
            #expect(plan.requests == expected, "\(transport)")
            let text = try cli.run(
                ["plan", "--backend", "emulator", "--transport", transport], environment: server.environment)
            let formatted = expected.formatted(.number.grouping(.automatic).locale(Locale(identifier: "en_US")))
            #expect(text.stdout.contains("\(formatted) requests to FCM"), "\(transport): \(text.stdout.suffix(300))")
        }
        let apply = try cli.run(
            ["apply", "--auto-approve", "--backend", "emulator", "--transport", "iid"], environment: server.environment)
        #expect(apply.status == 0, "\(apply.stderr)")
        #expect(apply.stdout.contains(" requests in "), "\(apply.stdout)")
    }
}
