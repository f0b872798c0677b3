import ArgumentParser
import Foundation
import Logging
import TidemarkBuildInfo
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
            Reconciles the workspaces tidemark.yaml lists under 'serve.workspaces' (each with its \
            own state, manifests, FCM project, credentials and schedule), or without that section \
            the project's workspace (the one 'tidemark apply' uses, with the same global options), \
            at start-up and then every --interval: the same plan, apply, journal, refresh modes and \
            rails as 'tidemark apply --auto-approve'. tidemark.yaml, the manifests and the inventory \
            are read again for every reconcile; serve's own settings (the workspaces, schedules, \
            windows, sources, webhooks) reload on SIGHUP and when tidemark.yaml changes, without a \
            restart. A flag given here wins over every workspace's own setting. A PostgreSQL \
            inventory source with 'changes' or 'listen' under its 'postgres:' is followed between \
            reconciles: a change starts one at once that plans the changed devices on their own, \
            and everything is read again at least every 'resync'. The manifests directory's files \
            and 'exec' sources with an 'interval' are watched too (docs/serve.md).

            Several replicas may run: each workspace is reconciled by the one replica that owns it \
            (a claim in its state store, renewed every 2 s and lost 30 s after a replica stops \
            renewing it); the others stand by and take it over. Owning is not the state lock, so a \
            person's 'tidemark apply' waits at most for one reconcile. SQLite state serves one \
            replica; run several only with PostgreSQL state. 'tidemark status', 'reconcile', \
            'suspend' and 'resume' act through the state store on whichever replica owns a workspace. After a failure it tries again after \
            --retry-interval, twice as long each time, at most --interval. A rail that refuses one \
            topic or group (its own max_unsubscribes, protect, allow_empty, or serve's default rail: \
            more than 10% and 10 devices of a topic that sets no rail, unless tidemark.yaml says \
            'max_unsubscribes: none') holds that one: its changes wait and the rest is applied; \
            'tidemark status' lists what is held, and it is released when its plan passes. A rail \
            about the whole workspace (--max-unsubscribes, the shrink and dead-token guards) applies \
            nothing: the workspace shows 'blocked' until a person applies or raises the rail.

            --drift heal re-asserts what the last apply established (opt-outs stay respected), warn \
            only reports drift, off does not read FCM for it. --on-change plan plans manifest and \
            inventory changes and reports them as waiting instead of applying them.

            On --listen: /livez (the process answers), /readyz (tidemark.yaml loads and the state \
            store answers; ?verbose lists the checks), /status (JSON: each workspace's phase, last \
            result and why, next run) and /metrics (Prometheus text format, tidemark_* families; no \
            token or device in a label). Logs go to stderr, one line per reconcile (--log-format \
            json: one JSON object per line). 'serve.notify' in tidemark.yaml lists webhooks that hear \
            of blocked plans, failures, drift, waiting changes and deadlines, signed with \
            HMAC-SHA256 (X-Tidemark-Signature), each ongoing problem once and again after 'renotify'. SIGTERM or SIGINT \
            stops between journal steps and exits 0; the next start resumes an interrupted apply.
            """
    )

    @OptionGroup var global: GlobalOptions

    @Option(help: ArgumentHelp("Address and port to answer on; port 0 picks a free one.", valueName: "HOST:PORT"))
    var listen = "127.0.0.1:9464"

    @Option(help: ArgumentHelp("Time between reconciles (90s, 5m, 1h; default 5m).", valueName: "DURATION"))
    var interval: String?

    @Option(help: ArgumentHelp("Up to this much added to each interval at random (default 0s).", valueName: "DURATION"))
    var jitter: String?

    @Option(
        help: ArgumentHelp(
            "First wait after a failure; it doubles, up to --interval (default 30s).", valueName: "DURATION"))
    var retryInterval: String?

    @Option(help: "What a reconcile does about drift: heal (default), warn or off.")
    var drift: ServeSettings.DriftPolicy?

    @Option(
        help:
            "What a reconcile does with manifest and inventory changes: apply (default), or plan (reported as waiting)."
    )
    var onChange: ServeSettings.ChangePolicy?

    @Option(
        help: ArgumentHelp(
            "The most one reconcile may unsubscribe: N memberships or P% of those tidemark knows; rotated tokens are not counted (default: 'max_unsubscribes' in tidemark.yaml, else no limit).",
            valueName: "N|P%"))
    var maxUnsubscribes: String?

    @Option(help: "Subscription changes per second sent to FCM (default: 'qps' in tidemark.yaml, else FCM's quota).")
    var qps: Double?

    @Option(help: "Reads per second sent to FCM while refreshing (default: 'read_qps' in tidemark.yaml).")
    var readQps: Double?

    @Option(
        help: ArgumentHelp(
            "How long a replica's claim on a workspace lasts unless renewed (every third of it): another replica takes a workspace over this long after its owner dies (default 30s, at least 3s).",
            valueName: "DURATION"))
    var claimDuration: String?

    @Flag(
        help:
            "Serve workspaces whose backend is 'embedded' (a simulation of FCM inside tidemark that reaches no FCM): for demos and tests. Without it serve refuses them at start."
    )
    var allowEmbedded = false

    @Option(
        help:
            "How log lines are written to stderr: text (default), or json (one object per line, with workspace, result and reason as fields, for log collectors)."
    )
    var logFormat: LogFormat = .text

    enum LogFormat: String, ExpressibleByArgument, CaseIterable {
        case text, json
    }

    func validate() throws {
        _ = try overrides()
        _ = try address()
        _ = try claim()
    }

    /// `--claim-duration`, when given.
    func claim() throws -> Duration? {
        guard let text = claimDuration else { return nil }
        guard let duration = ServeSettings.duration(text), duration >= .seconds(3) else {
            throw ValidationError("--claim-duration must be a duration of at least 3s, such as 30s, not '\(text)'.")
        }
        return duration
    }

    /// The schedule and rails the flags give (each wins over every workspace's own).
    func overrides() throws -> ServeSettings.Overrides {
        var overrides = ServeSettings.Overrides()
        func duration(_ text: String?, _ flag: String, atLeastOneSecond: Bool = true) throws -> Duration? {
            guard let text else { return nil }
            guard let duration = ServeSettings.duration(text) else {
                throw ValidationError("\(flag) must be a duration such as 90s, 5m or 1h, not '\(text)'.")
            }
            if atLeastOneSecond, duration < .seconds(1) { throw ValidationError("\(flag) must be at least 1s.") }
            return duration
        }
        overrides.interval = try duration(interval, "--interval")
        overrides.jitter = try duration(jitter, "--jitter", atLeastOneSecond: false)
        overrides.retryInterval = try duration(retryInterval, "--retry-interval")
        overrides.drift = drift
        overrides.onChange = onChange
        overrides.maxUnsubscribes = try PlanningOptions.limit(maxUnsubscribes)
        return overrides
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
            options.overrides = try overrides()
            options.build = (Runtime.version, BuildInfo.commit)
            options.allowEmbedded = allowEmbedded
            if let claim = try claim() { options.claimDuration = claim }
            let json = logFormat == .json
            var logger = Logger(
                label: "tidemark.serve",
                factory: {
                    json ? JSONLogHandler(label: $0) as any LogHandler : StreamLogHandler.standardError(label: $0)
                })
            logger.logLevel = .info
            try await Serve(
                options: options, load: { try Runtime.load(flags, serveWorkspace: $0) }, logger: logger
            ).run()
        }
    }
}
