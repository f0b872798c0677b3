import Foundation
import Testing
import TidemarkCore

/// Every error path a user can reach says one sentence of its own: never a Swift value's dump
/// (`SingleConnectionFailure(target: …)`, `Optional(…)`, `Error Domain=…`), never "Error:" beside
/// "error:", and always a non-zero exit.
@Suite struct ErrorMessageTests {
    /// A port on loopback that nothing listens on (bound, then closed).
    static func closedPort() throws -> Int {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = 0
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        try withUnsafeMutablePointer(to: &address) { pointer in
            try pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                guard bind(fd, $0, length) == 0, getsockname(fd, $0, &length) == 0 else {
                    throw POSIXError(.EADDRINUSE)
                }
            }
        }
        return Int(UInt16(bigEndian: address.sin_port))
    }

    @Test func noErrorPathDumpsASwiftValue() throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        let port = try Self.closedPort()
        try cli.write("broken-plan.json", "{\"format_version\": 1, \"operations\": [}")
        try cli.write("foreign-plan.json", "{\"format_version\": 99}")
        try cli.write("empty/.keep", "")
        let cases: [(String, [String], [String: String])] = [
            ("state server refusing", ["plan"], ["TIDEMARK_STATE_URL": "postgres://u:p@127.0.0.1:\(port)/db"]),
            ("state URL unknown scheme", ["plan"], ["TIDEMARK_STATE_URL": "mysql://127.0.0.1/db"]),
            ("state URL malformed", ["plan"], ["TIDEMARK_STATE_URL": "postgres://[::1/db"]),
            ("no manifests", ["plan", "--manifests", "nowhere"], [:]),
            ("empty manifests", ["validate", "--manifests", "empty"], [:]),
            ("broken saved plan", ["apply", "broken-plan.json"], [:]),
            ("a plan of a later format", ["show", "foreign-plan.json"], [:]),
            ("missing saved plan", ["apply", "missing.json"], [:]),
            ("bad --max-unsubscribes", ["plan", "--max-unsubscribes", "lots"], [:]),
            ("bad --target", ["plan", "--target", "kind:x"], [:]),
            ("unknown device", ["device", "no-such-device"], [:]),
            ("emulator refusing", ["plan", "--backend", "emulator"], ["FCM_EMULATOR_HOST": "127.0.0.1:\(port)"]),
            ("unknown backend", ["plan", "--backend", "cloud"], [:]),
            ("bad tidemark.yaml value", ["plan"], ["TIDEMARK_TEST_CONFIG": "1"]),
        ]
        for (name, arguments, environment) in cases {
            if environment["TIDEMARK_TEST_CONFIG"] != nil {
                try cli.write("tidemark.yaml", "max_unsubscribes: many\nacknowledge: {device_groups: soon}\n")
            }
            defer { try? FileManager.default.removeItem(at: cli.project.appendingPathComponent("tidemark.yaml")) }
            let result = try cli.run(arguments, environment: environment)
            let said = result.stderr + result.stdout
            #expect(result.status != 0, "\(name): exit \(result.status)")
            #expect(said.contains("error: "), "\(name): \(said)")
            #expect(!said.contains("Error: "), "\(name): 'Error:' beside 'error:': \(said)")
            for line in said.split(separator: "\n") {
                let text = line.drop { $0 != ":" }.dropFirst().drop { $0 == " " }
                let message = line.hasPrefix("error: ") ? String(line.dropFirst(7)) : String(text)
                #expect(!ErrorText.isDump(message), "\(name): a dump: \(line)")
            }
            for marker in ["Optional(", "Error Domain=", "(target:", "NIOCore.", "PostgresNIO.", "Swift."] {
                #expect(!said.contains(marker), "\(name): '\(marker)' in \(said)")
            }
        }
    }
}
