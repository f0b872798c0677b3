import Foundation
import Hummingbird
import Logging
import ServiceLifecycle
import Synchronization
import TidemarkCore
import TidemarkRuntime
import UnixSignals

/// `tidemark serve`: reconciles the project's workspace on its schedule, and answers `/livez`,
/// `/readyz`, `/status` and `/metrics` on `listen`, until SIGTERM or SIGINT, which stop it between
/// journal steps and end it with exit 0.
///
/// Built as a swift-service-lifecycle service group: the HTTP server, one runner per workspace and
/// the readiness checker, each stopping the group when it ends.
public struct Serve: Sendable {
    /// Where `serve` listens, and what it reconciles.
    public struct Options: Sendable {
        /// The address to listen on (default 127.0.0.1).
        public var host = "127.0.0.1"
        /// The port (default 9464; 0 picks a free one, said once listening).
        public var port = 9464
        /// What the workspace may do on its own, and when.
        public var settings = ServeSettings()
        /// How often `/readyz`'s checks run again.
        public var readinessInterval: Duration = .seconds(10)
        /// The clock and random source of the schedule, the reconciles and the checks.
        public var timing: Timing = .live

        /// The defaults: 127.0.0.1:9464, every 5 minutes, drift healed, changes applied.
        public init() {}
    }

    /// Where it listens and what it does.
    public var options: Options
    /// Builds a runtime for the workspace (tidemark.yaml and the flags, read again each time).
    public var load: @Sendable () throws -> Runtime
    /// Where log lines go.
    public var logger: Logger

    /// A `serve` with `options`, building its runtimes with `load` and logging to `logger`.
    public init(options: Options, load: @escaping @Sendable () throws -> Runtime, logger: Logger) {
        self.options = options
        self.load = load
        self.logger = logger
    }

    /// This process, as the status names it: `host/pid`.
    public static var replica: String { "\(ProcessInfo.processInfo.hostName)/\(getpid())" }

    /// Checks the settings once (an error here ends `serve` at start with the file and line), then
    /// serves until a signal. `onListening` gets the bound port.
    public func run(onListening: @escaping @Sendable (Int) async -> Void = { _ in }) async throws {
        let runtime = try load()
        let logger = self.logger
        let log: @Sendable (String) -> Void = { logger.info("\($0)") }
        let metrics = ServeMetrics()
        let settings = options.settings
        metrics.declare(workspace: runtime.workspaceName, settings: settings, quota: runtime.resolved.writeRate)
        let runner = WorkspaceRunner(
            status: Self.initialStatus(runtime, settings: settings),
            reconciler: Reconciler(load: load, settings: settings, log: log, timing: options.timing),
            metrics: metrics, log: log)
        let readiness = ReadinessChecker(load: load, interval: options.readinessInterval, timing: options.timing)
        let started = options.timing.wallClock()
        let endpoints = HealthEndpoints(
            status: {
                ServeStatus(
                    version: Runtime.version, replica: Self.replica, startedAt: started, workspaces: [runner.status])
            },
            readiness: { readiness.checks },
            metrics: { metrics.exposition() })
        let (host, port) = (options.host, options.port)
        let app = Application(
            responder: HealthResponder(endpoints: endpoints),
            configuration: .init(address: .hostname(host, port: port), serverName: "tidemark-serve"),
            onServerRunning: { channel in
                let bound = channel.localAddress?.port ?? port
                logger.info(
                    "tidemark serve listening on http://\(host.contains(":") ? "[\(host)]" : host):\(bound) (/livez, /readyz, /status, /metrics); reconciling workspace '\(runtime.workspaceName)' every \(ServeSettings.describe(settings.interval)), drift: \(settings.drift.rawValue), on_change: \(settings.onChange.rawValue)"
                )
                await onListening(bound)
            },
            logger: Logger(label: "tidemark.serve.http", factory: { _ in SwiftLogNoOpLogHandler() }))
        let group = ServiceGroup(
            configuration: ServiceGroupConfiguration(
                services: [
                    .init(service: app, successTerminationBehavior: .gracefullyShutdownGroup),
                    .init(service: readiness, successTerminationBehavior: .gracefullyShutdownGroup),
                    .init(service: runner, successTerminationBehavior: .gracefullyShutdownGroup),
                ],
                gracefulShutdownSignals: [.sigterm, .sigint],
                logger: Logger(label: "tidemark.serve.lifecycle", factory: { _ in SwiftLogNoOpLogHandler() })))
        try await group.run()
        logger.info("tidemark serve stopped")
    }

    /// The status before the first reconcile.
    static func initialStatus(_ runtime: Runtime, settings: ServeSettings) -> WorkspaceStatus {
        WorkspaceStatus(
            phase: settings.suspend ? "suspended" : "pending", ready: false, workspace: runtime.workspaceName,
            state: runtime.stateDisplay, manifests: runtime.manifestsDisplay,
            backend: "\(runtime.backendKind.rawValue) (project \(runtime.resolved.project.project ?? "-"))",
            settings: [
                "interval": ServeSettings.describe(settings.interval),
                "retry_interval": ServeSettings.describe(settings.retryInterval),
                "jitter": ServeSettings.describe(settings.jitter),
                "drift": settings.drift.rawValue, "on_change": settings.onChange.rawValue,
                "max_unsubscribes": (settings.maxUnsubscribes ?? runtime.settings.maxUnsubscribes)?.description
                    ?? "none",
            ],
            suspended: settings.suspend, replica: replica)
    }
}

/// Runs `/readyz`'s checks every `interval`: tidemark.yaml loads, and the state store answers within
/// 5 seconds.
final class ReadinessChecker: Service, Sendable {
    private let load: @Sendable () throws -> Runtime
    private let interval: Duration
    private let timing: Timing
    private let results = Mutex<[ReadinessCheck]>([])

    init(load: @escaping @Sendable () throws -> Runtime, interval: Duration, timing: Timing) {
        self.load = load
        self.interval = interval
        self.timing = timing
    }

    /// The checks as last run.
    var checks: [ReadinessCheck] { results.withLock { $0 } }

    func run() async throws {
        while !Task.isShuttingDownGracefully, !Task.isCancelled {
            let checks = await check()
            results.withLock { $0 = checks }
            try? await cancelWhenGracefulShutdown { try await self.timing.sleep(self.interval) }
        }
    }

    func check() async -> [ReadinessCheck] {
        let runtime: Runtime
        do {
            runtime = try load()
        } catch {
            return [
                ReadinessCheck(name: "settings", ok: false, detail: Reconciler.plain(Failure(error).message)),
                ReadinessCheck(name: "state", ok: false, detail: "not checked: the settings do not load"),
            ]
        }
        let store = runtime.stateStore()
        let state: ReadinessCheck
        do {
            let answered = try await TimeLimit.race(.seconds(5)) { try await store.lockHolder() != nil }
            state =
                answered == nil
                ? ReadinessCheck(name: "state", ok: false, detail: "\(runtime.stateDisplay) did not answer within 5 s")
                : ReadinessCheck(name: "state", ok: true)
        } catch {
            state = ReadinessCheck(name: "state", ok: false, detail: Reconciler.plain(Failure(error).message))
        }
        return [ReadinessCheck(name: "settings", ok: true), state]
    }
}
