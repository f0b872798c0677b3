import Foundation
import NIOHTTP1
import TidemarkCore

/// How topic memberships travel between tidemark and FCM: one type per topic API, picked by the
/// `transport` setting from the backend's `TopicAPIRegistry`. A new API is one conforming type and one
/// registration (`Registries.transports.register`), checked by the backend conformance suite; the
/// backend's calls, retries, quota, fencing and errors are shared (`FCMHTTPBackend.call`,
/// `changeOutcome`, `batch`, `listTopics`, `infoTopics`).
public protocol TopicAPI: Sendable {
    /// Which `transport` setting picks this API.
    var transport: TopicTransport { get }
    /// How the requests an apply sends over it are counted (what a plan reports).
    var requests: TopicTransport.Requests { get }
    /// The base URL its requests go to.
    func base(_ endpoints: FCMEndpoints) -> String
    /// The settings that name that URL, for messages (`fcm_url or TIDEMARK_FCM_URL`).
    var setting: String { get }
    /// Tokens a change is journaled after (a v1 change is one request per token); nil: per batch.
    func journalStep(_ options: FCMHTTPBackend.Options) -> Int?
    /// Subscribes `tokens` to `topic`: one outcome per token, in order.
    func subscribe(_ backend: FCMHTTPBackend, topic: String, tokens: [String]) async throws -> [TokenOutcome]
    /// Unsubscribes `tokens` from `topic`: one outcome per token, in order.
    func unsubscribe(_ backend: FCMHTTPBackend, topic: String, tokens: [String]) async throws -> [TokenOutcome]
    /// One registration's topics, or `.notFound` when FCM does not know it.
    func read(_ backend: FCMHTTPBackend, token: String) async throws -> RegistrationStatus
}

/// The topic APIs a backend may carry changes over, by the `transport` that picks each.
public struct TopicAPIRegistry: Sendable {
    private var apis: [TopicTransport: any TopicAPI] = [:]
    /// The transports registered, in the order they were first registered.
    public private(set) var transports: [TopicTransport] = []

    /// An empty registry.
    public init() {}

    /// Registers `api` for its transport (replacing one registered for the same name).
    public mutating func register(_ api: any TopicAPI) {
        if apis[api.transport] == nil { transports.append(api.transport) }
        apis[api.transport] = api
    }

    /// The API `transport` picks; nil when none is registered for it.
    public func api(for transport: TopicTransport) -> (any TopicAPI)? { apis[transport] }

    /// FCM's topic subscription API (`v1`) and the Instance ID batch API (`iid`).
    public static let standard: TopicAPIRegistry = {
        var registry = TopicAPIRegistry()
        registry.register(V1TopicAPI())
        registry.register(IIDTopicAPI())
        return registry
    }()
}

/// A transport no API is registered for: every call says so (the runtime refuses such a transport
/// before any call; this covers a backend built by hand).
struct UnregisteredTopicAPI: TopicAPI {
    var transport: TopicTransport
    var requests: TopicTransport.Requests { .perToken }
    func base(_ endpoints: FCMEndpoints) -> String { endpoints.fcm }
    var setting: String { "transport" }
    func journalStep(_ options: FCMHTTPBackend.Options) -> Int? { max(1, options.journalStep) }

    private func refuse() -> FCMCallError {
        FCMCallError(
            status: 0,
            message:
                "no topic API is registered for transport '\(transport.rawValue)'; use \(TopicTransport.describe(TopicAPIRegistry.standard.transports)) (transport in tidemark.yaml, --transport)."
        )
    }
    func subscribe(_ backend: FCMHTTPBackend, topic: String, tokens: [String]) async throws -> [TokenOutcome] {
        throw refuse()
    }
    func unsubscribe(_ backend: FCMHTTPBackend, topic: String, tokens: [String]) async throws -> [TokenOutcome] {
        throw refuse()
    }
    func read(_ backend: FCMHTTPBackend, token: String) async throws -> RegistrationStatus { throw refuse() }
}

/// FCM v1: one registration's subscription a request (`registrations/TOKEN/topicSubscriptions`).
struct V1TopicAPI: TopicAPI {
    var transport: TopicTransport { .v1 }
    var requests: TopicTransport.Requests { .perToken }
    func base(_ endpoints: FCMEndpoints) -> String { endpoints.fcm }
    var setting: String { "fcm_url or TIDEMARK_FCM_URL" }
    func journalStep(_ options: FCMHTTPBackend.Options) -> Int? { max(1, options.journalStep) }

