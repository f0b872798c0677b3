import Foundation
import Hummingbird
import HummingbirdCore
import Logging
import NIOPosix
import ServiceLifecycle
import Synchronization
import TidemarkCore
import TidemarkFCM
import TidemarkRuntime
import UnixSignals

/// `tidemark serve`: reconciles the workspaces tidemark.yaml lists under `serve:` (or, without that
/// section, the project's own workspace), each on its schedule while this replica owns it, and
/// answers `/livez`, `/readyz`, `/status` and `/metrics` on `listen`, until SIGTERM or SIGINT, which
/// stop it between journal steps, give up its workspaces and end it with exit 0.
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
        /// Settings given on the command line: they win over every workspace's own.
        public var overrides = ServeSettings.Overrides()
        /// How long a workspace's claim lasts without renewal (a dead replica's workspaces move this
        /// long after its last renewal).
        public var claimDuration: Duration = .seconds(30)
        /// How often claims are renewed and people's requests read between reconciles.
        public var poll: Duration = .seconds(2)
        /// This replica's name in claims and statuses (default `Serve.replica`, `host/pid#instance`).
        public var replica = Serve.replica
        /// The binary's version and commit, for `tidemark_build_info`.
        public var build = (version: Runtime.version, commit: "unknown")
        /// Whether a workspace may reconcile against the embedded backend (`--allow-embedded`): a
        /// simulation inside tidemark that reaches no FCM, for demos and tests only.
        public var allowEmbedded = false
        /// How often `/readyz`'s checks run again.
        public var readinessInterval: Duration = .seconds(10)
        /// The clock and random source of the schedule, the reconciles and the checks.
        public var timing: Timing = .live

        /// The defaults: 127.0.0.1:9464, every 5 minutes, drift healed, changes applied.
        public init() {}
    }

    /// Where it listens and what it does.
    public var options: Options
    /// Builds a runtime: for the `serve.workspaces` entry named, or for the project's own workspace
    /// (nil); tidemark.yaml and the flags are read again each time (at start, at each reload and each
    /// readiness check).
    public var load: @Sendable (_ serveWorkspace: String?) throws -> Runtime
    /// Where log lines go.
    public var logger: Logger
    /// The HTTP clients every runtime `load` builds sends through; closed when `run` ends.
    let httpClients: HTTPClientPool
    /// The state stores every runtime `load` builds shares, one per state and workspace; closed when
    /// `run` ends.
    let stores: StorePool

    /// A `serve` with `options`, building its runtimes with `load` and logging to `logger`. A
    /// workspace keeps the runtime it was loaded with until its settings are reloaded; the runtimes
    /// share one state store per workspace (`StorePool`), the access tokens their backends fetch
    /// (`AccessTokenCache`: FCM's token endpoint is asked once an hour, not once a batch) and their HTTP
    /// clients (`HTTPClientPool`: a batch sends on connections already open).
    public init(
        options: Options,
        load: @escaping @Sendable (_ serveWorkspace: String?) throws -> Runtime,
        logger: Logger
    ) {
        self.options = options
        let tokens = AccessTokenCache()
        let clients = HTTPClientPool()
        let stores = StorePool()
        self.httpClients = clients
        self.stores = stores
        self.load = { workspace in
            var runtime = try load(workspace).sharing(stores)
            if runtime.accessTokens == nil { runtime.accessTokens = tokens }
            if runtime.httpClients == nil { runtime.httpClients = clients }
            return runtime
        }
        self.logger = logger
    }

    /// The event loop the endpoints answer on: a thread of their own, apart from the loops that carry
    /// the requests to FCM (whose work on a million changes would otherwise hold a probe up).
    static let endpointLoop = MultiThreadedEventLoopGroup(numberOfThreads: 1)

    /// This process, as claims, statuses and metrics name it: `host/pid#instance`. The instance (the
    /// first eight characters of a random id drawn once per process, `LockHolder.currentInstance`)
    /// tells apart replicas that share a host name and a PID: containers with host networking each
    /// running tidemark as PID 1.
    public static var replica: String {
        replicaName(host: ProcessInfo.processInfo.hostName, pid: getpid(), instance: LockHolder.currentInstance)
    }

    /// The name of the replica on `host` with `pid` whose process drew `instance`.
    public static func replicaName(host: String, pid: Int32, instance: String) -> String {
        "\(host)/\(pid)#\(instance.prefix(8))"
    }

    /// One workspace `serve` reconciles: its entry's name (nil for the project's own workspace), its
    /// runtime as loaded at start-up and its settings.
    struct Planned {
        var entry: String?
        var runtime: Runtime
        var settings: ServeSettings
        var source: GitManifests?
        /// The state store's records for `serve` (a store without them stops `serve` at start).
        var records: any ServeRecordKeeping
    }

    /// The workspaces to reconcile, each loaded once: an error here (a bad tidemark.yaml, a workspace's
    /// credentials variable unset) ends `serve` at start with the file and line.
    func planWorkspaces() throws -> (workspaces: [Planned], notify: [Notifier.Target]) {
        let project = try load(nil)
        let notify = try Notifier.targets(
            project.settings.serve?.notify ?? [], environment: project.resolved.environment)
        return (try planWorkspaces(project), notify)
    }

    private func planWorkspaces(_ project: Runtime) throws -> [Planned] {
        let planned = try plannedWorkspaces(project)
        if !options.allowEmbedded {
            for workspace in planned { try Self.refuseEmbedded(workspace.runtime) }
        }
        return planned
    }

    /// Throws when `runtime` reconciles against the embedded backend, which reaches no FCM.
    static func refuseEmbedded(_ runtime: Runtime) throws {
        guard runtime.backendKind == .embedded else { return }
        throw RuntimeError(
            "workspace '\(runtime.workspaceName)' reconciles against the embedded backend, a simulation of FCM inside tidemark: serve would report every reconcile a success and reach no FCM. For production set 'backend: fcm' in tidemark.yaml (or --backend fcm, with credentials: docs/fcm.md); 'backend: emulator' for tidemark's emulator. Pass --allow-embedded to serve the embedded backend on purpose (a demo, a test)."
        )
    }

    private func plannedWorkspaces(_ project: Runtime) throws -> [Planned] {
        guard let section = project.settings.serve, !section.workspaces.isEmpty else {
            return [
                Planned(
                    entry: nil, runtime: project,
                    settings: Self.settings(of: project, entry: nil, overrides: options.overrides),
                    source: Self.git(project.settings.serve?.source, project), records: try project.serveRecords())
            ]
        }
        return try section.workspaces.map { entry in
            let runtime = try load(entry.name)
            if let missing = runtime.missingServeCredentials(entry.name) { throw missing }
            return Planned(
                entry: entry.name, runtime: runtime,
                settings: Self.settings(of: runtime, entry: entry.name, overrides: options.overrides),
                source: Self.git(entry.source, runtime), records: try runtime.serveRecords())
        }
    }

    /// What the workspace `entry` of `serve.workspaces` (nil: the project's own) may do on its own, as
    /// the settings `runtime` loaded and the command line's flags (`overrides`) say.
    static func settings(of runtime: Runtime, entry: String?, overrides: ServeSettings.Overrides) -> ServeSettings {
        let section = runtime.settings.serve
        let own = entry.flatMap { section?.workspace($0)?.settings } ?? section?.defaults ?? ServeSettings()
        return overrides.applied(to: own)
    }

    /// The fetcher of `source` for the workspace of `runtime`, its cache in the project's `.tidemark/git/`
    /// (or `$TIDEMARK_CACHE_DIR/git/`).
    static func git(_ source: ServeSection.GitSource?, _ runtime: Runtime) -> GitManifests? {
        source.map {
            GitManifests(
                source: $0, cache: GitManifests.cache(in: runtime.cacheDirectory, workspace: runtime.workspaceName))
        }
    }

    /// Checks the settings once (an error here ends `serve` at start with the file and line), then
    /// serves until a signal. `onListening` gets the bound port.
    public func run(onListening: @escaping @Sendable (Int) async -> Void = { _ in }) async throws {
        let (planned, targets) = try planWorkspaces()
        let logger = self.logger
        let log = ServeLog { level, line in
            switch level {
            case .info: logger.info("\(line)")
            case .warning: logger.warning("\(line)")
            case .error: logger.error("\(line)")
            }
        }
        let metrics = ServeMetrics(version: options.build.version, commit: options.build.commit)
        let notifier = Notifier(targets: targets, timing: options.timing, metrics: metrics, log: log)
        let balance = WorkspaceRunner.Ownership.balance(
            replica: options.replica, duration: options.claimDuration, poll: options.poll, timing: options.timing)
        let shared = SharedDeclarations(log: log)
        let fleet = WorkspaceFleet(
            planned,
            make: {
                makeRunner($0, metrics: metrics, notifier: notifier, balance: balance, shared: shared, log: log)
            },
            log: log)
        for workspace in planned {
            sayIfSQLite(workspace, log: log)
            sayIfFollowingChanges(workspace, log: log)
        }
        shared.planned(planned)
        let load = self.load
        let readiness = ReadinessChecker(
            load: { try fleet.entries.map { try load($0) } }, interval: options.readinessInterval,
            timing: options.timing)
        let watcher = SettingsWatcher(
            file: URL(fileURLWithPath: planned[0].runtime.root).appendingPathComponent("tidemark.yaml").path,
            interval: options.poll, timing: options.timing, log: log
        ) { why in
            let (planned, targets) = try planWorkspaces()
            for workspace in planned where fleet.runner(workspace.entry) == nil {
                sayIfSQLite(workspace, log: log)
                sayIfFollowingChanges(workspace, log: log)
            }
            shared.planned(planned)
            notifier.update(targets)
            fleet.reload(planned, because: why)
        }
        let started = options.timing.wallClock()
        let replica = options.replica
        let endpoints = HealthEndpoints(
            status: {
                ServeStatus(
                    version: Runtime.version, replica: replica, startedAt: started, workspaces: fleet.statuses)
            },
            readiness: { readiness.checks },
            metrics: { metrics.exposition() })
        let (host, port) = (options.host, options.port)
        let summary = planned.map { workspace -> String in
            let settings = workspace.settings
            return
                "'\(workspace.runtime.workspaceName)' every \(ServeSettings.describe(settings.interval)) (drift: \(settings.drift.rawValue), on_change: \(settings.onChange.rawValue)\(settings.suspend ? ", suspended" : ""))"
        }.joined(separator: ", ")
        // A connection that sends no complete request within the idle timeout (a slowloris, a probe
        // left open) is closed, and at most `maxConnections` are open at once.
        let app = Application(
            responder: HealthResponder(endpoints: endpoints, loopbackOnly: LoopbackHost.isLoopback(host)),
            server: .http1(configuration: .init(idleTimeout: HealthResponder.idleTimeout)),
            configuration: .init(
                address: .hostname(host, port: port), serverName: "tidemark-serve",
                availableConnectionsDelegate: MaximumAvailableConnections(HealthResponder.maxConnections)),
            onServerRunning: { channel in
                let bound = channel.localAddress?.port ?? port
                logger.info(
                    "tidemark serve listening on http://\(host.contains(":") ? "[\(host)]" : host):\(bound) (/livez, /readyz, /status, /metrics) as replica \(replica); workspaces: \(summary)"
                )
                await onListening(bound)
            },
            eventLoopGroupProvider: .shared(Self.endpointLoop),
            logger: Logger(label: "tidemark.serve.http", factory: { _ in SwiftLogNoOpLogHandler() }))
        let services: [ServiceGroupConfiguration.ServiceConfiguration] =
            [
                .init(service: app, successTerminationBehavior: .gracefullyShutdownGroup),
                .init(service: readiness, successTerminationBehavior: .gracefullyShutdownGroup),
                .init(service: notifier, successTerminationBehavior: .gracefullyShutdownGroup),
                .init(service: fleet, successTerminationBehavior: .gracefullyShutdownGroup),
                .init(service: watcher, successTerminationBehavior: .gracefullyShutdownGroup),
            ]
        let group = ServiceGroup(
            configuration: ServiceGroupConfiguration(
                services: services, gracefulShutdownSignals: [.sigterm, .sigint],
                logger: Logger(label: "tidemark.serve.lifecycle", factory: { _ in SwiftLogNoOpLogHandler() })))
        do {
            try await group.run()
        } catch {
            await httpClients.shutdown()
            await stores.close()
            throw error
        }
        await httpClients.shutdown()
        await stores.close()
        logger.info("tidemark serve stopped")
    }

    /// A runner for `workspace`, its metrics declared.
    private func makeRunner(
        _ workspace: Planned, metrics: ServeMetrics, notifier: Notifier, balance: ReplicaBalance,
        shared: SharedDeclarations, log: ServeLog
    ) -> (WorkspaceRunner, update: @Sendable (Planned) -> Void) {
        let options = self.options
        let load = self.load
        metrics.declare(
            workspace: workspace.runtime.workspaceName, settings: workspace.settings,
            quota: workspace.runtime.resolved.writeRate, backend: workspace.runtime.backendKind.rawValue,
            project: workspace.runtime.resolved.project.project,
            sources: FollowedSource.of(workspace.runtime).map(\.name))
        let parts = { @Sendable (workspace: Planned) -> (WorkspaceStatus, Reconciler) in
            var status = Self.initialStatus(workspace.runtime, settings: workspace.settings)
            if let source = workspace.source { status.manifests = source.display }
            let entry = workspace.entry
            var reconciler = Reconciler(
                runtime: workspace.runtime, settings: workspace.settings, source: workspace.source,
                reload: {
                    let runtime = try load(entry)
                    if !options.allowEmbedded { try Self.refuseEmbedded(runtime) }
                    return (runtime, Self.settings(of: runtime, entry: entry, overrides: options.overrides))
                }, log: log, timing: options.timing)
            reconciler.followsChanges = !FollowedSource.of(workspace.runtime).isEmpty
            reconciler.fetched = { runtime, commit in shared.fetched(runtime, commit: commit) }
            return (status, reconciler)
        }
        let (status, reconciler) = parts(workspace)
        let runner = WorkspaceRunner(
            status: status, reconciler: reconciler,
            ownership: .init(
                records: workspace.records, replica: options.replica, duration: options.claimDuration,
                poll: options.poll, balance: balance),
            metrics: metrics, notifier: notifier, followed: FollowedSource.of(workspace.runtime),
            watched: WatchedInputs.of(workspace.runtime, git: workspace.source != nil), log: log)
        return (
            runner,
            { workspace in
                let (status, reconciler) = parts(workspace)
                runner.update(
                    reconciler, status: status, followed: FollowedSource.of(workspace.runtime),
                    watched: WatchedInputs.of(workspace.runtime, git: workspace.source != nil))
            }
        )
    }

    /// Says once that a workspace with SQLite state serves one replica.
    private func sayIfSQLite(_ workspace: Planned, log: ServeLog) {
        if case .file = workspace.runtime.resolved.state {
            log(
                "workspace=\(workspace.runtime.workspaceName) keeps its state in SQLite (\(workspace.runtime.stateDisplay)): one replica reconciles it, on this machine; run several replicas only with PostgreSQL state"
            )
        }
    }

    /// Says once which sources' changes wake the workspace's reconciles, and that those reconciles
    /// still read the inventory in full.
    private func sayIfFollowingChanges(_ workspace: Planned, log: ServeLog) {
        let watched = WatchedInputs.of(workspace.runtime, git: workspace.source != nil)
        if !watched.isEmpty {
            var things: [String] = []
            if let directory = watched.manifests {
                things.append(
                    "the files of its manifests directory \(directory) (size and modification time, when inotify reports a change and every \(ServeSettings.describe(ChangeFollower.recheck)), or every \(ServeSettings.describe(ChangeFollower.poll)) where it cannot follow the directory)"
                )
            }
            for command in watched.commands {
                things.append(
                    "what the command of inventory source '\(command.name)' prints (every \(ServeSettings.describe(command.interval)))"
                )
            }
            log(
                "workspace=\(workspace.runtime.workspaceName) watches \(things.joined(separator: " and ")): a change starts a reconcile at once"
            )
        }
        let following = FollowedSource.of(workspace.runtime)
        guard !following.isEmpty else { return }
        log(Self.followingLine(workspace: workspace.runtime.workspaceName, following))
    }

    /// The line that says how a workspace follows its sources' changes, naming each source, its cursor
    /// and its channel.
    static func followingLine(workspace: String, _ following: [FollowedSource]) -> String {
        let described: [String] = following.map { (source: FollowedSource) -> String in
            var ways: [String] = []
            if let cursor = source.feed.cursorName {
                ways.append("rows past its cursor \(cursor) every \(ServeSettings.describe(ChangeFollower.poll))")
            }
            if let listening = source.feed.listenName { ways.append(listening) }
            return "'\(source.name)' (\(ways.joined(separator: ", ")))"
        }
        let resync = following.map(\.feed.resync).min() ?? .seconds(PostgresSourceSettings.defaultResync)
        return
            "workspace=\(workspace) follows the changes of inventory \(following.count == 1 ? "source" : "sources") \(described.joined(separator: ", ")): each change starts a reconcile at once, which plans the changed devices on their own from what the last whole reconcile read (kept in memory), and reads everything again every resync (\(ServeSettings.describe(resync)))"
    }

    /// How the status shows the workspace's unsubscribe rail: the limit set, "none" when tidemark.yaml
    /// says so, else serve's default rail on each topic.
    static func railSetting(_ runtime: Runtime, _ settings: ServeSettings) -> String {
        let flags = PlanningFlags(maxUnsubscribes: settings.maxUnsubscribes)
        if let limit = runtime.unsubscribeLimit(flags) { return limit.description }
        guard let rail = runtime.unattendedRail(flags) else { return "none" }
        return
            "unset: each topic \(PlanRenderer.formatShare(rail.share)), at least \(rail.minimum) (serve's default rail)"
    }

    /// The status before the first reconcile.
    public static func initialStatus(_ runtime: Runtime, settings: ServeSettings) -> WorkspaceStatus {
        var status = WorkspaceStatus(
            phase: settings.suspend ? .suspended : .pending, ready: false, workspace: runtime.workspaceName,
            state: runtime.stateDisplay, manifests: runtime.manifestsDisplay,
            backend: "\(runtime.backendKind.rawValue) (project \(runtime.resolved.project.project))",
            settings: [
                "interval": ServeSettings.describe(settings.interval),
                "retry_interval": ServeSettings.describe(settings.retryInterval),
                "degraded_after": ServeSettings.describe(settings.degradedAfter),
                "jitter": ServeSettings.describe(settings.jitter),
                "drift": settings.drift.rawValue, "on_change": settings.onChange.rawValue,
                "history_keep": String(settings.historyKeep),
                "max_unsubscribes": Self.railSetting(runtime, settings),
            ],
            suspended: settings.suspend, replica: "-")
        if !settings.windows.isEmpty {
            status.settings["windows"] = settings.windows.map {
                "\($0.kind.rawValue) '\($0.schedule)' for \(ServeSettings.describe($0.duration)) (\($0.timeZone.identifier))"
            }.joined(separator: "; ")
            status.settings["heal_outside_windows"] = String(settings.healOutsideWindows)
        }
        let followed = FollowedSource.of(runtime)
        if !followed.isEmpty {
            status.settings["follows_changes"] = followed.map(\.name).joined(separator: ", ")
            status.inventoryChangesWaiting = 0
        }
        return status
    }
}

