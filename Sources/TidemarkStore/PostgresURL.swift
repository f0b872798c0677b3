import Foundation
import Logging
import NIOCore
import NIOPosix
import NIOSSL
import PostgresNIO
import TidemarkCore

/// A `postgres://` or `postgresql://` state URL, parsed as libpq reads one: user, password (or
/// `PGPASSWORD`), host, port, database, and the `sslmode` / `sslrootcert` parameters managed
/// services need.
public struct PostgresURL: Sendable, Equatable {
    /// libpq's `sslmode`.
    public enum SSLMode: String, Sendable, CaseIterable {
        case disable, allow, prefer, require
        case verifyCA = "verify-ca"
        case verifyFull = "verify-full"
    }

    /// The user to connect as.
    public var user: String
    /// The password, from the URL or `PGPASSWORD`; never shown.
    public var password: String?
    /// The server's host name or address.
    public var host: String
    /// The server's port (5432 by default).
    public var port: Int
    /// The database.
    public var database: String
    /// Whether and how TLS is used (`sslmode`).
    public var sslMode: SSLMode
    /// The CA file the server's certificate is checked against (`sslrootcert`).
    public var sslRootCert: String?
    /// How long the server may take to answer (a state transaction's statement, or its next thousand
    /// rows) before the connection is dropped and the command fails naming the server
    /// (`timeout=SECONDS`, default 30); `connect_timeout` bounds opening a connection (default 10).
    public var timeout: Duration = .seconds(30)
    /// How long opening a connection may take.
    public var connectTimeout: Duration = .seconds(10)
    /// How long a run's lease on a workspace lives without a heartbeat (`lease=SECONDS`, default 60):
    /// how soon another runner may take over from one that died or was cut off.
    public var lease: Duration = .seconds(60)
    /// How long the work under a lease may go without moving (no request to FCM sent or answered, no
    /// state transaction committed; a confirmation prompt does not count) before its heartbeat stops
    /// renewing the lease, so a stuck run does not hold the workspace for ever (`stall=SECONDS`,
    /// default 600: longer than any wait tidemark bounds, such as FCM's retry budget).
    public var stall: Duration = .seconds(600)

    /// Whether `text` names a PostgreSQL store (and not a SQLite path).
    public static func isPostgres(_ text: String) -> Bool {
        text.hasPrefix("postgres://") || text.hasPrefix("postgresql://")
    }

    /// Parses `text`; the error says what is wrong without echoing the password.
    public init(_ text: String, environment: [String: String] = ProcessInfo.processInfo.environment) throws {
        guard Self.isPostgres(text), let components = URLComponents(string: text) else {
            throw StateStoreError(
                .io, path: Self.redact(text),
                "it is not a PostgreSQL URL such as postgres://user@host:5432/database?sslmode=require")
        }
        guard let host = components.host, !host.isEmpty else {
            throw StateStoreError(.io, path: Self.redact(text), "the URL names no host")
        }
        self.host = host
        port = components.port ?? 5432
        user = components.user.flatMap { $0.removingPercentEncoding } ?? environment["PGUSER"] ?? "postgres"
        password = components.password.flatMap { $0.removingPercentEncoding } ?? environment["PGPASSWORD"]
        let path = components.path.drop { $0 == "/" }
        database =
            path.isEmpty ? (environment["PGDATABASE"] ?? user) : String(path).removingPercentEncoding ?? String(path)
        var mode = SSLMode.prefer
        var rootCert: String?
        for item in components.queryItems ?? [] {
            switch item.name {
            case "sslmode":
                guard let value = item.value, let parsed = SSLMode(rawValue: value) else {
                    throw StateStoreError(
                        .io, path: Self.redact(text),
                        "sslmode must be one of \(SSLMode.allCases.map(\.rawValue).joined(separator: ", ")), not '\(item.value ?? "")'"
                    )
                }
                mode = parsed
            case "sslrootcert": rootCert = item.value
            case "timeout", "connect_timeout", "lease", "stall":
                let lowest = item.name == "lease" ? 3 : 1
                let highest = item.name == "stall" ? 86_400 : 3600
                guard let value = item.value, let seconds = Int(value), (lowest...highest).contains(seconds) else {
                    throw StateStoreError(
                        .io, path: Self.redact(text),
                        "\(item.name) must be a whole number of seconds from \(lowest) to \(highest), not '\(item.value ?? "")'"
                    )
                }
                switch item.name {
                case "timeout": timeout = .seconds(seconds)
                case "lease": lease = .seconds(seconds)
                case "stall": stall = .seconds(seconds)
                default: connectTimeout = .seconds(seconds)
                }
            case "application_name": break
            default:
                throw StateStoreError(
                    .io, path: Self.redact(text),
                    "tidemark does not know the URL parameter '\(item.name)'; it reads sslmode, sslrootcert, timeout, connect_timeout, lease and stall"
                )
            }
        }
        sslMode = mode
        sslRootCert = rootCert
    }

