import Foundation
import HTTPTypes
import Hummingbird
import Logging
import NIOCore
import TidemarkAuth
import TidemarkCore

#if canImport(Glibc)
import Glibc
#endif

/// The request context of the emulator's server: Hummingbird's basic context plus the channel,
/// so an injected fault can drop the connection.
public struct EmulatorRequestContext: RequestContext {
    /// Hummingbird's per-request storage.
    public var coreContext: CoreRequestContextStorage
    let channel: any Channel

    /// A context for a request that arrived on `source`'s channel.
    public init(source: ApplicationRequestContextSource) {
        coreContext = .init(source: source)
        channel = source.channel
    }

    /// Batches of 1000 tokens are about 200 KB; allow generous bodies.
    public var maxUploadSize: Int { 16 * 1024 * 1024 }
}

/// Hands every request to `FCMEmulator.handle` and writes its answer.
struct EmulatorResponder: HTTPResponder {
    typealias Context = EmulatorRequestContext
    let emulator: FCMEmulator

    /// A body over the limit, answered as Google answers one: 413 with a google.rpc.Status.
    static func tooLarge(_ limit: Int) -> Response {
        let text =
            #"{"error":{"code":413,"message":"The request body is larger than \#(limit) bytes.","status":"INVALID_ARGUMENT"}}"#
        var fields = HTTPFields()
        fields[.contentType] = "application/json; charset=UTF-8"
        fields[.connection] = "close"
        return Response(status: .contentTooLarge, headers: fields, body: .init(byteBuffer: ByteBuffer(string: text)))
    }

    func respond(to request: Request, context: Context) async throws -> Response {
        var request = request
        let limit = context.maxUploadSize
        if let length = request.headers[.contentLength].flatMap({ Int($0) }), length > limit {
            return Self.tooLarge(limit)
        }
        let body: ByteBuffer
        do {
            body = try await request.collectBody(upTo: limit)
        } catch {
            // Past the limit (a body with no Content-Length, or one that lies): 413 in FCM's error shape,
            // never an empty 500 and never the whole body in memory.
            return Self.tooLarge(limit)
        }
        var headers: [String: String] = [:]
        for field in request.headers { headers[field.name.canonicalName] = field.value }
        // HTTPTypes carries HTTP/1's Host header as the request's authority, not as a field.
        if let authority = request.head.authority { headers["host"] = authority }
        let target = request.uri.query.map { "\(request.uri.path)?\($0)" } ?? request.uri.path
        let wire = WireRequest(
            method: request.method.rawValue, target: target, headers: headers,
            body: Data(buffer: body))
        // A connection is counted for the first request it carries that is not the admin API's (the
        // emulator's own routing decides which is).
        if FCMRoute(method: wire.method, segments: wire.segments) != .admin {
            let channel = context.channel
            let id = ObjectIdentifier(channel)
            if emulator.traffic.noteConnection(id) {
                channel.closeFuture.whenComplete { [traffic = emulator.traffic] _ in traffic.connectionClosed(id) }
            }
        }
        let answer = await emulator.handle(wire)
        if answer.dropConnection {
            try? await context.channel.close()
            throw CancellationError()
        }
        var fields = HTTPFields()
        for (name, value) in answer.headers {
            if let name = HTTPField.Name(name) { fields.append(HTTPField(name: name, value: value)) }
        }
        return Response(
            status: .init(code: answer.status), headers: fields,
            body: .init(byteBuffer: ByteBuffer(bytes: answer.body)))
    }
}

/// `tidemark emulator serve`: the emulator over HTTP, as a service that shuts down gracefully on SIGINT/SIGTERM.
public struct EmulatorServer: Sendable {
    /// How the server is started (`tidemark emulator serve` flags).
    public struct Options: Sendable {
        /// The address to listen on; loopback by default.
        public var host = "127.0.0.1"
        /// The port to listen on; 0 picks a free one.
        public var port = 9099
        /// SQLite state and the key file live here; nil keeps state in memory.
        public var dataDirectory: String?
        /// The project whose service-account key the server writes at start.
        public var project = "tidemark-demo"
        /// Whether unknown tokens are registered on first use (`--auto-register`).
        public var autoRegister = false
        /// The rate limit at start.
        public var rateLimit = RateLimitSettings()
        /// The faults at start.
        public var faults = FaultSettings()
        /// Whether the Instance ID API is on at start.
        public var iidEnabled = true
        /// The date FCM's deadline rules see (`--as-of`); nil applies none.
        public var asOf: Date?
        /// When the project was created (`--created`), for the rules on new projects.
        public var created: Date?
        /// Keep every subscription change for the admin API's `changes` (for crash and replay tests).
        public var recordChanges = false

        /// The defaults: loopback, port 9099, state in memory.
        public init() {}
    }

    /// How it was started.
    public let options: Options
    /// The emulator the server serves.
    public let emulator: FCMEmulator
    /// The service-account key file clients should use.
    public let keyFilePath: String
    let key: ServiceAccountKey

