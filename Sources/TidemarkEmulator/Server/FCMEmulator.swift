import Foundation
import TidemarkCore

/// tidemark's FCM emulator: every route of the wire protocol, as a function from request to response.
///
/// Wraps the same `FCMEngine` that the embedded backend uses, so both behave alike. The HTTP
/// server (`EmulatorServer`) only converts to and from `WireRequest` / `WireResponse`; all routing,
/// auth, limits, faults and error shapes live here and are tested without a socket.
public struct FCMEmulator: Sendable {
    /// The engine behind the emulator.
    public let engine: FCMEngine
    /// Grants and checks access tokens.
    public let authority: AccessTokenAuthority
    /// The run-time switches: faults, rate limits, API availability.
    public let control: EmulatorControl
    /// The messages sent, for tests and the admin API.
    public let deliveries: DeliveryLog
    /// What the calls changed, and their counts.
    public let traffic: TrafficLog
    /// The project whose key file the emulator wrote at start.
    public let defaultProject: String
    /// The clock for timestamps and message IDs.
    let timing: Timing

    /// An emulator over `engine`, checking tokens with `authority`.
    public init(
        engine: FCMEngine, authority: AccessTokenAuthority, control: EmulatorControl = EmulatorControl(),
        deliveries: DeliveryLog = DeliveryLog(), traffic: TrafficLog = TrafficLog(), defaultProject: String,
        timing: Timing = .live
    ) {
        self.engine = engine
        self.authority = authority
        self.control = control
        self.deliveries = deliveries
        self.traffic = traffic
        self.defaultProject = defaultProject
        self.timing = timing
    }

    /// The numeric sender ID the emulator gives a project (stable: derived from the project ID).
    public static func projectNumber(of project: String) -> String {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in project.utf8 {
            hash ^= UInt64(byte)
            hash = hash &* 0x0100_0000_01b3
        }
        return String(100_000_000_000 + hash % 900_000_000_000)
    }

    /// The host names the emulator answers to: it listens on loopback only, and a request naming any
    /// other host reached it through DNS rebinding (a web page's name resolved to 127.0.0.1).
    public static let loopbackHosts: Set<String> = LoopbackHost.names

    /// Answers one request.
    public func handle(_ request: WireRequest) async -> WireResponse {
        if let refusal = refuseForeignCaller(request) { return refusal }
        switch FCMRoute(method: request.method, segments: request.segments) {
        case .token:
            return await oauthToken(request)
        case .sts:
            return await stsToken(request)
        case .generateAccessToken(let email):
            return await generateAccessToken(request, email: email)
        case .metadata(let path):
            return await metadata(request, path: path)
        case .admin:
            return await admin(request)
        case .iid(let route):
            return await guarded(request, surface: .iid) { grant in await iid(route, request, grant: grant) }
        case .groups:
            return await guarded(request, surface: .groups) { grant in await groups(request, grant: grant) }
        case .v1(let project, let route):
            return await guarded(request, surface: .v1) { grant in
                await v1(route, project: project, request, grant: grant)
            }
        case .notFound:
            return notFound(request)
        }
    }

    /// Refuses what a browser-safe local server refuses: a `Host` that is not a loopback name (DNS
    /// rebinding), and a request from a web page of another origin (`Origin`, or `Sec-Fetch-Site`
    /// cross-site). Clients that are not browsers (tidemark, the Admin SDKs, curl) send neither.
    func refuseForeignCaller(_ request: WireRequest) -> WireResponse? {
        if let header = request.headers["host"] {
            guard LoopbackHost.accepts(header) else {
                return .status(
                    403, "PERMISSION_DENIED",
                    "The emulator answers only to loopback host names (127.0.0.1, localhost, [::1]), not '\(header.prefix(100))'."
                )
            }
        }
        let site = request.headers["sec-fetch-site"]?.lowercased()
        if site == "cross-site" || site == "same-site" {
            return .status(
                403, "PERMISSION_DENIED", "The emulator does not answer requests from web pages of other origins.")
        }
        if let origin = request.headers["origin"] {
            let own = request.headers["host"].map { ["http://\($0)", "https://\($0)"] } ?? []
            guard own.contains(origin.lowercased()) else {
                return .status(
                    403, "PERMISSION_DENIED",
                    "The emulator does not answer requests from web pages of other origins ('\(origin.prefix(100))').")
            }
        }
        return nil
    }

