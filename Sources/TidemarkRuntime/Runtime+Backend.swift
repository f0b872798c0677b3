import Foundation
import TidemarkCore
import TidemarkEmulator
import TidemarkFCM
import TidemarkStore

extension Runtime {
    /// A backend that reads and changes nothing, for runs that make no call (`plan --no-refresh`,
    /// `device`): it loads no credential.
    public func detachedBackend() -> DetachedBackend {
        DetachedBackend(
            identity: BackendIdentity(kind: backendKind, project: settings.project), transport: transport,
            counted: registries.transports.api(for: transport)?.requests ?? .perToken)
    }

    /// Runs `body` with the configured backend; an HTTP backend's client lives exactly as long as `body`,
    /// unless it comes from the runtime's shared `httpClients`.
    /// Retries that last more than a few seconds are said to `output`.
    public func withBackend<T>(
        output: any WorkflowOutput = SilentOutput(), _ body: (any Backend) async throws -> T
    ) async throws -> T {
        guard backendKind.isHTTP else { return try await body(try embeddedBackend()) }
        // HTTPS_PROXY / HTTP_PROXY / NO_PROXY decide, per URL, whether a request goes through a proxy.
        let proxies = try ProxySettings.from(resolved.environment)
        // Shared clients (serve) outlive this backend: their pool closes them.
        if let shared = httpClients?.routes(for: proxies) {
            return try await body(try httpBackend(routes: shared, output: output))
        }
        let routes = HTTPRoutes(settings: proxies, configuration: FCMHTTPBackend.clientConfiguration())
        do {
            let result = try await body(try httpBackend(routes: routes, output: output))
            try await routes.shutdown()
            return result
        } catch {
            try? await routes.shutdown()
            throw error
        }
    }

    /// How this run gets access tokens: the credentials file named (a service account's key, or an
    /// external_account file from workload identity federation), else the metadata server of the
    /// Google Cloud machine it runs on (or the one `GCE_METADATA_HOST` names).
    public func credentials() throws -> GoogleCredentials {
        if let path = resolved.credentialsPath {
            let credentials = try GoogleCredentials.load(path: path)
            if let project = credentials.projectID, project != settings.project {
                throw RuntimeError(
                    "the key in \(path) is for project '\(project)', but this project is '\(settings.project)' (tidemark.yaml 'project'); use a key of '\(settings.project)'."
                )
            }
            return credentials
        }
        if let server = MetadataServer.detect(resolved.environment) { return .metadataServer(server) }
        throw RuntimeError(
            backendKind == .emulator
                ? "GOOGLE_APPLICATION_CREDENTIALS is not set; point it at the key file 'tidemark emulator serve' printed."
                : "GOOGLE_APPLICATION_CREDENTIALS is not set (nor 'credentials' in tidemark.yaml), and this is not a Google Cloud machine with a metadata server; point it at the service account's JSON key, or at an external_account file for keyless CI (docs/fcm.md)."
        )
    }

    /// The emulator or FCM over HTTP, through `routes`, paced at the resolved rates; its retries are
    /// narrated to `output`.
    func httpBackend(routes: HTTPRoutes, output: any WorkflowOutput) throws -> any Backend {
        let credentials = try credentials()
        let endpoints: FCMEndpoints
        if backendKind == .emulator {
            guard let host = resolved.emulatorHost else {
                throw RuntimeError(
                    "FCM_EMULATOR_HOST is not set; set it to the address 'tidemark emulator serve' printed, e.g. 127.0.0.1:9099."
                )
            }
            endpoints = .emulator(host: host)
        } else {
            endpoints = resolved.fcmEndpoints
        }
        var options = FCMHTTPBackend.Options()
        options.transport = transport
        options.topicAPIs = registries.transports
        options.quotaUnit = resolved.quotaUnit
        options.senderID = settings.senderID
        options.unregistered = settings.unregistered
        options.groupExport = settings.groupExport
        let rate = resolved.writeRate
        // With PostgreSQL state, every runner applying to this FCM project draws from one bucket there.
        let ledger = (stateStore() as? any QuotaSharing)?.quotaLedger(
            key: "\(backendKind.rawValue):\(endpoints.fcm):\(settings.project)")
        options.limiter = RateLimiter(
            rate: rate, burst: ResolvedSettings.writeBurst(rate), timing: timing, ledger: ledger)
        if let reads = resolved.readRate {
            // Reads are per process: FCM documents no read quota to share.
            options.readLimiter = RateLimiter(rate: reads, burst: ResolvedSettings.readBurst(reads), timing: timing)
        }
        options.timing = timing
        options.gate = leaseGate
        options.observer = fcmObserver
        let narrator = RetryNarrator(output: output, timing: timing)
        options.narrator = narrator
        return FCMHTTPBackend(
            kind: backendKind, project: settings.project, endpoints: endpoints, routes: routes,
            credentials: AccessTokenProvider(
                credentials: credentials, routes: routes, timing: timing, narrator: narrator, cache: accessTokens),
            options: options
        )
    }

    /// The in-process backend, keeping its data beside the state.
    func embeddedBackend() throws -> any Backend {
        let directory: String
        let store: SQLiteEngineStore
        do {
            directory = try ensureStateDirectory()
            store = try SQLiteEngineStore(path: (directory as NSString).appendingPathComponent("embedded.db"))
        } catch {
            let path = ((statePath as NSString).deletingLastPathComponent as NSString)
                .appendingPathComponent("embedded.db")
            throw RuntimeError(
                "the embedded backend keeps its data at \(path), beside the state, and cannot use it (\(ErrorText.describe(error))); point 'state' in tidemark.yaml at a writable directory."
            )
        }
        var configuration = FCMEngine.Configuration(autoRegister: true)
        if let latency = resolved.embeddedLatency { configuration.latency = latency }
        let engine = try FCMEngine(configuration: configuration, store: store, timing: timing)
        return EmbeddedBackend(engine: engine, project: settings.project)
    }
}