    /// The URL as messages show it: never the password.
    public var display: String { "postgres://\(user)@\(host.contains(":") ? "[\(host)]" : host):\(port)/\(database)" }

    /// `text` with any password replaced, for messages about a URL that did not parse
    /// (`URLRedaction.display`).
    public static func redact(_ text: String) -> String { URLRedaction.display(text) }

    /// A PostgreSQL error as one line: the server's message, or why the server cannot be reached. The
    /// state store, inventory sources and `on_dead` hooks all say it this way.
    public static func explain(_ error: any Error) -> String {
        if let late = error as? NoAnswer { return late.words }
        if let ended = error as? ConnectionEnded { return ended.words }
        // Connecting on tidemark's own channel (PostgresConnector) fails with SwiftNIO's errors, unwrapped.
        if Self.isSocketError(error) { return socketWords(error) }
        guard let error = error as? PSQLError else { return ErrorText.describe(error) }
        if let message = error.serverInfo?[.message] {
            let state = error.serverInfo?[.sqlState].map { " (SQLSTATE \($0))" } ?? ""
            return "PostgreSQL said: \(message)\(state)"
        }
        if let underlying = error.underlying {
            if underlying is PSQLError { return explain(underlying) }
            return socketWords(underlying)
        }
        switch error.code {
        case .serverClosedConnection, .uncleanShutdown:
            return
                "the server closed the connection (it stopped or restarted, or ended this session); check that it is up"
        case .clientClosedConnection:
            return "the connection was closed before the server answered"
        case .connectionError:
            return "cannot reach the server; check the host, port and sslmode"
        default:
            return "the connection failed (\(error.code)); check the host, port, user and sslmode"
        }
    }

    /// Whether `error` is one of SwiftNIO's own (a connection or socket failure).
    static func isSocketError(_ error: any Error) -> Bool {
        error is NIOConnectionError || error is IOError || error is ChannelError
    }

    /// A socket failure in words: the driver and SwiftNIO describe theirs as Swift dumps.
    static func socketWords(_ underlying: any Error) -> String {
        let text = String(describing: underlying)
        if text.localizedCaseInsensitiveContains("connection refused") {
            return
                "cannot reach the server: the connection was refused (is it running, and are the host and port right?)"
        }
        if text.localizedCaseInsensitiveContains("timeout") || text.localizedCaseInsensitiveContains("timed out") {
            return "cannot reach the server: connecting timed out; check the host, port and any firewall"
        }
        // A socket call's own text (read(descriptor:pointer:size:) failed: Connection reset by peer)
        // says what happened, in words.
        if text.localizedCaseInsensitiveContains("connection reset") || text.contains("errno: 104") {
            return
                "the connection was reset (the server, a pooler or something between them ended it); the next query opens a new one"
        }
        if text.localizedCaseInsensitiveContains("broken pipe") || text.contains("errno: 32") {
            return "the connection was closed while tidemark was writing to it; the next query opens a new one"
        }
        if text.localizedCaseInsensitiveContains("resolve") || text.contains("NXDOMAIN") || text.contains("getaddrinfo")
        {
            return "cannot reach the server: its host name could not be resolved; check the host"
        }
        if text.contains("(descriptor:") || text.contains("errno:") {
            return "the connection failed at the socket; check the host, port and the network between"
        }
        if text.contains("SingleConnectionFailure") || text.contains("Connection errors") {
            return "cannot reach the server: the connection failed; check the host, port and sslmode"
        }
        return "cannot reach the server: \(ErrorText.describe(underlying)); check the host, port and sslmode"
    }

