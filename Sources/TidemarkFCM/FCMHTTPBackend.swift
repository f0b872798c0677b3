import AsyncHTTPClient
import Foundation
import NIOCore
import NIOFoundationCompat
import NIOHTTP1
import Synchronization
import TidemarkCore

/// Which API carries topic subscriptions (design §1).
/// Where FCM's surfaces live: Google's hosts, or the emulator's one address for all of them.
public struct FCMEndpoints: Sendable, Equatable {
    /// The base URL of FCM v1 and of the device-group API.
    public var fcm: String
    /// The base URL of the Instance ID API.
    public var iid: String

    /// Google's own hosts.
    public static let google = FCMEndpoints(fcm: "https://fcm.googleapis.com", iid: "https://iid.googleapis.com")

    /// The emulator at `host` (`FCM_EMULATOR_HOST`, e.g. `127.0.0.1:9099`).
    public static func emulator(host: String) -> FCMEndpoints {
        let base = host.hasPrefix("http") ? host : "http://\(host)"
        return FCMEndpoints(fcm: base, iid: base)
    }

    /// Endpoints at `fcm` and `iid`.
    public init(fcm: String, iid: String) {
        self.fcm = fcm
        self.iid = iid
    }
}

/// A failure of an FCM call that retries could not fix, with what FCM answered. No credentials inside.
public struct FCMCallError: RetryableError, TidemarkError {
    /// `fcm_call_failed`.
    public var reason: FailureReason { "fcm_call_failed" }

    /// The HTTP status of the last answer (0 when none came).
    public var status: Int
    /// What failed and what FCM answered, naming the setting to check.
    public var message: String
    /// The message.
    public var description: String { message }
    /// The client already retried as far as the policy allows.
    public var isRetryable: Bool { false }
}

/// What the rate limit counts: FCM documents "3000 QPS" without saying whether a 1000-token IID
/// batch is one query or a thousand.
/// Counts FCM requests (retries included) across concurrent calls.
/// Counts the requests FCM answered (a call that never got a connection is not a request) and, of
/// those, the retries.
final class RequestCounter: Sendable {
    private let count = Atomic<Int>(0)
    private let repeated = Atomic<Int>(0)
    private let fromFCM = Atomic<Bool>(false)

    /// An answer that FCM (or the emulator) could have sent came back: a success, or an error in
    /// FCM's JSON. Until one does, what answers may be something else (a proxy, a wrong host).
    func answeredAsFCM() { fromFCM.store(true, ordering: .relaxed) }

    /// Whether anything answered as FCM does this run.
    var anyFCMAnswer: Bool { fromFCM.load(ordering: .relaxed) }

    private let notFCM = Mutex<String?>(nil)

    /// An answer FCM would not send came back (`summary` says what it was).
    func answeredNotAsFCM(_ summary: String) { notFCM.withLock { $0 = summary } }

    /// The last answer this run that was not FCM's, if any.
    var lastNotFCM: String? { notFCM.withLock { $0 } }

    func answered(attempt: Int) {
        count.add(1, ordering: .relaxed)
        if attempt > 1 { repeated.add(1, ordering: .relaxed) }
    }

    var value: Int { count.load(ordering: .relaxed) }
    var retries: Int { repeated.load(ordering: .relaxed) }
}

/// A failed connection in words a person can act on, and whether it says that nothing is there to
/// answer (refused, an unknown host, TLS or an answer that is not HTTP): before anything answered,
/// such a failure is reported at once instead of being retried for minutes.
struct NetworkFailure: Sendable {
    var words: String
    var nothingThere: Bool

    struct TimedOut: Error, CustomStringConvertible {
        var seconds: Int64
        var description: String { "no complete answer within \(seconds) s" }
    }

