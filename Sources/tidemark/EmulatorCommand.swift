import ArgumentParser
import Foundation
import TidemarkCore
import TidemarkEmulator
import TidemarkRuntime

/// `tidemark emulator …`: tidemark's FCM emulator.
struct EmulatorCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "emulator",
        abstract: "Run tidemark's FCM emulator (topics, device groups, sends, OAuth2) over HTTP.",
        subcommands: [EmulatorServeCommand.self]
    )
}

struct EmulatorServeCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "serve",
        abstract: "Serve the FCM wire protocol on a loopback port until SIGINT or SIGTERM.",
        discussion: """
            Speaks FCM's v1 topic subscription API, the Instance ID API, device groups \
            (/fcm/notification), v1 send and an OAuth2 token endpoint, plus an admin API under \
            /emulator/v1/ (see docs/emulator.md). On start it writes (or reuses) a service-account \
            key file whose token_uri points at the emulator; clients use it as their credential.
            """
    )

    @Option(help: "Address to listen on (loopback only: 127.0.0.1 or ::1).")
    var host = "127.0.0.1"

    @Option(help: "Port to listen on; 0 picks a free one.")
    var port = 9099

    @Option(
        help: ArgumentHelp(
            "Keep state (SQLite) and the key file here; without it state is in memory.",
            valueName: "DIR"))
    var data: String?

    @Option(help: ArgumentHelp("Project the key file is issued for.", valueName: "ID"))
    var project = "tidemark-demo"

    @Flag(help: "Treat any well-formed unknown token as a registered app instance (FCM answers NOT_FOUND).")
    var autoRegister = false

    @Option(
        help: ArgumentHelp(
            "Subscription changes per second per project before 429; 0 turns the limit off.",
            valueName: "N"))
    var rateLimit: Double = Double(FCMLimits.defaultQuota)

    @Option(help: ArgumentHelp("What the rate limit counts: tokens or requests.", valueName: "UNIT"))
    var rateLimitUnit: String = "tokens"

    @Flag(help: "Answer IID batches over the rate limit with per-token RESOURCE_EXHAUSTED inside a 200, not a 429.")
    var rateLimitPerToken = false

    @Flag(help: "Switch the Instance ID API off for the project, as Google does for new projects.")
    var noIid = false

    @Option(
        help: ArgumentHelp(
            "The date FCM's 2027 deadline rules see (YYYY-MM-DD), apart from the clock that checks tokens: from 2027-09-29 device groups, their export call and the Instance ID API answer as turned down. Default: no deadline rules.",
            valueName: "DATE"))
    var asOf: String?

    @Option(
        help: ArgumentHelp(
            "When the project was created (YYYY-MM-DD): from 2026-12-01 it cannot create device groups, from 2026-10-01 it cannot use the Instance ID API, as FCM treats new projects.",
            valueName: "DATE"))
    var created: String?

    @Flag(help: "Keep every subscription change for the admin API (GET /emulator/v1/projects/P/changes); for tests.")
    var recordChanges = false

    @Option(
        name: .customLong("fault-429"), help: ArgumentHelp("Share of FCM calls answered 429 (0-1).", valueName: "P"))
    var fault429: Double = 0

    @Option(
        name: .customLong("fault-500"), help: ArgumentHelp("Share of FCM calls answered 500 (0-1).", valueName: "P"))
    var fault500: Double = 0

    @Option(
        name: .customLong("fault-503"), help: ArgumentHelp("Share of FCM calls answered 503 (0-1).", valueName: "P"))
    var fault503: Double = 0

    @Option(help: ArgumentHelp("Share of tokens in topic calls answered INTERNAL (0-1).", valueName: "P"))
    var faultTokenInternal: Double = 0

    @Option(help: ArgumentHelp("Share of FCM calls whose connection is dropped (0-1).", valueName: "P"))
    var faultDrop: Double = 0

    @Option(help: ArgumentHelp("Milliseconds added to every FCM call.", valueName: "MS"))
    var latency = 0

    @Option(help: ArgumentHelp("Seed for the fault draws, so runs repeat.", valueName: "N"))
    var seed: UInt64 = 1

    func validate() throws {
        guard ["127.0.0.1", "::1", "localhost"].contains(host) else {
            throw ValidationError("--host must be a loopback address (127.0.0.1 or ::1), not '\(host)'.")
        }
        guard (0...65535).contains(port) else { throw ValidationError("--port must be between 0 and 65535.") }
        // The project is part of every path and of the key file's name: the same rule as tidemark.yaml.
        if let problem = ProjectSettings.projectIDProblem(project) {
            throw ValidationError(
                "--project '\(project.escapedOnOneLine)' is not a Google Cloud project id: it \(problem).")
        }
        guard RateLimitSettings.Unit(rawValue: rateLimitUnit) != nil else {
            throw ValidationError("--rate-limit-unit must be tokens or requests, not '\(rateLimitUnit)'.")
        }
        guard rateLimit >= 0 else { throw ValidationError("--rate-limit must not be negative.") }
        if let problem = faultSettings.problem { throw ValidationError("faults: \(problem).") }
        for (flag, value) in [("--as-of", asOf), ("--created", created)] {
            if let value, FCMDeadlines.parseDay(value) == nil {
                throw ValidationError("\(flag) must be a date such as 2027-10-01, not '\(value)'.")
            }
        }
    }

    var faultSettings: FaultSettings {
        var faults = FaultSettings()
        faults.http429 = fault429
        faults.http500 = fault500
        faults.http503 = fault503
        faults.tokenInternal = faultTokenInternal
        faults.dropConnection = faultDrop
        faults.latencyMs = latency
        faults.seed = seed
        return faults
    }

    func run() async throws {
        try await runReportingErrors {
            var options = EmulatorServer.Options()
            options.host = host == "localhost" ? "127.0.0.1" : host
            options.port = port
            // Absolute, so the key file's path printed below works from any directory.
            let data = self.data.map { URL(fileURLWithPath: $0).standardizedFileURL.path }
            options.dataDirectory = data
            options.project = project
            options.autoRegister = autoRegister
            options.rateLimit = RateLimitSettings(
                perSecond: rateLimit,
                unit: RateLimitSettings.Unit(rawValue: rateLimitUnit) ?? .tokens,
                answer: rateLimitPerToken ? .perToken : .http)
            options.faults = faultSettings
            options.iidEnabled = !noIid
            options.asOf = asOf.flatMap(FCMDeadlines.parseDay)
            options.created = created.flatMap(FCMDeadlines.parseDay)
            options.recordChanges = recordChanges
            let server = try EmulatorServer(options: options)
            let keyFile = server.keyFilePath
            let state = data.map { "state in \($0)/emulator.db" } ?? "state in memory (use --data DIR to keep it)"
            let host = options.host
            let project = options.project
            try await server.run { port in
                let address = host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)"
                Terminal.out(
                    """
                    tidemark emulator listening on http://\(address) (project \(project), \(state))
                      export FCM_EMULATOR_HOST=\(address)
                      export GOOGLE_APPLICATION_CREDENTIALS=\(keyFile)
                      admin API: http://\(address)/emulator/v1/  (docs/emulator.md)
                    Press Ctrl-C to stop.

                    """)
            }
            Terminal.out("tidemark emulator stopped.\n")
        }
    }
}
