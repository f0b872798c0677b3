import ArgumentParser
import Foundation
import Logging
import TidemarkCore
import TidemarkRuntime
import TidemarkServe

extension ServeSettings.DriftPolicy: ExpressibleByArgument {}
extension ServeSettings.ChangePolicy: ExpressibleByArgument {}

struct ServeCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "serve",
        abstract: "Reconcile continuously, and show health and metrics over HTTP.",
        discussion: """
            Reconciles the project's workspace (the one 'tidemark apply' uses, with the same global \
            options) at start-up and then every --interval: the same plan, apply, journal, refresh \
            modes and rails as 'tidemark apply --auto-approve'. tidemark.yaml, the manifests and the \
            inventory are read again for every reconcile. After a failure it tries again after \
            --retry-interval, twice as long each time, at most --interval. A plan a rail refuses \
            (--max-unsubscribes, protect, allow_empty, the shrink and dead-token guards) is not \
            applied: the workspace shows 'blocked' until a person applies or raises the rail.

            --drift heal re-asserts what the last apply established (opt-outs stay respected), warn \
            only reports drift, off does not read FCM for it. --on-change plan plans manifest and \
            inventory changes and reports them as waiting instead of applying them.

            On --listen: /livez (the process answers), /readyz (tidemark.yaml loads and the state \
            store answers; ?verbose lists the checks), /status (JSON: each workspace's phase, last \
            result and why, next run) and /metrics (Prometheus text format, tidemark_* families; no \
            token or device in a label). Logs go to stderr, one line per reconcile. SIGTERM or SIGINT \
            stops between journal steps and exits 0; the next start resumes an interrupted apply.
            """
    )

    @OptionGroup var global: GlobalOptions

    @Option(help: ArgumentHelp("Address and port to answer on; port 0 picks a free one.", valueName: "HOST:PORT"))
    var listen = "127.0.0.1:9464"

    @Option(help: ArgumentHelp("Time between reconciles (90s, 5m, 1h).", valueName: "DURATION"))
    var interval = "5m"

    @Option(help: ArgumentHelp("Up to this much added to each interval at random.", valueName: "DURATION"))
    var jitter = "0s"

    @Option(help: ArgumentHelp("First wait after a failure; it doubles, up to --interval.", valueName: "DURATION"))
    var retryInterval = "30s"

    @Option(help: "What a reconcile does about drift: heal, warn or off.")
    var drift: ServeSettings.DriftPolicy = .heal

    @Option(help: "What a reconcile does with manifest and inventory changes: apply, or plan (reported as waiting).")
    var onChange: ServeSettings.ChangePolicy = .apply

    @Option(
        help: ArgumentHelp(
            "The most one reconcile may unsubscribe: N memberships or P% of those tidemark knows; rotated tokens are not counted (default: 'max_unsubscribes' in tidemark.yaml, else no limit).",
            valueName: "N|P%"))
    var maxUnsubscribes: String?

    @Option(help: "Subscription changes per second sent to FCM (default: 'qps' in tidemark.yaml, else FCM's quota).")
    var qps: Double?

    @Option(help: "Reads per second sent to FCM while refreshing (default: 'read_qps' in tidemark.yaml).")
    var readQps: Double?

    func validate() throws {
        _ = try settings()
        _ = try address()
    }

    /// The schedule and rails, from the flags.
    func settings() throws -> ServeSettings {
        var settings = ServeSettings()
        func duration(_ text: String, _ flag: String) throws -> Duration {
            guard let duration = ServeSettings.duration(text) else {
                throw ValidationError("\(flag) must be a duration such as 90s, 5m or 1h, not '\(text)'.")
            }
            return duration
        }
        settings.interval = try duration(interval, "--interval")
        guard settings.interval >= .seconds(1) else { throw ValidationError("--interval must be at least 1s.") }
        settings.jitter = try duration(jitter, "--jitter")
        settings.retryInterval = try duration(retryInterval, "--retry-interval")
        guard settings.retryInterval >= .seconds(1) else {
            throw ValidationError("--retry-interval must be at least 1s.")
        }
        settings.drift = drift
        settings.onChange = onChange
        settings.maxUnsubscribes = try PlanningOptions.limit(maxUnsubscribes)
        return settings
    }

    /// `--listen` as a host and a port.
    func address() throws -> (host: String, port: Int) {
        var text = Substring(listen)
        var host = "127.0.0.1"
        if text.hasPrefix("["), let close = text.firstIndex(of: "]") {
            host = String(text[text.index(after: text.startIndex)..<close])
            text = text[text.index(after: close)...]
        } else if let colon = text.lastIndex(of: ":") {
            if colon != text.startIndex { host = String(text[..<colon]) }
            text = text[colon...]
        }
        guard text.hasPrefix(":"), let port = Int(text.dropFirst()), (0...65535).contains(port), !host.isEmpty else {
            throw ValidationError("--listen must be HOST:PORT such as 127.0.0.1:9464 or [::1]:9464, not '\(listen)'.")
        }
        return (host, port)
    }

    func run() async throws {
        try await runReportingErrors {
            let flags = RuntimeFlags(global, qps: qps, readQPS: readQps)
            var options = Serve.Options()
            (options.host, options.port) = try address()
            options.settings = try settings()
            var logger = Logger(label: "tidemark.serve", factory: { StreamLogHandler.standardError(label: $0) })
            logger.logLevel = .info
            try await Serve(options: options, load: { try Runtime.load(flags) }, logger: logger).run()
        }
    }
}