    static func of(_ error: any Error) -> NetworkFailure {
        if let late = error as? TimedOut {
            return NetworkFailure(
                words:
                    "the server did not answer within \(late.seconds) s (it accepts connections but does not answer, or answers too slowly)",
                nothingThere: true)
        }
        let text = String(reflecting: error).lowercased()
        func has(_ parts: String...) -> Bool { parts.contains { text.contains($0) } }
        if has("connection refused", "econnrefused", "connectionrefused") {
            return NetworkFailure(
                words: "the connection was refused (nothing listens at that host and port)", nothingThere: true)
        }
        if has("nxdomain", "dns", "could not resolve", "name or service not known", "no address", "nodename") {
            return NetworkFailure(words: "the host name could not be resolved", nothingThere: true)
        }
        if has("ssl", "tls", "handshake", "certificate") {
            return NetworkFailure(
                words:
                    "the TLS handshake failed (an https:// URL for a server that speaks plain HTTP, or a certificate this machine does not trust)",
                nothingThere: true)
        }
        if has(
            "httpparsererror", "llhttp", "invalid http", "invalidresponse", "malformed", "parse", "invalid constant",
            "invalid status", "invalid header", "invalid version", "invalid method")
        {
            return NetworkFailure(
                words: "the answer is not HTTP (something else listens on that port)", nothingThere: true)
        }
        if has("connecttimeout", "connect timeout", "connecttimeout") {
            return NetworkFailure(
                words: "connecting timed out (the host is down, or a firewall drops the connection)", nothingThere: true
            )
        }
        if has("readtimeout", "deadlineexceeded", "timeout", "timed out") {
            return NetworkFailure(words: "the server did not answer in time", nothingThere: true)
        }
        if has("remoteconnectionclosed", "connection reset", "econnreset", "closed", "eof") {
            return NetworkFailure(words: "the server closed the connection without an answer", nothingThere: true)
        }
        return NetworkFailure(words: QuotedAnswer.safe(ErrorText.describe(error)), nothingThere: false)
    }
}

/// The `emulator` and `fcm` backends: tidemark's HTTP client for FCM (reference §1, §2, §8).
///
/// The caller owns the `HTTPClient`. Every call takes an access token from the provider, waits
/// for the rate limiter, and retries per the shared `RetryPolicy`.
public struct FCMHTTPBackend: Backend {
    /// How the client behaves; the defaults are FCM's documented limits.
    public struct Options: Sendable {
        /// Which API carries topic changes and reads (`transport`).
        public var transport: TopicTransport = .v1
        /// The APIs `transport` picks from.
        public var topicAPIs = TopicAPIRegistry.standard
        /// Requests in flight at once for per-token work (v1 changes of one batch, refresh).
        public var concurrency = 100
        /// The client-side rate limit on subscription changes, or nil for none.
        public var limiter: RateLimiter?
        /// The client-side rate limit on reads (a registration's topics, a group's key), separate from
        /// the write quota because FCM documents none for reads; nil for none (`read_qps`).
        public var readLimiter: RateLimiter?
        /// What the write quota counts: tokens (FCM's quota) or requests.
        public var quotaUnit: QuotaUnit = .tokens
        /// Sent as `project_id` on device-group calls; default: the project id.
        public var senderID: String?
        /// How failed requests are retried.
        public var policy = RetryPolicy()
        /// The clock of retries, backoff and rate limits.
        public var timing = Timing.live
        /// The answers that mark a token dead; anything undocumented stops the command.
        public var unregistered = UnregisteredAnswers.default
        /// v1 tokens an apply sends between journal entries: a killed apply re-sends at most twice this
        /// many of each operation in flight (the step being sent and the one being journaled). Twice
        /// `concurrency` keeps the requests of a step flowing.
        public var journalStep = 200
        /// The shape of the device-group export call (unconfirmed, reference §9).
        public var groupExport = GroupExportCall()
        /// Asked before every request that changes FCM (and every retry of one): a run that lost its
        /// state lock sends nothing more.
        public var gate: LeaseGate?
        /// How long one request may take, answer and body included: a server that accepts and never
        /// answers, or drips its answer a byte at a time, ends the attempt here (and it is retried).
        public var exchangeLimit: Duration = .seconds(60)
        /// Told of every retry and of answers after retries, so a wait longer than a few seconds is
        /// said on screen; nil says nothing.
        public var narrator: RetryNarrator?
        /// Attempts that answer with a retryable status but not as FCM, before anything answered as
        /// FCM this run: then the command stops, as a proxy's or a wrong host's error page will not mend.
        public var notFCMAttempts = 3
        /// Told of every attempt as it ends (`serve`'s metrics and its watch on FCM); nil: nobody.
        public var observer: FCMAttemptObserver?

        /// FCM's documented limits, over v1.
        public init() {}
    }

    /// The backend's kind and FCM project, as state records them.
    public let identity: BackendIdentity
    /// The FCM project.
    public let project: String
    /// Where FCM's APIs are.
    public let endpoints: FCMEndpoints
    let routes: HTTPRoutes
    let credentials: AccessTokenProvider
    /// How the client behaves.
    public let options: Options
    let counter = RequestCounter()

    /// How topic changes and reads travel (`options.transport`).
    let topicAPI: any TopicAPI

