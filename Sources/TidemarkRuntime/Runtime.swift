import Foundation
import TidemarkCore
import TidemarkFCM
import TidemarkStore

/// One run's composition root: the settings it resolved, and the parts built from them (the state
/// store, the manifests and inventory sources, the backend). Every front end, the CLI today and
/// `serve` next, makes one `Runtime` and asks it for what a workflow needs; none reads the
/// environment or tidemark.yaml itself.
public struct Runtime: Sendable {
    /// tidemark's version, recorded in state and shown by `--version`.
    public static let version = "0.1.0"

    /// The environment variables the inventory sources of the project at `root` read their database
    /// URLs from (`url_env` of each PostgreSQL source in tidemark.yaml), in the file's order; what
    /// `tidemark init --ci` passes from CI secrets.
    public static func inventoryVariables(
        root: String, directory: String, registries: Registries = .standard
    ) throws -> [String] {
        var names: [String] = []
        let file = try ProjectFile.read(root: root, directory: directory, registries: registries)
        for name in file.inventory.flatMap(\.settings.environmentNames) where !names.contains(name) {
            names.append(name)
        }
        return names
    }

    /// Every setting of the run, decided.
    public private(set) var resolved: ResolvedSettings
    /// The one clock and random source of this run.
    public let timing: Timing
    /// Where this run's requests to FCM ask whether its state lock is still held (filled by `withLock`).
    public let leaseGate = LeaseGate()
    /// Where stores and sources come from.
    public let registries: Registries
    /// Access tokens shared with the process's other runtimes (`serve` builds one per reconcile and
    /// per batch of changed devices): nil, and each backend fetches its own.
    public var accessTokens: AccessTokenCache?
    /// HTTP clients shared with the process's other runtimes, their connections kept open between
    /// backends (`serve`): nil, and each backend makes clients of its own and closes them after it.
    public var httpClients: HTTPClientPool?
    /// Told of every attempt of every request its HTTP backends send to FCM (`serve`'s metrics and
    /// its watch on a reconcile); nil: nobody.
    public var fcmObserver: FCMAttemptObserver?
    /// The store this runtime opened: a PostgreSQL store's connection, and the lease its lock took,
    /// serve every part of the run.
    private var store: any StateStore
    /// The settings files as `load` read them.
    public private(set) var settingsRead: SettingsFiles?

    /// A runtime over `resolved` settings, building its parts from `registries`. Throws a
    /// `RuntimeError` when no registered store takes the state's location, no registered source
    /// takes a declared source, or no registered topic API carries the transport.
    public init(_ resolved: ResolvedSettings, registries: Registries = .standard, timing: Timing = .live) throws {
        guard let store = registries.stores.open(resolved) else {
            throw RuntimeError(
                "the state \(resolved.stateDisplay) is a URL tidemark has no store for; 'state' takes a SQLite file path or a URL of \(registries.stores.schemes.map { "\($0)://" }.joined(separator: ", ")) (flag --state, TIDEMARK_STATE_URL, or 'state' in tidemark.yaml)."
            )
        }
        for source in resolved.project.inventory where !registries.sources.keys.contains(source.key) {
            throw RuntimeError(
                "\(source.location): inventory source '\(source.name)' is of a kind this tidemark cannot read ('\(source.key)'); it reads \(registries.sources.keys.joined(separator: ", "))."
            )
        }
        guard registries.transports.api(for: resolved.transport) != nil else {
            throw RuntimeError(
                "unknown transport '\(resolved.transport.rawValue.escapedOnOneLine)' (flag --transport); use \(TopicTransport.describe(registries.transports.transports))."
            )
        }
        self.resolved = resolved
        self.registries = registries
        self.timing = timing
        self.store = store
    }