    /// What kind of inventory failure `error` is: a timeout, a server that cannot be reached or ended
    /// the session, or anything else (a query the server refused).
    static func kind(of error: any Error) -> InventorySourceError.Kind {
        if error is NoAnswer { return .timedOut }
        if error is ConnectionEnded || isSocketError(error) { return .unreachable }
        guard let error = error as? PSQLError else { return .failed }
        if let state = error.serverInfo?[.sqlState] {
            // Class 08: connection exception; 57: operator intervention (terminated, shutting down).
            return state.hasPrefix("08") || state.hasPrefix("57") ? .unreachable : .failed
        }
        switch error.code {
        case .serverClosedConnection, .uncleanShutdown, .connectionError, .clientClosedConnection: return .unreachable
        default: return error.underlying == nil ? .failed : .unreachable
        }
    }

    /// Opens a connection for a source or hook whose URL comes from the environment variable `urlEnv`;
    /// every failure is one line starting with `what` (such as "on_dead of 'app-db'"), never the password.
    static func connect(
        _ url: String?, urlEnv: String, what: String?, id: Int, logger: Logger
    ) async throws -> (PostgresConnection, PostgresURL) {
        let prefix = what.map { "\($0): " } ?? ""
        guard let url, !url.isEmpty else {
            throw InventorySourceError(
                "\(prefix)the environment variable \(urlEnv) is not set; set it to the database URL (postgres://user@host:5432/db?sslmode=require) in the job's secrets"
            )
        }
        let parsed: PostgresURL
        do {
            parsed = try PostgresURL(url)
        } catch let error as StateStoreError {
            throw InventorySourceError("\(prefix)the URL in \(urlEnv) is not usable: \(error.detail)")
        }
        do {
            let configuration = try parsed.configuration()
            let opened = try await TimeLimit.race(parsed.connectTimeout) {
                try await PostgresConnector.connect(parsed, configuration: configuration, id: id, logger: logger)
            } late: { connection in
                try? await connection.close()
            }
            guard let opened else { throw NoAnswer(seconds: parsed.connectTimeout.components.seconds) }
            return (opened, parsed)
        } catch {
            throw InventorySourceError(
                "\(prefix)cannot connect to \(parsed.display): \(explain(error))",
                kind: error is NoAnswer ? .timedOut : .unreachable)
        }
    }

    /// A server that did not answer within a timeout. `pausedFor`: the timer itself fired that much
    /// late, so tidemark (not the server) was stopped or starved for that long (SIGSTOP, a frozen VM,
    /// a CPU limit) and the server may well be healthy.
    struct NoAnswer: Error {
        var seconds: Int64
        var pausedFor: Int64? = nil

        init(seconds: Int64, pausedFor: Int64? = nil) {
            self.seconds = seconds
            self.pausedFor = pausedFor
        }

        /// No answer within `limit`, noticed `elapsed` after the query was sent: a timer that fired
        /// more than 5 s (and a fifth of the limit) late means this process was not running.
        init(limit: Duration, elapsed: Duration) {
            let late = elapsed - limit
            self.init(
                seconds: limit.components.seconds,
                pausedFor: late > .seconds(5) && late > limit / 5 ? late.components.seconds : nil)
        }

        /// What happened, from tidemark's side.
        var words: String {
            if let pausedFor {
                return
                    "no answer within \(seconds) s, but tidemark itself was stopped or starved for about \(pausedFor) s of that (the timer fired late: a SIGSTOP, a frozen VM or a CPU limit), so the server may be fine; the connection was dropped and the next query opens a new one"
            }
            return
                "the server did not answer within \(seconds) s on a connection that stayed open, so the connection was dropped (the server is overloaded or hung, or the network drops packets in silence); the URL's timeout parameter sets this limit"
        }
    }