    /// Requests go straight through `client`.
    public init(
        kind: BackendKind, project: String, endpoints: FCMEndpoints, client: HTTPClient,
        credentials: AccessTokenProvider, options: Options = Options()
    ) {
        self.init(
            kind: kind, project: project, endpoints: endpoints, routes: HTTPRoutes(direct: client),
            credentials: credentials, options: options)
    }

    /// Requests go the way `routes` sends each URL (through a proxy, or straight).
    public init(
        kind: BackendKind, project: String, endpoints: FCMEndpoints, routes: HTTPRoutes,
        credentials: AccessTokenProvider, options: Options = Options()
    ) {
        identity = BackendIdentity(kind: kind, project: project)
        self.project = project
        self.endpoints = endpoints
        self.routes = routes
        self.credentials = credentials
        var options = options
        options.concurrency = max(1, options.concurrency)
        self.options = options
        topicAPI = options.topicAPIs.api(for: options.transport) ?? UnregisteredTopicAPI(transport: options.transport)
    }

    /// Requests sent so far, retries included.
    public func requestCount() -> Int? { counter.value }
    /// Of those, the ones that repeated an earlier request.
    public func retryCount() -> Int? { counter.retries }

    /// Tokens an apply sends between journal entries (v1); nil: one entry per batch (IID).
    public var journalStep: Int? { topicAPI.journalStep(options) }

    /// The backend, the address its answers come from and the setting that chose it.
    public var location: String {
        let setting = identity.kind == .emulator ? "FCM_EMULATOR_HOST" : topicAPI.setting
        return "\(identity) at \(topicAPI.base(endpoints)) (\(setting))"
    }

    /// v1 changes one membership a request; IID a batch of up to 1000; each group step is one call.
    public func requests(for operations: [PlannedOperation]) -> Int {
        TopicTransport.requests(for: operations, counted: topicAPI.requests)
    }

    /// An `HTTPClient` configuration for FCM: enough kept-alive HTTP/1 connections per host that
    /// `connections` requests can be in flight (AsyncHTTPClient's default is 8; Google's hosts speak
    /// HTTP/2 over TLS, where requests share connections anyway).
    public static func clientConfiguration(connections: Int = 64) -> HTTPClient.Configuration {
        var configuration = HTTPClient.Configuration()
        configuration.connectionPool = .init(
            idleTimeout: .seconds(60),
            concurrentHTTP1ConnectionsPerHostSoftLimit: max(1, connections))
        configuration.timeout = .init(connect: .seconds(10), read: .seconds(60))
        return configuration
    }

    /// An answer from FCM: its status and body, read through the shared wire types.
    public struct Answer: Sendable {
        /// The HTTP status.
        public var status: Int
        /// The body.
        public var body: Data
        /// The `Content-Type` header.
        public var contentType: String? = nil

        /// The body as `T`, when it has that shape.
        public func decode<T: Decodable>(_ type: T.Type) -> T? { FCMWire.decode(type, from: body) }

        /// A v1 error's google.rpc.Status, when the body is one.
        var rpcStatus: FCMWire.Status? { decode(FCMWire.ErrorBody.self)?.error }

        /// FcmError `errorCode`, else google.rpc.Status `status`, else a flat `error` string.
        public var code: String? {
            if let status = rpcStatus { return status.fcmErrorCode ?? status.status }
            return decode(FCMWire.FlatError.self)?.error
        }

        /// Whether FCM could have sent this: a success, or an error in one of FCM's JSON shapes.
        var fromFCM: Bool { (200..<300).contains(status) || code != nil }

        /// The status and FCM's error code, for a retry's notice: `HTTP 503 (UNAVAILABLE)`, or
        /// `HTTP 502, not from FCM (text/html)`.
        var summary: String {
            if let code { return "HTTP \(status) (\(QuotedAnswer.safe(String(code.prefix(60)))))" }
            return "HTTP \(status), not an answer from FCM (\(contentType ?? "no Content-Type"))"
        }
    }