    /// A path no FCM API serves: Google's front end answers with an HTML page, not FCM's JSON, and so
    /// does the emulator (a client must never read it as "registration not found").
    func notFound(_ request: WireRequest) -> WireResponse {
        .html(404, title: "Error 404 (Not Found)!!1")
    }

    /// A path of tidemark's own admin API that does not exist.
    func adminNotFound(_ request: WireRequest) -> WireResponse {
        .status(404, "NOT_FOUND", "The emulator's admin API has no \(request.method) \(request.path).")
    }

    func methodNotFound(_ request: WireRequest) -> WireResponse {
        .status(404, "NOT_FOUND", "Method not found: \(request.method) \(request.path).")
    }

    // MARK: - Authentication, faults, latency

    enum Surface {
        /// The Instance ID API: flat errors, `access_token_auth: true` required.
        case iid
        /// `/fcm/notification`: flat errors, `access_token_auth: true` and `project_id` required.
        case groups
        /// The v1 APIs: google.rpc.Status errors, a Bearer token is enough.
        case v1
    }

    /// Authenticates the call, applies injected latency and faults, then runs `body`.
    func guarded(
        _ request: WireRequest, surface: Surface,
        _ body: (AccessTokenAuthority.Grant) async -> WireResponse
    ) async -> WireResponse {
        let grant: AccessTokenAuthority.Grant
        switch authenticate(request, surface: surface) {
        case .refused(let response): return response
        case .granted(let granted): grant = granted
        }
        traffic.count { counters in
            counters.requests += 1
            switch surface {
            case .v1: counters.v1Requests += 1
            case .iid: counters.iidRequests += 1
            case .groups: counters.groupRequests += 1
            }
        }
        let latency = control.latency
        if latency > .zero { try? await Task.sleep(for: latency) }
        let fault = control.drawFault()
        if fault != nil { traffic.count { $0.faults += 1 } }
        switch fault {
        case .drop?:
            var response = WireResponse(status: 500)
            response.dropConnection = true
            return response
        case .status(let code)?: return injectedStatus(code, surface: surface)
        case nil: return await body(grant)
        }
    }

    func injectedStatus(_ code: Int, surface: Surface) -> WireResponse {
        let (status, message) =
            switch code {
            case 429: ("RESOURCE_EXHAUSTED", "Quota exceeded for subscription changes (injected fault).")
            case 503: ("UNAVAILABLE", "The service is currently unavailable (injected fault).")
            default: ("INTERNAL", "Internal error encountered (injected fault).")
            }
        var response: WireResponse =
            surface == .v1
            ? .status(code, status, message, fcmErrorCode: code == 429 ? "QUOTA_EXCEEDED" : status)
            : .flatError(code, status)
        if code == 429 || code == 503 { response.headers.append(("Retry-After", "1")) }
        return response
    }

    enum AuthOutcome {
        case granted(AccessTokenAuthority.Grant)
        case refused(WireResponse)
    }

