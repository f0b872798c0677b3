import Foundation
import Testing

/// On a terminal (a pseudo-terminal here), every long phase shows a progress line within a second of
/// its start and redraws it at least once a second while it lasts, even while no batch finishes; off
/// a terminal, the same run writes no escape codes.
@Suite struct ProgressTerminalTests {
    /// What came out on the terminal, with when each chunk arrived (seconds since the start).
    struct Screen {
        var chunks: [(at: Double, text: String)] = []
        var text: String { chunks.map(\.text).joined() }

        /// The times at which a line drawn for `label` arrived.
        func draws(of label: String) -> [Double] {
            chunks.filter { $0.text.contains("\u{1B}[K") && $0.text.contains(label) }.map(\.at)
        }
    }

    /// Runs tidemark with standard error on a new pseudo-terminal (util-linux's `script` makes it and
    /// relays what is written to it), standard output discarded.
    func runOnTerminal(
        _ cli: CLIRunner, _ arguments: [String], environment: [String: String]
    ) throws -> (
        status: Int32, screen: Screen
    ) {
        let quoted = ([CLIRunner.binary.path] + arguments).map { "'\($0)'" }.joined(separator: " ")
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/script")
        process.arguments = ["-q", "-e", "-c", "\(quoted) >/dev/null", "/dev/null"]
        process.currentDirectoryURL = cli.project
        var env = ProcessInfo.processInfo.environment
        env["NO_GCE_CHECK"] = "True"
        for (key, value) in environment { env[key] = value }
        process.environment = env
        let out = Pipe()
        process.standardOutput = out
        process.standardError = FileHandle.nullDevice
        process.standardInput = FileHandle.nullDevice
        let started = Date()
        try process.run()
        var screen = Screen()
        let reading = out.fileHandleForReading.fileDescriptor
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = read(reading, &buffer, buffer.count)
            if count < 0 && errno == EINTR { continue }
            guard count > 0 else { break }
            screen.chunks.append((Date().timeIntervalSince(started), String(decoding: buffer[..<count], as: UTF8.self)))
        }
        process.waitUntilExit()
        return (process.terminationStatus, screen)
    }

    @Test func everyLongPhaseDrawsWithinASecondAndAtLeastOnceASecond() throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        // Every call to the embedded backend takes 2.5 s: the refresh and the apply each last seconds,
        // in batches longer than a second.
        let (status, screen) = try runOnTerminal(
            cli, ["apply", "--auto-approve"], environment: ["TIDEMARK_EMBEDDED_LATENCY_MS": "2500"])
        #expect(status == 0, "\(screen.text.suffix(2000))")
        for label in ["Reading registrations from FCM", "Applying"] {
            let draws = screen.draws(of: label)
            #expect(draws.count >= 3, "\(label): \(draws)")
            // Redrawn at least once a second (1.5 s allows for a loaded machine), batches or not.
            let gaps = zip(draws.dropFirst(), draws).map { $0 - $1 }
            #expect(gaps.allSatisfy { $0 < 1.5 }, "\(label): gaps \(gaps)")
        }
        // The first refresh line comes within a second of the phase. The phase's start is not seen from
        // outside (it follows the process's start-up, which on a loaded CI machine took over 2 s), so
        // this reads tidemark's own clock: the refresh counts from the phase's start, and a line drawn
        // in its first second says it is still measuring the rate (after it: "1 s so far").
        let refresh = "Reading registrations from FCM: 0/3,003 registrations (0%)"
        let drawn = screen.text.components(separatedBy: "\u{1B}[K").filter { $0.contains("Reading registrations") }
        let first = try #require(drawn.first, "\(screen.text.suffix(2000))")
        #expect(first.contains(refresh + ", measuring the rate"), "first refresh line: \(first)")
        // And from outside, with room for start-up on a loaded machine.
        let firstAt = try #require(screen.draws(of: "Reading registrations from FCM").first)
        #expect(firstAt < 6.0, "first drawn at \(firstAt) s")
        #expect(screen.text.contains("Applying: 11,085/11,085 tokens (100%)"))
        #expect(!screen.text.contains("ETA 0s\u{1B}"), "no bar that opens at the end")
    }
}