    func subscribe(_ backend: FCMHTTPBackend, topic: String, tokens: [String]) async throws -> [TokenOutcome] {
        try await backend.forEachConcurrently(tokens.count) { i in
            let url = backend.registrationsURL(tokens[i]) + "?topic_name=\(FCMHTTPBackend.encode(topic))"
            // 409 ALREADY_EXISTS: already subscribed, which is what we wanted.
            return try backend.changeOutcome(
                try await backend.call(.POST, url, body: Data("{}".utf8), changes: 1, successBody: false), .POST, url,
                success: [200, 409])
        }
    }

    func unsubscribe(_ backend: FCMHTTPBackend, topic: String, tokens: [String]) async throws -> [TokenOutcome] {
        try await backend.forEachConcurrently(tokens.count) { i in
            let url = backend.registrationsURL(tokens[i]) + "/\(FCMHTTPBackend.encode(topic))?allow_missing=true"
            return try backend.changeOutcome(
                try await backend.call(.DELETE, url, changes: 1, successBody: false), .DELETE, url)
        }
    }

    func read(_ backend: FCMHTTPBackend, token: String) async throws -> RegistrationStatus {
        try await backend.listTopics(token)
    }
}

/// The Instance ID API (deprecated by Google): batches of up to 1000 tokens, and `iid/info` reads.
struct IIDTopicAPI: TopicAPI {
    var transport: TopicTransport { .iid }
    var requests: TopicTransport.Requests { .perOperation }
    func base(_ endpoints: FCMEndpoints) -> String { endpoints.iid }
    var setting: String { "iid_url or TIDEMARK_IID_URL" }
    func journalStep(_ options: FCMHTTPBackend.Options) -> Int? { nil }

    func subscribe(_ backend: FCMHTTPBackend, topic: String, tokens: [String]) async throws -> [TokenOutcome] {
        try await backend.batch("v1:batchAdd", topic: topic, tokens: tokens)
    }

    func unsubscribe(_ backend: FCMHTTPBackend, topic: String, tokens: [String]) async throws -> [TokenOutcome] {
        try await backend.batch("v1:batchRemove", topic: topic, tokens: tokens)
    }

    func read(_ backend: FCMHTTPBackend, token: String) async throws -> RegistrationStatus {
        try await backend.infoTopics(token)
    }
}

/// Topic subscriptions and refresh, through the configured topic API.
extension FCMHTTPBackend {
    /// The URL of `token`'s topic subscriptions on FCM v1 (`…/registrations/TOKEN/topicSubscriptions`).
    public func registrationsURL(_ token: String) -> String {
        "\(endpoints.fcm)/v1/projects/\(Self.encode(project))/registrations/\(Self.encode(token))/topicSubscriptions"
    }

    /// The outcome for one token of a v1 change FCM answered with `answer`.
    ///
    /// Only a JSON google.rpc.Status that `options.unregistered` names marks the token dead; the 2001st
    /// topic (FAILED_PRECONDITION or TOO_MANY_TOPICS) and an invalid token fail that token and the run
    /// goes on; what retries could not fix (429, 5xx) fails it as retryable; anything else (an HTML
    /// page, a body of another shape, an undocumented status) throws and stops the command.
    public func changeOutcome(
        _ answer: Answer, _ method: HTTPMethod, _ url: String, success: Set<Int> = [200]
    ) throws
        -> TokenOutcome
    {
        if success.contains(answer.status) { return .ok }
        guard let status = answer.rpcStatus else {
            throw unexpected(answer, method, url, "A subscription change was not answered by FCM")
        }
        let codes = [status.fcmErrorCode, status.status].compactMap { $0 }
        if codes.contains(where: options.unregistered.v1.contains) { return .failed(.notFound) }
        if codes.contains("ALREADY_EXISTS"), success.contains(409) { return .ok }
        if codes.contains("TOO_MANY_TOPICS") || codes.contains("FAILED_PRECONDITION") { return .failed(.tooManyTopics) }
        if codes.contains("INVALID_ARGUMENT"), answer.status == 400 { return .failed(.invalidArgument) }
        if RetryPolicy.isRetryable(status: answer.status) {
            // What the client's retries could not fix: the executor may try these tokens again.
            let error = TokenError(status.status)
            return .failed(
                error.isRetryable ? error : TokenError(answer.status == 429 ? .resourceExhausted : .unavailable))
        }
        throw unexpected(answer, method, url, "FCM refused a subscription change (\(status.status))")
    }

    /// Subscribes `tokens` to `topic` over the configured topic API; one outcome per token, in order.
    public func subscribe(topic: String, tokens: [String]) async throws -> [TokenOutcome] {
        try await topicAPI.subscribe(self, topic: topic, tokens: tokens)
    }

