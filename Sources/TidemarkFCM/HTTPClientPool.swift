import AsyncHTTPClient
import Synchronization

/// HTTP clients kept beyond the life of one backend. `serve` builds a backend for every reconcile and
/// for every batch of changed devices (several a second while a table changes); with a client of its
/// own, each would open new connections, a TCP and TLS handshake with FCM before its first call and
/// another per connection it needs. One pool per process: the routes for a set of proxy settings are
/// made once, their connections stay open between batches (the client's idle timeout closes them
/// after a quiet minute), and `shutdown()` closes them when the process is done.
public final class HTTPClientPool: Sendable {
    private struct State {
        var routes: [(settings: ProxySettings, routes: HTTPRoutes)] = []
        var closed = false
    }

    private let state = Mutex(State())
    private let configuration: @Sendable () -> HTTPClient.Configuration

    /// An empty pool whose clients are made with `configuration`.
    public init(
        configuration: @escaping @Sendable () -> HTTPClient.Configuration = { FCMHTTPBackend.clientConfiguration() }
    ) {
        self.configuration = configuration
    }

    /// The routes for `settings`: made at the first call, the same ones after it. Nil once the pool
    /// is shut down (the caller makes routes of its own).
    public func routes(for settings: ProxySettings) -> HTTPRoutes? {
        state.withLock { state in
            guard !state.closed else { return nil }
            if let kept = state.routes.first(where: { $0.settings == settings }) { return kept.routes }
            let routes = HTTPRoutes(settings: settings, configuration: configuration())
            state.routes.append((settings, routes))
            return routes
        }
    }

    /// How many sets of routes the pool holds.
    public var count: Int { state.withLock { $0.routes.count } }

    /// Closes every client the pool made; later calls to `routes(for:)` get nil.
    public func shutdown() async {
        let all = state.withLock { state -> [HTTPRoutes] in
            state.closed = true
            defer { state.routes = [] }
            return state.routes.map(\.routes)
        }
        for routes in all { try? await routes.shutdown() }
    }
}
