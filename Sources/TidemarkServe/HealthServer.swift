import Foundation
import HTTPTypes
import Hummingbird
import NIOCore
import Synchronization
import TidemarkCore

/// What `/readyz` checks, refreshed in the background so that the endpoint answers at once even
/// while the state server hangs: whether tidemark.yaml loads, and whether the state store answers.
public struct ReadinessCheck: Sendable, Equatable {
    /// The check's name (`settings`, `state`).
    public var name: String
    /// Whether it passed.
    public var ok: Bool
    /// Why not, when it failed.
    public var detail: String?

    /// A check named `name` that passed, or failed for `detail`.
    public init(name: String, ok: Bool, detail: String? = nil) {
        self.name = name
        self.ok = ok
        self.detail = detail
    }
}

/// The answers of `serve`'s HTTP endpoints, kept apart from the server so that tests call them directly.
public struct HealthEndpoints: Sendable {
    /// The workspaces' status, as `/status` answers it.
    public var status: @Sendable () -> ServeStatus
    /// The readiness checks as last run (empty before the first run).
    public var readiness: @Sendable () -> [ReadinessCheck]
    /// The metrics exposition.
    public var metrics: @Sendable () -> [UInt8]

    /// Endpoints answering from these three sources.
    public init(
        status: @escaping @Sendable () -> ServeStatus, readiness: @escaping @Sendable () -> [ReadinessCheck],
        metrics: @escaping @Sendable () -> [UInt8]
    ) {
        self.status = status
        self.readiness = readiness
        self.metrics = metrics
    }

    /// The answer to `GET path?query`: its status code, content type and body.
    public func answer(path: String, query: String?) -> (status: Int, contentType: String, body: [UInt8]) {
        let text = "text/plain; charset=utf-8"
        switch path {
        case "/livez", "/healthz":
            return (200, text, Array("ok\n".utf8))
        case "/readyz":
            let checks = readiness()
            let verbose = (query ?? "").split(separator: "&").contains { $0 == "verbose" || $0.hasPrefix("verbose=") }
            let ready = !checks.isEmpty && checks.allSatisfy(\.ok)
            var lines: [String] = []
            if verbose || !ready {
                if checks.isEmpty { lines.append("[-]checks not run yet") }
                for check in checks {
                    lines.append(check.ok ? "[+]\(check.name) ok" : "[-]\(check.name) failed: \(check.detail ?? "")")
                }
            }
            lines.append(ready ? "ok" : "readyz check failed")
            return (ready ? 200 : 503, text, Array((lines.joined(separator: "\n") + "\n").utf8))
        case "/status":
            let body = (try? WorkspaceStatus.encoder.encode(status())).map { Array($0) + [0x0A] } ?? Array("{}\n".utf8)
            return (200, "application/json", body)
        case "/metrics":
            return (200, "text/plain; version=0.0.4; charset=utf-8", metrics())
        default:
            return (
                404, text,
                Array("not found: tidemark serve answers /livez, /readyz (?verbose), /status and /metrics\n".utf8)
            )
        }
    }
}

/// The whole of `/status`: this replica and its workspaces.
public struct ServeStatus: Sendable, Codable, Equatable {
    /// tidemark's version.
    public var version: String
    /// This replica (host and process).
    public var replica: String
    /// When it started.
    public var startedAt: Date
    /// Its workspaces.
    public var workspaces: [WorkspaceStatus]

    /// The status of `replica`, started at `startedAt`, with `workspaces`.
    public init(version: String, replica: String, startedAt: Date, workspaces: [WorkspaceStatus]) {
        self.version = version
        self.replica = replica
        self.startedAt = startedAt
        self.workspaces = workspaces
    }
}

/// Serves `HealthEndpoints` over HTTP with Hummingbird.
struct HealthResponder: HTTPResponder {
    typealias Context = BasicRequestContext
    let endpoints: HealthEndpoints
    /// Listening on loopback: only loopback host names are answered (`LoopbackHost`), so that a web
    /// page cannot read `/status` through DNS rebinding. On any other address (a pod's, where probes
    /// and Prometheus name the pod's IP or a Service) every host name is answered.
    var loopbackOnly = false

    /// How long a connection may stay without a complete request, and how many may be open at once.
    static let idleTimeout: TimeAmount = .seconds(10)
    static let maxConnections = 64

    func respond(to request: Request, context: Context) async throws -> Response {
        if loopbackOnly, let host = request.head.authority, !LoopbackHost.accepts(host) {
            return Response(
                status: .forbidden, headers: [.contentType: "text/plain; charset=utf-8"],
                body: .init(
                    byteBuffer: ByteBuffer(
                        string:
                            "tidemark serve listens on loopback and answers only to 127.0.0.1, localhost and [::1]\n"
                    )))
        }
        guard request.method == .get || request.method == .head else {
            return Response(status: .methodNotAllowed, headers: [.allow: "GET, HEAD"])
        }
        let answer = endpoints.answer(path: request.uri.path, query: request.uri.query)
        var fields = HTTPFields()
        fields[.contentType] = answer.contentType
        fields[.cacheControl] = "no-store"
        return Response(
            status: HTTPResponse.Status(code: answer.status), headers: fields,
            body: .init(byteBuffer: ByteBuffer(bytes: answer.body)))
    }
}