    /// One call with auth, rate limiting (`changes` subscription changes) and retries of retryable
    /// statuses and network errors.
    /// `successBody: false` skips parsing a 2xx answer's body (the v1 changes need only the status).
    public func call(
        _ method: HTTPMethod, _ url: String, body: Data? = nil, changes: Int = 0, iidHeaders: Bool = false,
        groupHeaders: Bool = false, successBody: Bool = true
    ) async throws -> Answer {
        let timing = options.timing
        let started = timing.now()
        let kind: FCMAttempt.Kind = method == .GET ? .read : .write
        let observer = options.observer
        func observe(_ outcome: FCMAttempt.Outcome, _ status: Int?, _ cause: String) {
            observer?(
                FCMAttempt(
                    kind: kind, outcome: outcome, code: FCMAttempt.code(of: status), cause: cause,
                    elapsed: Timing.seconds(timing.now() - started)))
        }
        var attempt = 0
        var refreshedToken = false
        var lastNetwork: NetworkFailure?
        // The last answer of a retryable status: what the caller gets once retries stop.
        var unresolved: Answer?
        while true {
            attempt += 1
            if changes > 0, let limiter = options.limiter {
                try await limiter.acquire(options.quotaUnit == .tokens ? Double(changes) : 1)
            }
            let bearer = try await credentials.token()
            // After the waits for quota and for a token, right before the request leaves.
            if method != .GET { try await options.gate?.check() }
            var request = HTTPClientRequest(url: url)
            request.method = method
            request.headers.add(name: "Authorization", value: "Bearer \(bearer)")
            if iidHeaders || groupHeaders { request.headers.add(name: "access_token_auth", value: "true") }
            if groupHeaders { request.headers.add(name: "project_id", value: options.senderID ?? project) }
            if let body {
                request.headers.add(name: "Content-Type", value: "application/json")
                request.body = .bytes(ByteBuffer(data: body))
            }
            let failure: RetryPolicy.Failure
            let cause: String
            var answeredByFCM = false
            do {
                let (response, bytes) = try await exchange(request)
                counter.answered(attempt: attempt)
                options.gate?.progressed()
                let status = Int(response.status.code)
                let body = !successBody && (200..<300).contains(status) ? Data() : Data(buffer: bytes)
                let answer = Answer(
                    status: status, body: body, contentType: response.headers.first(name: "Content-Type"))
                if answer.fromFCM { counter.answeredAsFCM() } else { counter.answeredNotAsFCM(answer.summary) }
                if status == 401, !refreshedToken {
                    // The token may have been revoked or expired early: fetch a new one, once.
                    refreshedToken = true
                    observe(.retried, status, answer.summary)
                    await credentials.invalidate()
                    continue
                }
                guard RetryPolicy.isRetryable(status: status) else {
                    observe((200..<300).contains(status) ? .success : .failed, status, answer.summary)
                    options.narrator?.answered(attempt: attempt)
                    return answer
                }
                if !answer.fromFCM, !counter.anyFCMAnswer, attempt >= options.notFCMAttempts {
                    // A proxy's or a wrong host's error page, again and again, and nothing has answered as FCM.
                    observe(.failed, status, answer.summary)
                    throw unexpected(
                        answer, method, url,
                        "Nothing at \(base(of: url)) has answered as FCM this run (\(attempt) attempts)")
                }
                failure = .status(
                    status,
                    retryAfter: response.headers.first(name: "Retry-After")
                        .flatMap { RetryPolicy.parseRetryAfter($0, now: timing.wallClock()) })
                unresolved = answer
                cause = answer.summary
                answeredByFCM = answer.fromFCM
            } catch is CancellationError {
                throw CancellationError()
            } catch let error as CredentialError {
                throw error
            } catch let error as FCMCallError {
                throw error
            } catch {
                let network = NetworkFailure.of(error)
                lastNetwork = network
                if network.nothingThere || counter.lastNotFCM != nil, !counter.anyFCMAnswer {
                    // Nothing has answered as FCM this run: a refused connection, an unknown host, an answer that
                    // is not HTTP, or a proxy's error page will not mend in the retry budget's minutes. Say so now.
                    let earlier = counter.lastNotFCM.map { " (it answered \($0) before)" } ?? ""
                    observe(.failed, nil, network.words)
                    throw FCMCallError(
                        status: 0,
                        message:
                            "\(method) \(Self.redact(url)) failed: \(network.words). Nothing at \(base(of: url)) has answered as FCM this run\(earlier); check \(setting(for: url))."
                    )
                }
                failure = .network
                cause = network.words
            }
            let elapsed = timing.now() - started
            let failedStatus: Int?
            if case .status(let status, _) = failure { failedStatus = status } else { failedStatus = nil }
            switch options.policy.decide(failure, attempt: attempt, elapsed: elapsed, timing: timing) {
            case .retry(let delay):
                observe(.retried, failedStatus, cause)
                var notice = RetryNotice(
                    call: "\(method) \(Self.redact(url))", cause: cause, attempt: attempt, retryingAfter: delay,
                    elapsed: elapsed, policy: options.policy, setting: setting(for: url))
                notice.answeredByFCM = answeredByFCM
                options.narrator?.retrying(notice)
                try await timing.sleep(delay)
            case .giveUp(let reason):
                observe(.failed, failedStatus, cause)
                if let unresolved { return unresolved }
                let cause = lastNetwork.map { "\($0.words); " } ?? ""
                throw FCMCallError(
                    status: 0,
                    message: "\(method) \(Self.redact(url)) failed: \(cause)\(reason). Check \(setting(for: url)).")
            }
        }
    }