    /// Unsubscribes `tokens` from `topic` over the configured topic API; one outcome per token, in order.
    public func unsubscribe(topic: String, tokens: [String]) async throws -> [TokenOutcome] {
        try await topicAPI.unsubscribe(self, topic: topic, tokens: tokens)
    }

    /// One IID batch call. Per-token results come back in order: the codes `options.unregistered`
    /// names mark a token dead, other documented codes fail that token; a whole-request failure that
    /// retries could not fix (429, 5xx) fails every token as retryable; anything else stops the command.
    public func batch(_ operation: String, topic: String, tokens: [String]) async throws -> [TokenOutcome] {
        let body = FCMWire.encode(FCMWire.IIDBatchRequest(topic: topic, tokens: tokens))
        let url = "\(endpoints.iid)/iid/\(operation)"
        let answer = try await call(.POST, url, body: body, changes: tokens.count, iidHeaders: true)
        let what = "IID \(operation) for topic '\(topic)'"
        guard answer.status == 200 else {
            if RetryPolicy.isRetryable(status: answer.status),
                answer.decode(FCMWire.FlatError.self) != nil || answer.rpcStatus != nil
            {
                let error: TokenError = answer.status == 429 ? .resourceExhausted : .unavailable
                return Array(repeating: .failed(error), count: tokens.count)
            }
            throw unexpected(answer, .POST, url, "\(what) was refused")
        }
        guard let results = answer.decode(FCMWire.IIDBatchResponse.self)?.results, results.count == tokens.count else {
            throw unexpected(answer, .POST, url, "\(what) answered without one result per token")
        }
        return try results.map { result in
            guard let code = result.error else { return .ok }
            if options.unregistered.iid.contains(code) { return .failed(.notFound) }
            guard UnregisteredAnswers.documentedIIDCodes.contains(code) else {
                throw FCMCallError(
                    status: 200,
                    message:
                        "\(what) answered the per-token error '\(QuotedAnswer.safe(code))', which FCM does not document; nothing was concluded from it. If FCM has a new code, report it."
                )
            }
            return .failed(TokenError(code))
        }
    }

    /// One read per registration; a read that fails is an error, never "no subscriptions".
    public func refresh(_ tokens: [String]) async throws -> [RegistrationStatus] {
        let api = topicAPI
        return try await forEachConcurrently(tokens.count) { i in try await api.read(self, token: tokens[i]) }
    }

    /// Lists a registration's topics. Dead only on a JSON status `options.unregistered` names; any
    /// other failure, or a 200 that is not a list, stops the command: a read that fails is never "no
    /// subscriptions" and never "dead".
    public func listTopics(_ token: String) async throws -> RegistrationStatus {
        var topics: [String] = []
        var pageToken: String?
        let what = "Listing the topics of \(Redaction.redact(token))"
        repeat {
            var url = registrationsURL(token) + "?pageSize=2000"
            if let pageToken { url += "&pageToken=\(Self.encode(pageToken))" }
            try await options.readLimiter?.acquire()
            let answer = try await call(.GET, url)
            guard answer.status == 200 else {
                if let status = answer.rpcStatus,
                    [status.fcmErrorCode, status.status].compactMap({ $0 }).contains(
                        where: options.unregistered.v1.contains)
                {
                    return .notFound
                }
                throw unexpected(answer, .GET, url, "\(what) failed")
            }
            guard let page = answer.decode(FCMWire.TopicSubscriptionPage.self) else {
                throw unexpected(answer, .GET, url, "\(what) answered without a list of topic subscriptions")
            }
            topics += page.topicSubscriptions.map(\.topicName)
            pageToken = page.nextPageToken
        } while pageToken != nil
        return .active(topics: topics.sorted())
    }

    /// Reads a registration from `iid/info`: dead only on a 404 with a JSON body (FCM's answer for an
    /// unknown instance); anything else that is not an instance's info stops the command.
    public func infoTopics(_ token: String) async throws -> RegistrationStatus {
        let url = "\(endpoints.iid)/iid/info/\(Self.encode(token))?details=true"
        try await options.readLimiter?.acquire()
        let answer = try await call(.GET, url, iidHeaders: true)
        let what = "Reading \(Redaction.redact(token)) from iid/info"
        guard answer.status == 200 else {
            if answer.status == 404, answer.decode(FCMWire.FlatError.self) != nil || answer.rpcStatus != nil {
                return .notFound
            }
            throw unexpected(answer, .GET, url, "\(what) failed")
        }
        guard let info = answer.decode(FCMWire.IIDInfo.self), info.describesAnInstance else {
            throw unexpected(answer, .GET, url, "\(what) answered with a body that is not an instance's info")
        }
        return .active(topics: (info.rel?.topics.keys).map { $0.sorted() } ?? [])
    }
}