    func authenticate(_ request: WireRequest, surface: Surface) -> AuthOutcome {
        // Error bodies are built only when needed: this runs on every call.
        func unauthenticated() -> WireResponse {
            surface == .v1
                ? .status(
                    401, "UNAUTHENTICATED",
                    "Request is missing required authentication credential. Expected OAuth 2 access token, login cookie or other valid authentication credential. See https://developers.google.com/identity/sign-in/web/devconsole-project."
                )
                : .html(401, title: "Unauthorized")
        }
        func invalid() -> WireResponse {
            surface == .v1
                ? .status(
                    401, "UNAUTHENTICATED",
                    "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other valid authentication credential. See https://developers.google.com/identity/sign-in/web/devconsole-project."
                )
                : .html(401, title: "Unauthorized")
        }
        guard let authorization = request.headers["authorization"], !authorization.isEmpty else {
            return .refused(unauthenticated())
        }
        if authorization.lowercased().hasPrefix("key=") {
            let text = "Authenticating using server key is deprecated. Please use an OAuth2 token instead."
            return .refused(surface == .v1 ? .status(401, "UNAUTHENTICATED", text) : .flatError(401, text))
        }
        guard authorization.count > 7, authorization.prefix(7).lowercased() == "bearer " else {
            return .refused(unauthenticated())
        }
        if surface != .v1, request.headers["access_token_auth"]?.lowercased() != "true" {
            return .refused(unauthenticated())
        }
        let bearer = String(authorization.dropFirst(7)).trimmingCharacters(in: .whitespaces)
        switch authority.authenticate(bearer: bearer) {
        case .granted(let grant): return .granted(grant)
        case .invalid, .expired: return .refused(invalid())
        case .insufficientScopes:
            return .refused(
                surface == .v1
                    ? .status(403, "PERMISSION_DENIED", "Request had insufficient authentication scopes.")
                    : .flatError(403, "Request had insufficient authentication scopes."))
        }
    }

    /// The project of a v1 URL must be the credential's (by ID or by number); another project's token gets 403.
    func checkProject(_ project: String, grant: AccessTokenAuthority.Grant) -> WireResponse? {
        if project == grant.project || project == Self.projectNumber(of: grant.project) { return nil }
        return .status(
            403, "PERMISSION_DENIED",
            "Permission 'cloudmessaging.messages.create' denied on resource '//cloudresourcemanager.googleapis.com/projects/\(project)' (or it may not exist).",
            details: [.errorInfo(reason: "IAM_PERMISSION_DENIED", domain: "cloudresourcemanager.googleapis.com")])
    }

    /// The rate limit for subscription changes: nil to go on, or the 429 to send.
    func rateLimited(project: String, tokens: Int, surface: Surface) -> WireResponse? {
        guard let wait = control.admit(project: project, tokens: tokens) else { return nil }
        traffic.count { $0.rateLimited += 1 }
        var response: WireResponse =
            surface == .v1
            ? .status(
                429, "RESOURCE_EXHAUSTED",
                "Quota exceeded: topic subscription changes are limited per project; retry with exponential backoff.",
                fcmErrorCode: "QUOTA_EXCEEDED",
                details: [.quotaFailure(subject: "project:\(project)", "topic subscription changes per second")])
            : .flatError(429, "RESOURCE_EXHAUSTED")
        response.headers.append(("Retry-After", String(max(1, Int(wait.rounded(.up))))))
        return response
    }

    /// Admits one single-token subscription change: nil to go on (the change is then recorded in the
    /// traffic log), or the 429 (rate limit) or the injected per-token INTERNAL to send, shaped for `surface`.
    func admitSingleChange(
        project: String, surface: Surface, subscribe: Bool, topic: String, token: String
    )
        -> WireResponse?
    {
        if let limited = rateLimited(project: project, tokens: 1, surface: surface) { return limited }
        guard control.drawTokenFault() else {
            traffic.recordChange(
                project: project, operation: subscribe ? "subscribe" : "unsubscribe", topic: topic,
                tokens: [token], api: surface == .v1 ? "v1" : "iid")
            return nil
        }
        traffic.count { $0.faults += 1 }
        return surface == .v1
            ? .status(500, "INTERNAL", "Internal error encountered (injected fault).") : .flatError(500, "INTERNAL")
    }

    /// Parses a JSON object body; nil when it is not one.
    func jsonBody(_ request: WireRequest) -> [String: Any]? {
        if request.body.isEmpty { return [:] }
        return JSONReader.parse(request.body) as? [String: Any]
    }
}