    /// Reads the project (its `tidemark.yaml`, and the inventory file that names) and resolves
    /// `flags` against `environment`. Throws a `RuntimeError` or the file's diagnostics.
    ///
    /// With `serveWorkspace`, the run is that entry of `serve.workspaces`: its state, workspace,
    /// manifests, project, backend, credentials and refresh settings win over the project's (a flag
    /// given on the command line still wins over the entry's backend and project). With `manifests`
    /// (an absolute directory: the checkout `serve` fetched from git), the manifests are read there.
    public static func load(
        _ flags: RuntimeFlags, serveWorkspace: String? = nil, manifests: String? = nil,
        environment: [String: String] = ProcessEnvironment.variables,
        workingDirectory: String = FileManager.default.currentDirectoryPath, registries: Registries = .standard,
        timing: Timing = .live
    ) throws -> Runtime {
        // A bad TIDEMARK_AS_OF is named before anything is read (resolve checks it again, on its own).
        _ = try ResolvedSettings.asOf(environment)
        let root = ResolvedSettings.absolute(flags.directory, in: workingDirectory)
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: root, isDirectory: &isDirectory), isDirectory.boolValue else {
            throw RuntimeError(
                "project directory '\(flags.directory)' does not exist; pass an existing directory to -C.")
        }
        var read = SettingsFiles(files: [])
        var file = try ProjectFile.read(
            root: root, directory: flags.directory, registries: registries, files: &read)
        var flags = flags
        var environment = environment
        if let serveWorkspace {
            try applyServeEntry(serveWorkspace, flags: &flags, environment: &environment, file: &file)
        }
        if let manifests { flags.manifests = manifests }
        let resolved = try ResolvedSettings.resolve(
            flags: flags, environment: environment, file: file, workingDirectory: workingDirectory)
        var runtime = try Runtime(resolved, registries: registries, timing: timing)
        runtime.settingsRead = read
        return runtime
    }

    /// Whether tidemark.yaml, or the inventory file it names, changed since this runtime read them
    /// (false for a runtime built from settings rather than loaded from the project).
    public func settingsChanged() -> Bool { settingsRead?.changed() ?? false }

    /// This runtime reading its manifests in `directory` (absolute: a checkout `serve` fetched from
    /// git), with the same settings and the same state store.
    public func reading(manifests directory: String) -> Runtime {
        var copy = self
        copy.resolved.manifestsPath = directory
        copy.resolved.manifestsDisplay = directory
        return copy
    }

    /// This runtime with the state store `pool` keeps for its state and workspace (this runtime's own
    /// store, unused, when the pool has none yet): every runtime a long-running process loads for a
    /// workspace shares one store, and one connection.
    public func sharing(_ pool: StorePool) -> Runtime {
        var copy = self
        copy.store = pool.store(for: StorePool.Key(resolved), else: store)
        return copy
    }

    /// Makes the run the `serve.workspaces` entry `name` of `file`.
    static func applyServeEntry(
        _ name: String, flags: inout RuntimeFlags, environment: inout [String: String], file: inout ProjectSettings
    ) throws {
        guard let entry = file.serve?.workspace(name) else {
            throw RuntimeError(
                "tidemark.yaml no longer lists the workspace '\(name)' under 'serve.workspaces'; restart 'tidemark serve' after editing the list."
            )
        }
        flags.workspace = entry.name
        if let state = entry.state { flags.state = state }
        if let manifests = entry.manifests {
            file.manifests = manifests
            flags.manifests = nil
        }
        if let project = entry.project { file.project = project }
        if let backend = entry.backend { file.backend = backend }
        if let refresh = entry.refresh { file.refresh.mode = refresh }
        if let budget = entry.refreshBudget { file.refresh.budget = budget }
        // `serve` refuses to start while the variable is unset (`Runtime.missingServeCredentials`); the
        // control commands (`status`, `suspend`…) need no credentials.
        if let variable = entry.credentialsEnv, let path = environment[variable], !path.isEmpty {
            environment["GOOGLE_APPLICATION_CREDENTIALS"] = path
        }
    }

    /// Why this run, the `serve.workspaces` entry `name`, cannot reconcile: its `credentials_env`
    /// variable is not set. Nil when it can (or takes the project's credentials).
    public func missingServeCredentials(_ name: String) -> RuntimeError? {
        guard let entry = settings.serve?.workspace(name), let variable = entry.credentialsEnv,
            (resolved.environment[variable] ?? "").isEmpty
        else { return nil }
        return RuntimeError(
            "\(entry.location): workspace '\(name)' takes its credentials from the environment variable \(variable) ('credentials_env'), which is not set; set it to the path of the workspace's service-account key or external-account file."
        )
    }

    /// Runs `body` with a phase trace bound when `TIDEMARK_TRACE_PHASES=1` (each phase's time on stderr).
    public func traced<T>(_ body: () async throws -> T) async rethrows -> T {
        guard resolved.tracePhases else { return try await body() }
        return try await PhaseTrace().bound(body)
    }

    /// tidemark.yaml as read.
    public var settings: ProjectSettings { resolved.project }
    /// The project directory, absolute.
    public var root: String { resolved.root }
    /// Where `serve` keeps what it fetches (git checkouts): `TIDEMARK_CACHE_DIR` (relative to the
    /// project), else the project's `.tidemark/`. A container with a read-only project directory (a
    /// ConfigMap) points it at a writable volume.
    public var cacheDirectory: String {
        guard let directory = resolved.environment["TIDEMARK_CACHE_DIR"], !directory.isEmpty else {
            return URL(fileURLWithPath: root).appendingPathComponent(".tidemark").path
        }
        return ResolvedSettings.absolute(directory, in: root)
    }
    /// The manifests directory, absolute.
    public var manifestsPath: String { resolved.manifestsPath }
    /// The manifests directory as the user named it.
    public var manifestsDisplay: String { resolved.manifestsDisplay }
    /// The SQLite state file (or, with a state server, where the embedded backend keeps its data).
    public var statePath: String { resolved.statePath }
    /// The state, for messages: the file or the server (never its password), and the workspace.
    public var stateDisplay: String { resolved.stateDisplay }
    /// The state workspace.
    public var workspaceName: String { resolved.workspace }
    /// Where a plan is made, for the top of a pull-request comment: the workspace, the environment a
    /// pipeline names (`TIDEMARK_ENVIRONMENT`) and the commit (`TIDEMARK_COMMIT`, else GitLab's
    /// `CI_COMMIT_SHA` or GitHub's `GITHUB_SHA`).
    public var planContext: PlanContext {
        let environment = resolved.environment
        func value(_ name: String) -> String? { environment[name].flatMap { $0.isEmpty ? nil : $0 } }
        return PlanContext(
            workspace: resolved.workspace, environment: value("TIDEMARK_ENVIRONMENT"),
            commit: Self.ciCommit(in: environment))
    }

    /// The commit a CI job runs on: `TIDEMARK_COMMIT`, else GitLab's `CI_COMMIT_SHA` or GitHub's
    /// `GITHUB_SHA` (an empty variable counts as unset).
    public static func ciCommit(in environment: [String: String]) -> String? {
        func value(_ name: String) -> String? { environment[name].flatMap { $0.isEmpty ? nil : $0 } }
        return value("TIDEMARK_COMMIT") ?? value("CI_COMMIT_SHA") ?? value("GITHUB_SHA")
    }
    /// The backend this run talks to.
    public var backendKind: BackendKind { resolved.backend }
    /// The topic API this run uses.
    public var transport: TopicTransport { resolved.transport }
    /// The topic API the project runs on when no flag picks one.
    public var configuredTransport: TopicTransport { resolved.configuredTransport }
    /// Whether human output shows registration tokens in full (`--show-tokens`).
    public var showTokens: Bool { resolved.flags.showTokens }

    /// The directory that holds state (and the embedded backend), created private to the user.
    @discardableResult
    public func ensureStateDirectory() throws -> String {
        let directory = (statePath as NSString).deletingLastPathComponent
        try FileManager.default.createDirectory(
            atPath: directory, withIntermediateDirectories: true,
            attributes: [.posixPermissions: 0o700])
        return directory
    }

    /// The configured state store (default `.tidemark/state.db`).
    public func stateStore() -> any StateStore { store }

    /// The state store's records for `serve` (owners, control requests, statuses): a capability of
    /// the store `state` opens. Throws `StateStoreError` `.unsupported`, naming the state, for a store
    /// that keeps none.
    public func serveRecords() throws -> any ServeRecordKeeping {
        try capability(
            (any ServeRecordKeeping).self,
            "keeps no records for 'tidemark serve' (owners, suspend and reconcile requests, statuses); use SQLite or PostgreSQL state"
        )
    }

    /// The state store's apply-history trimming (`history_keep`): a capability of the store `state`
    /// opens. Throws `StateStoreError` `.unsupported`, naming the state, for a store without it.
    public func historyTrimming() throws -> any HistoryTrimming {
        try capability(
            (any HistoryTrimming).self, "cannot trim its apply history ('history_keep'); use SQLite or PostgreSQL state"
        )
    }

    /// The state store's list of the workspaces its file or database holds (`tidemark workspace`):
    /// a capability of the store `state` opens. Throws `StateStoreError` `.unsupported` for a store
    /// without it.
    public func workspaceKeeping() throws -> any WorkspaceKeeping {
        try capability(
            (any WorkspaceKeeping).self, "cannot list or delete its workspaces; use SQLite or PostgreSQL state")
    }

    /// The state store's lease, which a person can break: a capability of the store `state` opens
    /// (PostgreSQL's). Throws `StateStoreError` `.unsupported` for a store whose lock ends with its
    /// process.
    public func leaseKeeping() throws -> any LeaseKeeping {
        try capability(
            (any LeaseKeeping).self,
            "has a lock that ends with the process holding it (flock(2) for SQLite state), so there is nothing to force; end that process, or wait for it to finish"
        )
    }

    /// The state store as the capability `type`, or a `StateStoreError` `.unsupported` naming the state
    /// and saying what it `cannot` do.
    private func capability<Capability>(_ type: Capability.Type, _ cannot: String) throws -> Capability {
        guard let found = store as? Capability else {
            throw StateStoreError(.unsupported, path: store.location, cannot)
        }
        return found
    }

    /// Who this run is, for the state lock.
    public func lockHolder(_ operation: String) -> LockHolder {
        let environment = resolved.environment
        return LockHolder(
            operation: operation, user: userName,
            host: ProcessInfo.processInfo.hostName, pid: getpid(), since: timing.wallClock(),
            job: LockHolder.jobURL(environment), instance: LockHolder.currentInstance,
            namespace: LockHolder.currentNamespace)
    }

    /// Who asks `serve` for something (suspend, resume), as its record keeps it: the user and the host.
    public var requester: String {
        "\(userName) on \(ProcessInfo.processInfo.hostName)"
    }

    /// Who runs this process, as locks and requests name them: `USER`, else the account's name
    /// (a container often sets no `USER`), and only when the account has no name `uid N`.
    public var userName: String {
        if let user = resolved.environment["USER"], !user.isEmpty { return user }
        let uid = getuid()
        if let entry = getpwuid(uid), let name = entry.pointee.pw_name { return String(cString: name) }
        return "uid \(uid)"
    }

    /// Where manifests, token files and inventories may be read from: the project directory, and the
    /// manifests directory when --manifests or tidemark.yaml puts it elsewhere.
    package var confinement: InputFile.Confinement {
        let directory = resolved.flags.directory
        return InputFile.Confinement([root, manifestsPath], display: directory == "." ? "'.'" : directory)
    }

    /// The manifests directory on disk, and the inventory it names.
    public func manifestSource() -> ManifestLoader {
        ManifestLoader(
            files: DiskFileSource(root: manifestsPath, displayRoot: manifestsDisplay, confinement: confinement),
            extraSources: configuredSources(), limits: settings.limits)
    }

    /// What the registry builds this project's sources and change feeds with, as of now.
    func sourceContext() -> InventorySourceContext {
        InventorySourceContext(
            directory: root, environment: resolved.environment, now: timing.wallClock(), limits: settings.limits)
    }

    /// The sources tidemark.yaml declares (a query, a command), built by the registry: credentials
    /// from the environment only.
    public func configuredSources() -> [any InventorySource] {
        let context = sourceContext()
        return settings.inventory.map { spec in
            guard let source = registries.sources.make(spec, context) else {
                preconditionFailure("init checked that a registered source takes '\(spec.key)'")
            }
            return source
        }
    }

    /// Reads and resolves the manifests on their own (validate, show), with a scratch token table.
    public func loadManifests() async -> LoadedManifests {
        var table = TokenTable()
        return await manifestSource().load(into: &table)
    }

    /// The parts a core workflow runs on, over `backend`, reporting to `output`.
    public func parts(
        _ backend: any Backend, output: any WorkflowOutput, parallelism: Int = 8, acceptDead: Bool = false
    ) -> WorkflowParts {
        var parts = WorkflowParts(
            manifests: manifestSource(), store: stateStore(), backend: backend, timing: timing,
            output: output, tidemarkVersion: Runtime.version, parallelism: parallelism,
            deadTokenGuard: acceptDead ? nil : settings.deadTokenGuard)
        parts.deadlines = deadlines
        parts.leaseGate = leaseGate
        parts.shrinkGuard = resolved.shrinkGuard
        return parts
    }

    /// FCM's deadlines as this run sees them (`ResolvedSettings.deadlines`).
    public var deadlines: DeadlineCheck { resolved.deadlines(now: timing.wallClock()) }

    /// Writes the dead devices to `file` and reports each source's share to its `on_dead` hook.
    public func writeBackDead(_ dead: [DeadDevice], to file: String?) async throws -> DeadTokenWriteBack.Report {
        let sinks = configuredSources().compactMap { $0 as? any DeadTokenSink }
        return try await DeadTokenWriteBack(sinks: sinks, timing: timing).run(dead, file: file)
    }
}

/// The process's environment, read in one place: the runtime takes it as a value, so tests pass their own.
public enum ProcessEnvironment {
    /// The environment variables this process was started with.
    public static var variables: [String: String] { ProcessInfo.processInfo.environment }

    /// How a terminal wants output: `COLUMNS`, and whether colour is off (`NO_COLOR`, `TERM=dumb`).
    public static var terminal: (columns: Int?, colourOff: Bool) {
        let environment = variables
        let columns = environment["COLUMNS"].flatMap(Int.init)
        let noColor = !(environment["NO_COLOR"] ?? "").isEmpty
        return (columns, noColor || environment["TERM"] == "dumb")
    }
}
