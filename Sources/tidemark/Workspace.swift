import AsyncHTTPClient
import Foundation
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
    let statePath: String
    let backendKind: String

    static let version = "0.1.0"

    init(_ options: GlobalOptions) throws {
        self.options = options
        let cwd = FileManager.default.currentDirectoryPath
        root = options.directory.hasPrefix("/") ? options.directory : (cwd as NSString).appendingPathComponent(options.directory)
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: root, isDirectory: &isDirectory), isDirectory.boolValue else {
            throw CLIError("project directory '\(options.directory)' does not exist; pass an existing directory to -C.")
        }
        let settingsFile = (root as NSString).appendingPathComponent("tidemark.yaml")
        let settingsDisplay = Self.display(options.directory, "tidemark.yaml")
        if let data = FileManager.default.contents(atPath: settingsFile) {
            let (decoded, diagnostics) = ProjectSettings.decode(String(decoding: data, as: UTF8.self), file: settingsDisplay)
            if diagnostics.hasErrors { throw DiagnosticsError(diagnostics) }
            settings = decoded
        } else {
            settings = ProjectSettings()
        }
        if let manifests = options.manifests {
            manifestsPath = manifests.hasPrefix("/") ? manifests : (cwd as NSString).appendingPathComponent(manifests)
            manifestsDisplay = manifests
        } else {
            let relative = settings.manifests ?? "manifests"
            manifestsPath = relative.hasPrefix("/") ? relative : (root as NSString).appendingPathComponent(relative)
            manifestsDisplay = Self.display(options.directory, relative)
        }
        let state = settings.state ?? ".tidemark/state.db"
        statePath = state.hasPrefix("/") ? state : (root as NSString).appendingPathComponent(state)
        backendKind = options.backend ?? settings.backend ?? "embedded"
    }

    static func display(_ directory: String, _ path: String) -> String {
        if path.hasPrefix("/") || directory == "." { return path }
        return (directory as NSString).appendingPathComponent(path)
    }

    var stateDisplay: String { Self.display(options.directory, settings.state ?? ".tidemark/state.db") }

    /// The directory that holds state (and the embedded backend), created private to the user.
    @discardableResult
    func ensureStateDirectory() throws -> String {
        let directory = (statePath as NSString).deletingLastPathComponent
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true,
            attributes: [.posixPermissions: 0o700])
        return directory
    }

    /// Takes the state lock for a run that writes state, creating the state directory first.
    func lockState(for operation: String) throws -> StateLock {
        try ensureStateDirectory()
        return try StateLock.acquire(statePath: statePath, operation: operation)
    }

    /// `existing`, or a new state file; a new file's lineage is copied into `state`, which was
    /// planned before the file existed.
    func storeForWriting(_ existing: SQLiteStateStore?, state: inout State) throws -> SQLiteStateStore {
        if let existing { return existing }
        let store = try openStore(create: true)!
        state.lineage = try store.load().lineage
        return store
    }

    /// Opens the state file; nil when there is none yet and `create` is false.
    func openStore(create: Bool) throws -> SQLiteStateStore? {
        try SQLiteStateStore.open(path: statePath, create: create)
    }

    /// The current state, or an empty one (lineage "", serial 0) when no state file exists.
    func loadState(_ store: SQLiteStateStore?) throws -> State {
        try store?.load() ?? State(lineage: "", serial: 0)
    }

    /// Reads and resolves the manifests, interning their tokens into `state`'s table.
    func loadManifests(into state: inout State) -> LoadedManifests {
        resolve(readManifests(), into: &state)
    }

    func readManifests() -> ReadManifests {
        ManifestLoader(files: DiskFileSource(root: manifestsPath, displayRoot: manifestsDisplay)).read()
    }

    func resolve(_ read: ReadManifests, into state: inout State) -> LoadedManifests {
        let loaded = read.resolve(into: &state.tokens)
        state.growToTable()
        return loaded
    }

    /// Loads state and reads the manifests at the same time (they are independent until resolution).
    func loadStateAndManifests(_ store: SQLiteStateStore?) async throws -> (State, LoadedManifests) {
        async let loading = loadState(store)
        let read = readManifests()
        var state = try await loading
        let loaded = resolve(read, into: &state)
        return (state, loaded)
    }

    /// Runs `body` with the backend named by flag, tidemark.yaml, or the embedded default; an HTTP
    /// backend's client lives exactly as long as `body`.
    func withBackend<T>(qps: Double? = nil, qpsUnit: String? = nil, _ body: (any Backend) async throws -> T)
        async throws -> T
    {
        guard backendKind == "emulator" || backendKind == "fcm" else { return try await body(try makeBackend()) }
        let client = HTTPClient(eventLoopGroupProvider: .singleton, configuration: FCMHTTPBackend.clientConfiguration())
        do {
            let result = try await body(try makeHTTPBackend(client: client, qps: qps, qpsUnit: qpsUnit))
            try await client.shutdown()
            return result
        } catch {
            try? await client.shutdown()
            throw error
        }
    }

    /// The key file: `GOOGLE_APPLICATION_CREDENTIALS`, else `credentials` in tidemark.yaml (relative to the project).
    func credentialsPath(_ environment: [String: String]) throws -> String {
        if let path = environment["GOOGLE_APPLICATION_CREDENTIALS"], !path.isEmpty { return path }
        if let path = settings.credentials {
            return path.hasPrefix("/") ? path : (root as NSString).appendingPathComponent(path)
        }
        throw CLIError(backendKind == "emulator"
            ? "GOOGLE_APPLICATION_CREDENTIALS is not set; point it at the key file 'tidemark emulator serve' printed."
            : "GOOGLE_APPLICATION_CREDENTIALS is not set (nor 'credentials' in tidemark.yaml); point it at the service account's JSON key.")
    }

    func makeHTTPBackend(client: HTTPClient, qps: Double?, qpsUnit: String?) throws -> any Backend {
        let environment = ProcessInfo.processInfo.environment
        let keyPath = try credentialsPath(environment)
        let key = try ServiceAccountKey.load(path: keyPath)
        guard key.projectID == settings.project else {
            throw CLIError("the key in \(keyPath) is for project '\(key.projectID)', but this project is '\(settings.project)' (tidemark.yaml 'project'); use a key of '\(settings.project)'.")
        }
        let endpoints: FCMEndpoints
        if backendKind == "emulator" {
            guard let host = environment["FCM_EMULATOR_HOST"], !host.isEmpty else {
                throw CLIError("FCM_EMULATOR_HOST is not set; set it to the address 'tidemark emulator serve' printed, e.g. 127.0.0.1:9099.")
            }
            endpoints = .emulator(host: host)
        } else {
            endpoints = FCMEndpoints(fcm: environment["TIDEMARK_FCM_URL"] ?? settings.fcmURL ?? FCMEndpoints.google.fcm,
                iid: environment["TIDEMARK_IID_URL"] ?? settings.iidURL ?? FCMEndpoints.google.iid)
        }
        var options = FCMHTTPBackend.Options()
        options.transport = TopicTransport(rawValue: self.options.transport ?? settings.transport ?? "v1") ?? .v1
        options.quotaUnit = QuotaUnit(rawValue: qpsUnit ?? settings.qpsUnit ?? "tokens") ?? .tokens
        options.senderID = settings.senderID
        let rate = qps ?? settings.qps ?? Double(FCMLimits.defaultQuota)
        // A burst of a second's worth, at most one full batch: the first moments of an apply stay within quota.
        options.limiter = RateLimiter(rate: rate, burst: min(rate, Double(FCMLimits.maxBatchTokens)))
        return FCMHTTPBackend(kind: backendKind, project: settings.project, endpoints: endpoints, client: client,
            credentials: AccessTokenProvider(key: key, client: client), options: options)
    }

    /// The in-process backend.
    func makeBackend() throws -> any Backend {
        switch backendKind {
        case "embedded":
            let directory = try ensureStateDirectory()
            let store = try SQLiteEngineStore(path: (directory as NSString).appendingPathComponent("embedded.db"))
            var configuration = FCMEngine.Configuration(autoRegister: true)
            if let text = ProcessInfo.processInfo.environment["TIDEMARK_EMBEDDED_LATENCY_MS"] {
                guard let millis = Int(text), millis >= 0 else {
                    throw CLIError("TIDEMARK_EMBEDDED_LATENCY_MS must be a whole number of milliseconds, not '\(text)'.")
                }
                configuration.latency = .milliseconds(millis)
            }
            let engine = try FCMEngine(configuration: configuration, store: store)
            return EmbeddedBackend(engine: engine, project: settings.project)
        default:
            throw CLIError("the '\(backendKind)' backend is not available in this build yet; use --backend embedded.")
        }
    }

    func renderer(_ inventory: Inventory?) -> PlanRenderer {
        PlanRenderer(showTokens: options.showTokens, deviceName: deviceNamer(inventory))
    }

    /// Names a token's device for human output, when the inventory knows it.
    func deviceNamer(_ inventory: Inventory?) -> @Sendable (String) -> String? {
        { token in inventory?.index(ofToken: token).map { "device \(inventory!.deviceIDs[$0])" } }
    }
}
