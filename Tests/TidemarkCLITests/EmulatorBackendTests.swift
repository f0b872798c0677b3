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
}