    /// An emulator without `--data` removes its key directory when it stops; one killed (SIGKILL) could
    /// not, so each start removes the directories of emulators whose process is gone.
    static func removeKeysOfGoneEmulators() {
        let temporary = NSTemporaryDirectory()
        let prefix = "tidemark-emulator-"
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: temporary) else { return }
        for name in names where name.hasPrefix(prefix) {
            guard let pid = Int32(name.dropFirst(prefix.count)), pid > 0,
                pid != ProcessInfo.processInfo.processIdentifier, kill(pid, 0) != 0, errno == ESRCH
            else { continue }
            let path = (temporary as NSString).appendingPathComponent(name)
            // Only a directory of this user's, as the emulator made it.
            guard let attributes = try? FileManager.default.attributesOfItem(atPath: path),
                attributes[.type] as? FileAttributeType == .typeDirectory,
                (attributes[.ownerAccountID] as? NSNumber)?.uint32Value == getuid()
            else { continue }
            try? FileManager.default.removeItem(atPath: path)
        }
    }

    /// Opens (or creates) the data directory, its SQLite store and its key file.
    /// `timing` is the one clock and random source of the whole emulator (engine, quota, tokens, keys).
    public init(options: Options, timing: Timing = .live) throws {
        // The project names every path and the key file: the rule tidemark.yaml's 'project:' follows.
        if let problem = ProjectSettings.projectIDProblem(options.project) {
            throw OptionError(
                description:
                    "the emulator's project '\(options.project.escapedOnOneLine)' is not a Google Cloud project id: it \(problem)."
            )
        }
        self.options = options
        var engineConfiguration = FCMEngine.Configuration()
        engineConfiguration.autoRegister = options.autoRegister
        let keyDirectory: String
        var store: (any EngineStore)?
        if let data = options.dataDirectory {
            try FileManager.default.createDirectory(
                atPath: data, withIntermediateDirectories: true,
                attributes: [.posixPermissions: 0o700])
            store = try SQLiteEngineStore(path: (data as NSString).appendingPathComponent("emulator.db"))
            keyDirectory = data
        } else {
            Self.removeKeysOfGoneEmulators()
            keyDirectory = (NSTemporaryDirectory() as NSString)
                .appendingPathComponent("tidemark-emulator-\(ProcessInfo.processInfo.processIdentifier)")
            try FileManager.default.createDirectory(
                atPath: keyDirectory, withIntermediateDirectories: true,
                attributes: [.posixPermissions: 0o700])
        }
        keyFilePath = (keyDirectory as NSString).appendingPathComponent("service-account.json")
        key = try Self.loadOrCreateKey(at: keyFilePath, project: options.project, timing: timing)
        let authority = AccessTokenAuthority(timing: timing)
        try authority.trust(key)
        let control = EmulatorControl(timing: timing)
        control.rateLimit = options.rateLimit
        control.faults = options.faults
        control.setIIDEnabled(options.iidEnabled, project: options.project)
        control.asOf = options.asOf
        if let created = options.created { control.setCreated(created, project: options.project) }
        let traffic = TrafficLog()
        traffic.recording = options.recordChanges
        emulator = FCMEmulator(
            engine: try FCMEngine(configuration: engineConfiguration, store: store, timing: timing),
            authority: authority, control: control, traffic: traffic, defaultProject: options.project, timing: timing)
    }

    static func loadOrCreateKey(at path: String, project: String, timing: Timing = .live) throws -> ServiceAccountKey {
        if let data = FileManager.default.contents(atPath: path),
            let existing = try? JSONDecoder().decode(ServiceAccountKey.self, from: data), existing.projectID == project,
            (try? existing.signingKey()) != nil
        {
            return existing
        }
        let key = try ServiceAccountKey.generate(
            projectID: project, tokenURI: "http://127.0.0.1:9099/token", timing: timing)
        try write(key, to: path)
        return key
    }

    /// Writes the key file atomically, created 0600 (never readable by others, not even for a moment).
    static func write(_ key: ServiceAccountKey, to path: String) throws {
        try AtomicFile.write(try key.jsonData(), to: path, mode: 0o600)
    }

    /// Serves until SIGINT or SIGTERM. `onListening` gets the bound port once the socket is open
    /// (useful with port 0), after the key file's `token_uri` points at it.
    public func run(onListening: @escaping @Sendable (_ port: Int) async -> Void = { _ in }) async throws {
        var logger = Logger(label: "tidemark.emulator")
        logger.logLevel =
            ProcessInfo.processInfo.environment["LOG_LEVEL"].flatMap(Logger.Level.init(rawValue:)) ?? .warning
        let app = Application(
            responder: EmulatorResponder(emulator: emulator),
            configuration: .init(address: .hostname(options.host, port: options.port), serverName: "tidemark-emulator"),
            onServerRunning: { [emulator, key, keyFilePath, options] channel in
                let port = channel.localAddress?.port ?? options.port
                let host = options.host.contains(":") ? "[\(options.host)]" : options.host
                emulator.control.baseURL = "http://\(host):\(port)"
                var updated = key
                updated.tokenURI = "http://\(host):\(port)/token"
                if updated != key { try? Self.write(updated, to: keyFilePath) }
                await onListening(port)
            },
            logger: logger)
        try await app.runService()
        // Without --data nothing is meant to outlive the process, the key file included.
        if options.dataDirectory == nil {
            try? FileManager.default.removeItem(atPath: (keyFilePath as NSString).deletingLastPathComponent)
        }
    }
}

extension EmulatorServer {
    /// Options the emulator cannot start with.
    public struct OptionError: Error, CustomStringConvertible {
        /// What is wrong, naming the option.
        public var description: String
    }
}
