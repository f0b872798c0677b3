import AsyncHTTPClient
import Foundation
import Synchronization
import TidemarkAuth
import TidemarkCore
import TidemarkEmulator
import TidemarkFCM
import TidemarkStore

/// One invocation's view of the project: where things are, and how to open them.
struct Workspace {
    let options: GlobalOptions
    let root: String
    let settings: ProjectSettings
    let manifestsPath: String
    let manifestsDisplay: String
    /// The SQLite state file (and, beside it, the embedded backend's data); with PostgreSQL state, the
    /// embedded backend's data still lives under .tidemark/ in the project.
    let statePath: String
    /// The state as configured (relative to the project, or absolute), with the workspace applied.
    let stateSpec: String
    /// The PostgreSQL state, when `state` is a postgres:// URL.
    let postgres: PostgresURL?
    /// The state workspace: one per project and environment.
    let workspaceName: String
    let backendKind: BackendKind
    /// The one clock and random source of this run.
    let timing = Timing.live
    /// Where this run's requests to FCM ask whether its state lock is still held (filled by `withLock`).
    let leaseGate = LeaseGate()

    static let version = "0.1.0"

    init(_ options: GlobalOptions) throws {
        if let text = ProcessInfo.processInfo.environment["TIDEMARK_AS_OF"], !text.isEmpty, Self.parseDay(text) == nil {
            throw CLIError("TIDEMARK_AS_OF must be a date such as 2027-10-01, not '\(text)'.")
        }
        self.options = options
        let cwd = FileManager.default.currentDirectoryPath
        root =
            options.directory.hasPrefix("/")
            ? options.directory : (cwd as NSString).appendingPathComponent(options.directory)
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: root, isDirectory: &isDirectory), isDirectory.boolValue else {
            throw CLIError("project directory '\(options.directory)' does not exist; pass an existing directory to -C.")
        }
        let settingsFile = (root as NSString).appendingPathComponent("tidemark.yaml")
        let settingsDisplay = Self.display(options.directory, "tidemark.yaml")
        var settings: ProjectSettings
        do {
            let data = try InputFile.read(settingsFile, atMost: 16 << 20)
            guard let text = String(data: data, encoding: .utf8) else {
                throw CLIError("\(settingsDisplay) is not UTF-8 text; save it as UTF-8.")
            }
            let (decoded, diagnostics) = ProjectSettings.decode(text, file: settingsDisplay)
            if diagnostics.hasErrors { throw DiagnosticsError(diagnostics) }
            settings = decoded
        } catch let error as InputFileError where error.kind == .notFound {
            settings = ProjectSettings()
        } catch let error as InputFileError {
            throw CLIError("cannot read \(settingsDisplay): \(error).")
        }
        if let file = settings.inventoryFile {
            settings.inventory = try Self.readInventoryFile(
                file, root: root, directory: options.directory, at: settings.inventoryFileLocation)
        }
        self.settings = settings
        if let manifests = options.manifests {
            manifestsPath = manifests.hasPrefix("/") ? manifests : (cwd as NSString).appendingPathComponent(manifests)
            manifestsDisplay = manifests
        } else {
            let relative = settings.manifests ?? "manifests"
            manifestsPath = relative.hasPrefix("/") ? relative : (root as NSString).appendingPathComponent(relative)
            manifestsDisplay = Self.display(options.directory, relative)
        }
        if let file = settings.inventoryFile {
            let path = URL(
                fileURLWithPath: file.hasPrefix("/") ? file : (root as NSString).appendingPathComponent(file)
            )
            .standardizedFileURL.path
            let manifests = URL(fileURLWithPath: manifestsPath).standardizedFileURL.path
            if path.hasPrefix(manifests + "/") {
                throw CLIError(
                    "\(settings.inventoryFileLocation.map { "\($0): " } ?? "")the inventory file \(file) is inside the manifests directory, which pull requests edit; sources that run SQL or a command must live in tidemark.yaml or a file beside it that is reviewed like it (CODEOWNERS)."
                )
            }
        }
        let environment = ProcessInfo.processInfo.environment
        let state = options.state ?? environment["TIDEMARK_STATE_URL"] ?? settings.state ?? ".tidemark/state.db"
        let name = options.workspace ?? settings.workspace ?? "default"
        if let problem = ProjectSettings.workspaceProblem(name) { throw CLIError("--workspace \(problem)") }
        workspaceName = name
        if PostgresURL.isPostgres(state) {
            do {
                postgres = try PostgresURL(state)
            } catch {
                throw CLIError(ErrorText.describe(error))
            }
            statePath = (root as NSString).appendingPathComponent(".tidemark/state.db")
            stateSpec = state
        } else {
            postgres = nil
            stateSpec = state
            statePath = state.hasPrefix("/") ? state : (root as NSString).appendingPathComponent(state)
        }
        backendKind = options.backend ?? settings.backend ?? .embedded
    }

    /// The sources of a file tidemark.yaml names; like tidemark.yaml it must be protected in review, so
    /// it may not live in the manifests directory (where every pull request edits files).
    static func readInventoryFile(
        _ file: String, root: String, directory: String, at location: SourceLocation?
    ) throws -> [ConfiguredSource] {
        let path = file.hasPrefix("/") ? file : (root as NSString).appendingPathComponent(file)
        let display = display(directory, file)
        let data: Data
        do {
            data = try InputFile.read(path, atMost: 16 << 20)
        } catch {
            throw CLIError(
                "\(location.map { "\($0): " } ?? "")cannot read the inventory file \(display) that tidemark.yaml names: \(ErrorText.describe(error))."
            )
        }
        guard let text = String(data: data, encoding: .utf8) else {
            throw CLIError("\(display) is not UTF-8 text; save it as UTF-8.")
        }
        let (sources, diagnostics) = ProjectSettings.decodeInventoryFile(text, file: display)
        if diagnostics.hasErrors { throw DiagnosticsError(diagnostics) }
        return sources
    }

    static func display(_ directory: String, _ path: String) -> String {
        if path.hasPrefix("/") || directory == "." { return path }
        return (directory as NSString).appendingPathComponent(path)
    }

    var stateDisplay: String {
        if let postgres { return "\(postgres.display) (workspace \(workspaceName))" }
        let file = stateSpec.hasPrefix("/") ? stateSpec : Self.display(options.directory, stateSpec)
        return workspaceName == "default" ? file : "\(file) (workspace \(workspaceName))"
    }

    /// Where an older tidemark kept a SQLite workspace other than `default`: a file of its own beside
    /// the state file (state.prod.db). The store moves it into the state file on first use.
    var legacyWorkspacePath: String? {
        guard postgres == nil, workspaceName != "default" else { return nil }
        let stem = (statePath as NSString).deletingPathExtension
        let suffix = (statePath as NSString).pathExtension
        return stem + "." + workspaceName + (suffix.isEmpty ? "" : "." + suffix)
    }

    /// The directory that holds state (and the embedded backend), created private to the user.
    @discardableResult
    func ensureStateDirectory() throws -> String {
        let directory = (statePath as NSString).deletingLastPathComponent
        try FileManager.default.createDirectory(
            atPath: directory, withIntermediateDirectories: true,
            attributes: [.posixPermissions: 0o700])
        return directory
    }

    /// The state store tidemark.yaml names (default `.tidemark/state.db`).
    func stateStore() -> any StateStore {
        guard let postgres else {
            return SQLiteStateStore(
                path: statePath, location: stateDisplay, workspace: workspaceName, legacyPath: legacyWorkspacePath)
        }
        // One store object per workspace in a process: its connection, and the lease its lock took, serve
        // every part of the command.
        let key = "\(postgres.display)|\(workspaceName)"
        return Self.postgresStores.withLock { stores in
            if let store = stores[key] { return store }
            let store = PostgresStateStore(url: postgres, workspace: workspaceName, leaseDuration: postgres.lease)
            stores[key] = store
            return store
        }
    }

    private static let postgresStores = Mutex<[String: PostgresStateStore]>([:])

    /// Who this run is, for the state lock.
    func lockHolder(_ operation: String) -> LockHolder {
        let environment = ProcessInfo.processInfo.environment
        return LockHolder(
            operation: operation, user: environment["USER"] ?? String(getuid()),
            host: ProcessInfo.processInfo.hostName, pid: getpid(), since: timing.wallClock(),
            job: LockHolder.jobURL(environment), instance: LockHolder.currentInstance,
            namespace: LockHolder.currentNamespace)
    }

    /// Where manifests, token files and inventories may be read from: the project directory, and the
    /// manifests directory when --manifests or tidemark.yaml puts it elsewhere.
    var confinement: InputFile.Confinement {
        InputFile.Confinement([root, manifestsPath], display: options.directory == "." ? "'.'" : options.directory)
    }

    /// The manifests directory on disk, and the inventory it names.
    func manifestSource() -> ManifestLoader {
        ManifestLoader(
            files: DiskFileSource(root: manifestsPath, displayRoot: manifestsDisplay, confinement: confinement),
            extraSources: configuredSources(), limits: settings.limits)
    }

    /// Writes the dead devices to `file` (NDJSON, private to the user: it holds full tokens) and reports
    /// each source's share to its `on_dead` hook; says what was done, and fails (after trying every
    /// hook) when a hook failed, so CI sees it. Nothing is printed when nothing is dead.
    func reportDead(_ dead: [DeadDevice], to file: String?) async throws {
        let now = timing.wallClock()
        if let file {
            do {
                try writeAtomically(try DeadTokenLine.ndjson(dead, reportedAt: now), to: file, mode: 0o600)
            } catch {
                throw CLIError("cannot write --dead-tokens \(file): \(ErrorText.describe(error)).")
            }
            Terminal.out(
                "Dead tokens: \(PlanRenderer.formatCount(dead.count)) device(s) of the inventory, written to \(file).\n"
            )
        } else if !dead.isEmpty {
            Terminal.out(
                "Dead tokens: \(PlanRenderer.formatCount(dead.count)) device(s) of the inventory have a token FCM no longer knows; --dead-tokens FILE lists them.\n"
            )
        }
        let environment = ProcessInfo.processInfo.environment
        var failures: [String] = []
        for spec in settings.inventory {
            guard let hook = spec.onDead else { continue }
            let mine = dead.filter { $0.source == ConfiguredSource.display(spec.name) }
            guard !mine.isEmpty else { continue }
            let reporter: DeadTokenReporter
            switch spec.kind {
            case .postgres(let urlEnv, _, _):
                reporter = DeadTokenReporter(
                    sourceName: spec.name, hook: hook, url: environment[urlEnv], urlEnv: urlEnv, directory: root)
            case .exec(_, _, let timeout):
                reporter = DeadTokenReporter(sourceName: spec.name, hook: hook, directory: root, timeout: timeout)
            }
            do {
                let (reported, changed) = try await reporter.report(mine, at: now)
                Terminal.out(
                    "Dead tokens: reported \(PlanRenderer.formatCount(reported)) to '\(spec.name)' (on_dead)\(changed.map { "; \(PlanRenderer.formatCount($0)) row(s) changed" } ?? "").\n"
                )
            } catch {
                failures.append(ErrorText.describe(error))
            }
        }
        if !failures.isEmpty {
            throw CLIError(
                "the apply finished, but reporting dead tokens failed: \(failures.joined(separator: "; "))")
        }
    }

    /// The sources tidemark.yaml declares (a query, a command): credentials from the environment only.
    func configuredSources() -> [any InventorySource] {
        let environment = ProcessInfo.processInfo.environment
        let now = timing.wallClock()
        return settings.inventory.map { spec -> any InventorySource in
            let exclusion = spec.exclusion.map { ExclusionFilter($0, now: Int64(now.timeIntervalSince1970)) }
            switch spec.kind {
            case .postgres(let urlEnv, let query, let labels):
                var source = PostgresInventorySource(
                    name: spec.name, url: environment[urlEnv], urlEnv: urlEnv, query: query, labels: labels,
                    exclusion: exclusion, declaredAt: spec.location)
                source.allowEmpty = spec.allowEmpty
                return source
            case .exec(let command, let format, let timeout):
                var source = CommandInventorySource(
                    name: spec.name,
                    runner: ProcessRunner(
                        command: command, directory: root, timeout: timeout, maxOutput: settings.limits.inventoryBytes),
                    format: format, exclusion: exclusion, declaredAt: spec.location)
                source.allowEmpty = spec.allowEmpty
                return source
            }
        }
    }

    /// Reads and resolves the manifests on their own (validate, show), with a scratch token table.
    func loadManifests() async -> LoadedManifests {
        var table = TokenTable()
        return await manifestSource().load(into: &table)
    }

    /// The parts a core workflow runs on, over `backend`.
    func parts(_ backend: any Backend, parallelism: Int = 8, acceptDead: Bool = false) -> WorkflowParts {
        var parts = WorkflowParts(
            manifests: manifestSource(), store: stateStore(), backend: backend, timing: timing,
            output: TerminalOutput(), tidemarkVersion: Workspace.version, parallelism: parallelism,
            deadTokenGuard: acceptDead ? nil : settings.deadTokenGuard)
        parts.deadlines = deadlines
        parts.leaseGate = leaseGate
        var shrinkGuard = settings.shrinkGuard
        for source in settings.inventory {
            if let share = source.maxShrink { shrinkGuard.perSource[source.name] = share }
        }
        parts.shrinkGuard = shrinkGuard
        return parts
    }

    /// FCM's deadlines as this run sees them: against the real date for the `fcm` backend; for the
    /// embedded backend and the emulator only against `TIDEMARK_AS_OF` when given, so the demo and
    /// tests keep working after 2027 (before it, and without it, they warn).
    var deadlines: DeadlineCheck {
        let now = timing.wallClock()
        let given = asOf
        return DeadlineCheck(
            transport: transport, enforcedAt: backendKind == .fcm ? now : given, now: given ?? now)
    }

    /// `TIDEMARK_AS_OF` (YYYY-MM-DD): the date the deadline rules see with the embedded and emulator backends.
    var asOf: Date? {
        guard let text = ProcessInfo.processInfo.environment["TIDEMARK_AS_OF"], !text.isEmpty else { return nil }
        return Self.parseDay(text)
    }

    static func parseDay(_ text: String) -> Date? {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "UTC")
        formatter.dateFormat = "yyyy-MM-dd"
        return formatter.date(from: text)
    }

    /// How topic changes reach FCM: `--transport`, else `transport` in tidemark.yaml, else v1.
    var transport: TopicTransport { options.transport ?? settings.transport ?? .v1 }

    /// The transport the project runs on when `--transport` is not given: tidemark.yaml's, else v1.
    var configuredTransport: TopicTransport { settings.transport ?? .v1 }

    /// A backend that reads and changes nothing, for runs that make no call (`plan --no-refresh`,
    /// `device`): it loads no credential.
    func detachedBackend() -> DetachedBackend {
        DetachedBackend(identity: BackendIdentity(kind: backendKind, project: settings.project), transport: transport)
    }

    /// Runs `body` with the backend named by flag, tidemark.yaml, or the embedded default; an HTTP
    /// backend's client lives exactly as long as `body`.
    func withBackend<T>(
        qps: Double? = nil, qpsUnit: QuotaUnit? = nil, readQPS: Double? = nil, _ body: (any Backend) async throws -> T
    )
        async throws -> T
    {
        guard backendKind.isHTTP else { return try await body(try makeBackend()) }
        // HTTPS_PROXY / HTTP_PROXY / NO_PROXY decide, per URL, whether a request goes through a proxy.
        let proxies = try ProxySettings.from(ProcessInfo.processInfo.environment)
        let routes = HTTPRoutes(settings: proxies, configuration: FCMHTTPBackend.clientConfiguration())
        do {
            let result = try await body(
                try makeHTTPBackend(routes: routes, qps: qps, qpsUnit: qpsUnit, readQPS: readQPS))
            try await routes.shutdown()
            return result
        } catch {
            try? await routes.shutdown()
            throw error
        }
    }

    /// The credentials file: `GOOGLE_APPLICATION_CREDENTIALS`, else `credentials` in tidemark.yaml
    /// (relative to the project); nil when neither names one.
    func credentialsPath(_ environment: [String: String]) -> String? {
        if let path = environment["GOOGLE_APPLICATION_CREDENTIALS"], !path.isEmpty { return path }
        if let path = settings.credentials {
            return path.hasPrefix("/") ? path : (root as NSString).appendingPathComponent(path)
        }
        return nil
    }

    /// How this run gets access tokens: the credentials file named (a service account's key, or an
    /// external_account file from workload identity federation), else the metadata server of the
    /// Google Cloud machine it runs on (or the one `GCE_METADATA_HOST` names).
    func credentials(_ environment: [String: String]) throws -> GoogleCredentials {
        if let path = credentialsPath(environment) {
            let credentials = try GoogleCredentials.load(path: path)
            if let project = credentials.projectID, project != settings.project {
                throw CLIError(
                    "the key in \(path) is for project '\(project)', but this project is '\(settings.project)' (tidemark.yaml 'project'); use a key of '\(settings.project)'."
                )
            }
            return credentials
        }
        if let server = MetadataServer.detect(environment) { return .metadataServer(server) }
        throw CLIError(
            backendKind == .emulator
                ? "GOOGLE_APPLICATION_CREDENTIALS is not set; point it at the key file 'tidemark emulator serve' printed."
                : "GOOGLE_APPLICATION_CREDENTIALS is not set (nor 'credentials' in tidemark.yaml), and this is not a Google Cloud machine with a metadata server; point it at the service account's JSON key, or at an external_account file for keyless CI (docs/fcm.md)."
        )
    }

    func makeHTTPBackend(
        routes: HTTPRoutes, qps: Double?, qpsUnit: QuotaUnit?, readQPS: Double? = nil
    ) throws -> any Backend {
        let environment = ProcessInfo.processInfo.environment
        let credentials = try credentials(environment)
        let endpoints: FCMEndpoints
        if backendKind == .emulator {
            guard let host = environment["FCM_EMULATOR_HOST"], !host.isEmpty else {
                throw CLIError(
                    "FCM_EMULATOR_HOST is not set; set it to the address 'tidemark emulator serve' printed, e.g. 127.0.0.1:9099."
                )
            }
            endpoints = .emulator(host: host)
        } else {
            endpoints = FCMEndpoints(
                fcm: environment["TIDEMARK_FCM_URL"] ?? settings.fcmURL ?? FCMEndpoints.google.fcm,
                iid: environment["TIDEMARK_IID_URL"] ?? settings.iidURL ?? FCMEndpoints.google.iid)
        }
        var options = FCMHTTPBackend.Options()
        options.transport = transport
        options.quotaUnit = qpsUnit ?? settings.qpsUnit ?? .tokens
        options.senderID = settings.senderID
        options.unregistered = settings.unregistered
        options.groupExport = settings.groupExport
        let rate = qps ?? settings.qps ?? Double(FCMLimits.defaultQuota)
        // A burst of half a second's worth, at most one full batch. FCM's own bucket holds a second's worth:
        // the other half absorbs requests that reach FCM closer together than they left (one runner's
        // requests delayed, another's not), so pacing at the full rate is never answered 429.
        // With PostgreSQL state, every runner applying to this FCM project draws from one bucket there.
        let ledger = postgres.map {
            PostgresQuotaLedger(url: $0, key: "\(backendKind.rawValue):\(endpoints.fcm):\(settings.project)")
        }
        options.limiter = RateLimiter(
            rate: rate, burst: min(rate / 2, Double(FCMLimits.maxBatchTokens)), timing: timing, ledger: ledger)
        if let reads = readQPS ?? settings.readQPS {
            // Reads are per process: FCM documents no read quota to share.
            options.readLimiter = RateLimiter(rate: reads, burst: min(reads, 100), timing: timing)
        }
        options.timing = timing
        options.gate = leaseGate
        return FCMHTTPBackend(
            kind: backendKind, project: settings.project, endpoints: endpoints, routes: routes,
            credentials: AccessTokenProvider(credentials: credentials, routes: routes, timing: timing), options: options
        )
    }

    /// The in-process backend.
    func makeBackend() throws -> any Backend {
        switch backendKind {
        case .embedded:
            let directory: String
            let store: SQLiteEngineStore
            do {
                directory = try ensureStateDirectory()
                store = try SQLiteEngineStore(path: (directory as NSString).appendingPathComponent("embedded.db"))
            } catch {
                let path = ((statePath as NSString).deletingLastPathComponent as NSString)
                    .appendingPathComponent("embedded.db")
                throw CLIError(
                    "the embedded backend keeps its data at \(path), beside the state, and cannot use it (\(ErrorText.describe(error))); point 'state' in tidemark.yaml at a writable directory."
                )
            }
            var configuration = FCMEngine.Configuration(autoRegister: true)
            if let text = ProcessInfo.processInfo.environment["TIDEMARK_EMBEDDED_LATENCY_MS"] {
                guard let millis = Int(text), millis >= 0 else {
                    throw CLIError(
                        "TIDEMARK_EMBEDDED_LATENCY_MS must be a whole number of milliseconds, not '\(text)'.")
                }
                configuration.latency = .milliseconds(millis)
            }
            let engine = try FCMEngine(configuration: configuration, store: store, timing: timing)
            return EmbeddedBackend(engine: engine, project: settings.project)
        case .emulator, .fcm:
            throw CLIError("the '\(backendKind)' backend talks HTTP; it is made by withBackend.")
        }
    }

    func renderer(_ inventory: Inventory?) -> PlanRenderer {
        PlanRenderer(showTokens: options.showTokens, width: Terminal.width, deviceName: deviceNamer(inventory))
    }

    /// Names a token's device for human output, when the inventory knows it.
    func deviceNamer(_ inventory: Inventory?) -> @Sendable (String) -> String? {
        if let inventory { return inventory.deviceNamer }
        return { _ in nil }
    }
}