/// Runs `/readyz`'s checks every `interval`: tidemark.yaml loads, and each workspace's state store
/// answers within 5 seconds.
final class ReadinessChecker: Service, Sendable {
    private let load: @Sendable () throws -> [Runtime]
    private let interval: Duration
    private let timing: Timing
    private let results = Mutex<[ReadinessCheck]>([])

    init(load: @escaping @Sendable () throws -> [Runtime], interval: Duration, timing: Timing) {
        self.load = load
        self.interval = interval
        self.timing = timing
    }

    /// The checks as last run.
    var checks: [ReadinessCheck] { results.withLock { $0 } }

    func run() async throws {
        // Cancelled by a shutdown: the loop's sleeps need not look at it.
        await cancelWhenGracefulShutdown {
            while !Task.isCancelled {
                let checks = await self.check()
                self.results.withLock { $0 = checks }
                await ServeWait.pause(self.interval, timing: self.timing)
            }
        }
    }

    func check() async -> [ReadinessCheck] {
        let runtimes: [Runtime]
        do {
            runtimes = try load()
        } catch {
            return [
                ReadinessCheck(name: "settings", ok: false, detail: Failure(error).plainMessage),
                ReadinessCheck(name: "state", ok: false, detail: "not checked: the settings do not load"),
            ]
        }
        var checks = [ReadinessCheck(name: "settings", ok: true)]
        for runtime in runtimes {
            let name = runtimes.count == 1 ? "state" : "state:\(runtime.workspaceName)"
            let store = runtime.stateStore()
            do {
                let answered = try await TimeLimit.race(.seconds(5)) { try await store.lockHolder() != nil }
                checks.append(
                    answered == nil
                        ? ReadinessCheck(
                            name: name, ok: false, detail: "\(runtime.stateDisplay) did not answer within 5 s")
                        : ReadinessCheck(name: name, ok: true))
            } catch {
                checks.append(ReadinessCheck(name: name, ok: false, detail: Failure(error).plainMessage))
            }
        }
        return checks
    }
}