    /// The connection ended under a query: the server closed it (a failover, a pooler restart,
    /// `idle_session_timeout`, `pg_terminate_backend`) and the driver did not fail the query itself.
    struct ConnectionEnded: Error {
        var words: String {
            "the server closed the connection while a query was waiting (a failover or restart, a pooler's restart, idle_session_timeout or pg_terminate_backend); the next query opens a new one"
        }
    }

    /// Runs `work` (queries on `connection`) within `limit`, counted with `progress` from the work's
    /// last move (each statement answered, each thousand rows read). Past it the connection is closed, which
    /// fails the query still waiting, and `NoAnswer` is thrown: a server killed mid-read or a
    /// connection lost in silence ends the command instead of hanging it. A connection the server
    /// closes is noticed at once: the driver fails the query with the server's message, and when it
    /// does not (a query written after the close waits in the driver for ever), `ConnectionEnded` is
    /// thrown within a second.
    static func bounded<T: Sendable>(
        _ connection: PostgresConnection, _ limit: Duration, movedBy progress: TimeLimit.Progress? = nil,
        _ work: @Sendable @escaping () async throws -> T
    ) async throws -> T {
        let started = ContinuousClock.now
        // Raced, not awaited to its end: a query on a dropped connection can wait in the driver for ever.
        let outcome = try await TimeLimit.race(limit, movedBy: progress) { () async -> Result<T, any Error> in
            await withTaskGroup(of: Result<T, any Error>?.self) { group in
                group.addTask {
                    do { return .success(try await work()) } catch { return .failure(error) }
                }
                group.addTask {
                    // Wakes only while a query is outstanding, twice a second; cancelled with it.
                    var closedSince: ContinuousClock.Instant?
                    while !Task.isCancelled {
                        try? await Task.sleep(for: .milliseconds(500))
                        guard connection.isClosed else { continue }
                        // The driver usually fails the query itself, with the server's own message:
                        // that answer is waited for a moment before this one is given.
                        if let since = closedSince, ContinuousClock.now - since >= .milliseconds(500) {
                            return .failure(ConnectionEnded())
                        }
                        closedSince = closedSince ?? ContinuousClock.now
                    }
                    return nil
                }
                defer { group.cancelAll() }
                while let next = await group.next() {
                    if let next { return next }
                }
                return .failure(CancellationError())
            }
        }
        // Closed without waiting for the close to finish: the event loop carries it out.
        if case .none = outcome { _ = connection.close() as EventLoopFuture<Void> }
        guard let outcome else {
            throw NoAnswer(limit: limit, elapsed: ContinuousClock.now - (progress?.last ?? started))
        }
        return try outcome.get()
    }

    /// Whether `host` is an IPv4 or IPv6 address rather than a name (TLS names only a host name).
    var hostIsAddress: Bool {
        (try? SocketAddress(ipAddress: host, port: port)) != nil
    }

    /// The connection configuration, with TLS as `sslmode` asks.
    func configuration() throws -> PostgresConnection.Configuration {
        let tls: PostgresConnection.Configuration.TLS
        switch sslMode {
        case .disable:
            tls = .disable
        case .allow, .prefer, .require:
            var configuration = TLSConfiguration.makeClientConfiguration()
            configuration.certificateVerification = .none
            let context = try NIOSSLContext(configuration: configuration)
            tls = sslMode == .require ? .require(context) : .prefer(context)
        case .verifyCA, .verifyFull:
            var configuration = TLSConfiguration.makeClientConfiguration()
            configuration.certificateVerification = sslMode == .verifyFull ? .fullVerification : .noHostnameVerification
            if let sslRootCert {
                configuration.trustRoots = .file(sslRootCert)
            }
            tls = .require(try NIOSSLContext(configuration: configuration))
        }
        var configuration = PostgresConnection.Configuration(
            host: host, port: port, username: user, password: password, database: database, tls: tls)
        configuration.options.connectTimeout = .seconds(connectTimeout.components.seconds)
        return configuration
    }
}
