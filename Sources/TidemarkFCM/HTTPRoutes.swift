import AsyncHTTPClient
import Foundation
import NIOCore

/// Where tidemark's HTTP requests go: straight to the server, or through the proxy that
/// `HTTPS_PROXY` / `HTTP_PROXY` name, except for hosts `NO_PROXY` lists (curl's rules: a host, a
/// domain and its subdomains with or without a leading dot, an optional `:port`, or `*`).
/// Proxy credentials in the URL (`http://user:pass@proxy:3128`) are sent as Basic authorization and
/// never printed.
public struct ProxySettings: Sendable, Equatable {
    /// A proxy from the environment.
    public struct Proxy: Sendable, Equatable {
        /// The proxy's host.
        public var host: String
        /// Its port.
        public var port: Int
        /// The user of Basic authorization, when the URL carries one.
        public var user: String?
        /// Its password; never printed.
        public var password: String?

        /// "http://proxy.corp:3128" without credentials, for messages.
        public var display: String { "http://\(host):\(port)" }
    }

    /// For https:// URLs (`HTTPS_PROXY`, else `https_proxy`).
    public var https: Proxy?
    /// For http:// URLs (`HTTP_PROXY`, else `http_proxy`).
    public var http: Proxy?
    /// Hosts reached directly (`NO_PROXY`, else `no_proxy`), lowercased.
    public var noProxy: [String]

    /// Proxies for https:// and http:// URLs, and the hosts reached directly.
    public init(https: Proxy? = nil, http: Proxy? = nil, noProxy: [String] = []) {
        self.https = https
        self.http = http
        self.noProxy = noProxy
    }

    /// The settings an environment gives; a proxy URL that cannot be read is an error naming the variable.
    public static func from(_ environment: [String: String]) throws -> ProxySettings {
        func value(_ name: String) -> (String, String)? {
            for key in [name, name.lowercased()] {
                if let text = environment[key]?.trimmingCharacters(in: .whitespaces), !text.isEmpty {
                    return (key, text)
                }
            }
            return nil
        }
        var settings = ProxySettings()
        if let (name, text) = value("HTTPS_PROXY") { settings.https = try parse(text, variable: name) }
        if let (name, text) = value("HTTP_PROXY") { settings.http = try parse(text, variable: name) }
        if let (_, text) = value("NO_PROXY") {
            settings.noProxy = text.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces).lowercased() }
                .filter { !$0.isEmpty }
        }
        return settings
    }

    static func parse(_ text: String, variable: String) throws -> Proxy {
        let withScheme = text.contains("://") ? text : "http://" + text
        guard let components = URLComponents(string: withScheme), let host = components.host, !host.isEmpty else {
            throw CredentialError("\(variable) is not a proxy URL such as http://proxy.example.com:3128.")
        }
        guard components.scheme == "http" else {
            throw CredentialError(
                "\(variable) names a \(components.scheme ?? "") proxy; tidemark speaks to HTTP proxies (http://host:port), which tunnel HTTPS with CONNECT."
            )
        }
        return Proxy(
            host: host, port: components.port ?? 80, user: components.user.map { $0.removingPercentEncoding ?? $0 },
            password: components.password.map { $0.removingPercentEncoding ?? $0 })
    }

    /// The proxy for `url`, or nil to go straight there.
    public func proxy(for url: String) -> Proxy? {
        guard let components = URLComponents(string: url), let host = components.host?.lowercased() else { return nil }
        let proxy = components.scheme == "https" ? https : http
        guard let proxy else { return nil }
        let port = components.port ?? (components.scheme == "https" ? 443 : 80)
        for entry in noProxy {
            if entry == "*" { return nil }
            var pattern = entry
            if let colon = pattern.lastIndex(of: ":"), !pattern.hasPrefix("["),
                let wanted = Int(pattern[pattern.index(after: colon)...])
            {
                guard wanted == port else { continue }
                pattern = String(pattern[..<colon])
            }
            pattern = pattern.trimmingCharacters(in: CharacterSet(charactersIn: "[]"))
            if pattern.hasPrefix(".") { pattern.removeFirst() }
            let bare = host.trimmingCharacters(in: CharacterSet(charactersIn: "[]"))
            if bare == pattern || bare.hasSuffix("." + pattern) { return nil }
        }
        return proxy
    }
}

/// The HTTP clients of a run: one that connects directly and one per proxy, each request sent
/// through the one `ProxySettings` picks for its URL.
public struct HTTPRoutes: Sendable {
    /// The client that connects straight to servers.
    public let direct: HTTPClient
    let proxied: [ProxySettings.Proxy: HTTPClient]
    /// Which proxy each URL goes through.
    public let settings: ProxySettings

    /// Routes everything straight through `client` (tests, and runs without a proxy).
    public init(direct client: HTTPClient) {
        direct = client
        proxied = [:]
        settings = ProxySettings()
    }

    /// Makes a client per proxy in `settings` with `configuration`; `shutdown()` closes them all.
    public init(settings: ProxySettings, configuration: HTTPClient.Configuration) {
        direct = HTTPClient(eventLoopGroupProvider: .singleton, configuration: configuration)
        var clients: [ProxySettings.Proxy: HTTPClient] = [:]
        for proxy in [settings.https, settings.http].compactMap({ $0 }) where clients[proxy] == nil {
            var withProxy = configuration
            let authorization = proxy.user.map {
                HTTPClient.Authorization.basic(username: $0, password: proxy.password ?? "")
            }
            withProxy.proxy = .server(host: proxy.host, port: proxy.port, authorization: authorization)
            clients[proxy] = HTTPClient(eventLoopGroupProvider: .singleton, configuration: withProxy)
        }
        proxied = clients
        self.settings = settings
    }

    /// The client for `url`: through its proxy, or direct.
    public func client(for url: String) -> HTTPClient {
        settings.proxy(for: url).flatMap { proxied[$0] } ?? direct
    }

    /// Sends `request` the way its URL goes. A proxy that refuses tidemark's credentials or answers
    /// what is not HTTP is a `CredentialError` at once (retrying cannot fix a configuration); other
    /// failures are the caller's to retry.
    public func execute(_ request: HTTPClientRequest, timeout: TimeAmount) async throws -> HTTPClientResponse {
        do {
            return try await client(for: request.url).execute(request, timeout: timeout)
        } catch let error as HTTPClientError {
            guard let proxy = settings.proxy(for: request.url) else { throw error }
            switch error {
            case .proxyAuthenticationRequired:
                throw CredentialError(
                    "The proxy \(proxy.display) refused tidemark (407 Proxy Authentication Required)\(proxy.user == nil ? "; give its user and password in the proxy URL, http://USER:PASSWORD@host:port" : " with the user and password in the proxy URL"), or list the host in NO_PROXY."
                )
            case .invalidProxyResponse:
                throw CredentialError(
                    "The proxy \(proxy.display) did not answer as an HTTP proxy (CONNECT); check HTTPS_PROXY / HTTP_PROXY."
                )
            default:
                throw error
            }
        }
    }

    /// Shuts down the clients (after the run; a caller of `init(direct:)` may shut its client down itself).
    public func shutdown() async throws {
        for client in proxied.values { try await client.shutdown() }
        try await direct.shutdown()
    }
}

extension ProxySettings.Proxy: Hashable {}