    /// `segment` percent-encoded for a URL path or query.
    public static func encode(_ segment: String) -> String {
        segment.addingPercentEncoding(withAllowedCharacters: .alphanumerics.union(CharacterSet(charactersIn: "-_.~")))
            ?? segment
    }

    /// An answer tidemark did not expect: it stops the command, naming the URL (tokens redacted), what
    /// came back and the setting to check. It is never read as "token dead" or "nothing to do".
    public func unexpected(_ answer: Answer, _ method: HTTPMethod, _ url: String, _ what: String) -> FCMCallError {
        let text = String(decoding: answer.body.prefix(200), as: UTF8.self)
        let looksJSON = text.trimmingCharacters(in: .whitespacesAndNewlines).hasPrefix("{")
        let kind: String
        if answer.body.isEmpty {
            kind = "an empty body"
        } else if looksJSON {
            let oneLine = text.split(whereSeparator: \.isNewline).joined(separator: " ")
            let quoted = QuotedAnswer.safe(String(oneLine.prefix(120)))
            kind = "a body FCM does not send here: \(quoted)\(text.count > 120 && !quoted.hasSuffix("…") ? "…" : "")"
        } else {
            kind =
                "a body that is not JSON (\(answer.contentType ?? "no Content-Type")), such as a proxy's or a wrong path's error page"
        }
        let setting = setting(for: url)
        return FCMCallError(
            status: answer.status,
            message:
                "\(what): \(method) \(Self.redact(url)) answered HTTP \(answer.status) with \(kind). Nothing was concluded from it; check \(setting) and the service account's access."
        )
    }

    /// The base URL a request goes to (FCM's, or the Instance ID API's).
    func base(of url: String) -> String {
        URLRedaction.display(url.hasPrefix(endpoints.iid + "/iid/") ? endpoints.iid : endpoints.fcm)
    }

    /// The setting that chose where `url` goes, with its value, for messages.
    func setting(for url: String) -> String {
        let base = base(of: url)
        if identity.kind == .emulator { return "FCM_EMULATOR_HOST (now \(base))" }
        return url.hasPrefix(endpoints.iid + "/iid/")
            ? "iid_url in tidemark.yaml or TIDEMARK_IID_URL (now \(base))"
            : "fcm_url in tidemark.yaml or TIDEMARK_FCM_URL (now \(base))"
    }

    /// Sends `request` and reads the answer's body, within `options.exchangeLimit` in all.
    func exchange(_ request: HTTPClientRequest) async throws -> (HTTPClientResponse, ByteBuffer) {
        let routes = routes
        let limit = options.exchangeLimit
        let answer = try await TimeLimit.race(limit) {
            let response = try await routes.execute(request, timeout: .seconds(limit.components.seconds))
            return Exchanged(response: response, body: try await response.body.collect(upTo: 16 << 20))
        }
        guard let answer else { throw NetworkFailure.TimedOut(seconds: limit.components.seconds) }
        return (answer.response, answer.body)
    }

    private struct Exchanged: Sendable {
        var response: HTTPClientResponse
        var body: ByteBuffer
    }

    /// URLs carry registration tokens; errors show them redacted.
    static func redact(_ url: String) -> String {
        URLRedaction.display(url).split(separator: "/", omittingEmptySubsequences: false).map { part in
            guard part.count > 40 else { return part }
            // The token as the plan and state show it: its fingerprint is of the token, not of its
            // percent-encoded form in the path.
            let segment = String(part.prefix { $0 != "?" })
            return Substring(Redaction.redact(segment.removingPercentEncoding ?? segment))
        }.joined(separator: "/")
    }

    /// Runs `work` for every index with at most `concurrency` in flight; results in input order.
    public func forEachConcurrently<T: Sendable>(
        _ count: Int, _ work: @escaping @Sendable (Int) async throws -> T
    )
        async throws -> [T]
    {
        try await BoundedConcurrency.map(count, width: options.concurrency, work)
    }
}
