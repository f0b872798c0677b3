import AsyncHTTPClient
import Foundation
import NIOCore
import NIOFoundationCompat
import NIOHTTP1
import TidemarkCore

/// Which API carries topic subscriptions (design §1).
public enum TopicTransport: String, Sendable, CaseIterable {
    /// The FCM topic subscription API: one request per membership change.
    case v1
    /// The deprecated Instance ID batch API: up to 1000 tokens a request.
    case iid
}

/// Where FCM's surfaces live: Google's hosts, or the emulator's one address for all of them.
public struct FCMEndpoints: Sendable, Equatable {
    public var fcm: String
    public var iid: String

    public static let google = FCMEndpoints(fcm: "https://fcm.googleapis.com", iid: "https://iid.googleapis.com")

    /// The emulator at `host` (`FCM_EMULATOR_HOST`, e.g. `127.0.0.1:9099`).
    public static func emulator(host: String) -> FCMEndpoints {
        let base = host.hasPrefix("http") ? host : "http://\(host)"
        return FCMEndpoints(fcm: base, iid: base)
    }

    public init(fcm: String, iid: String) {
        self.fcm = fcm
        self.iid = iid
    }
}

/// A failure of an FCM call that retries could not fix, with what FCM answered. No credentials inside.
public struct FCMCallError: Error, Sendable, CustomStringConvertible {
    public var status: Int
    public var message: String
    public var description: String { message }
}

/// The `emulator` and `fcm` backends: tidemark's HTTP client for FCM (reference §1, §2, §8).
///
/// The caller owns the `HTTPClient`. Every call takes an access token from the provider, waits
/// for the rate limiter, and retries per the shared `RetryPolicy`.
public struct FCMHTTPBackend: Backend {
    public let identity: BackendIdentity
    let project: String
    let endpoints: FCMEndpoints
    let transport: TopicTransport
    let client: HTTPClient
    let credentials: AccessTokenProvider
    let limiter: RateLimiter?
    let policy: RetryPolicy
    /// Concurrent requests for per-token work (v1 changes, refresh).
    let concurrency: Int

    public init(kind: String, project: String, endpoints: FCMEndpoints, transport: TopicTransport, client: HTTPClient,
        credentials: AccessTokenProvider, limiter: RateLimiter?, policy: RetryPolicy = RetryPolicy(),
        concurrency: Int = 64)
    {
        identity = BackendIdentity(kind: kind, project: project)
        self.project = project
        self.endpoints = endpoints
        self.transport = transport
        self.client = client
        self.credentials = credentials
        self.limiter = limiter
        self.policy = policy
        self.concurrency = max(1, concurrency)
    }

    struct Answer {
        var status: Int
        var json: [String: Any]
        /// google.rpc.Status `status`, FcmError `errorCode`, or a flat `error` string.
        var code: String? {
            if let flat = json["error"] as? String { return flat }
            guard let error = json["error"] as? [String: Any] else { return nil }
            if let details = error["details"] as? [[String: Any]],
                let fcm = details.first(where: { ($0["@type"] as? String)?.hasSuffix("FcmError") == true }),
                let code = fcm["errorCode"] as? String
            {
                return code
            }
            return error["status"] as? String
        }
    }

    /// One call with auth, rate limiting (`cost` permits) and retries of retryable statuses and network errors.
    func call(_ method: HTTPMethod, _ url: String, body: Data? = nil, cost: Double = 0, iidHeaders: Bool = false)
        async throws -> Answer
    {
        var random = SystemRandomNumberGenerator()
        let started = ContinuousClock.now
        var attempt = 0
        while true {
            attempt += 1
            if cost > 0, let limiter { try await limiter.acquire(cost) }
            var request = HTTPClientRequest(url: url)
            request.method = method
            request.headers.add(name: "Authorization", value: "Bearer \(try await credentials.token())")
            if iidHeaders {
                request.headers.add(name: "access_token_auth", value: "true")
                request.headers.add(name: "project_id", value: project)
            }
            if let body {
                request.headers.add(name: "Content-Type", value: "application/json")
                request.body = .bytes(ByteBuffer(data: body))
            }
            let failure: RetryPolicy.Failure
            // The last answer of a retryable status: what the caller gets once retries stop.
            var unresolved: Answer?
            do {
                let response = try await client.execute(request, timeout: .seconds(60))
                let bytes = try await response.body.collect(upTo: 16 << 20)
                let json = (try? JSONSerialization.jsonObject(with: Data(buffer: bytes))) as? [String: Any] ?? [:]
                let status = Int(response.status.code)
                if status == 401, attempt == 1 {
                    await credentials.invalidate()
                    continue
                }
                guard RetryPolicy.isRetryable(status: status) else { return Answer(status: status, json: json) }
                failure = .status(status, retryAfter: response.headers.first(name: "Retry-After")
                    .flatMap { RetryPolicy.parseRetryAfter($0, now: Date()) })
                unresolved = Answer(status: status, json: json)
            } catch is CancellationError {
                throw CancellationError()
            } catch let error as CredentialError {
                throw error
            } catch {
                failure = .network
            }
            switch policy.decide(failure, attempt: attempt, elapsed: ContinuousClock.now - started, using: &random) {
            case .retry(let delay): try await Task.sleep(for: delay)
            case .giveUp(let reason):
                if let unresolved { return unresolved }
                throw FCMCallError(status: 0, message: "\(method) \(Self.redact(url)) failed: \(reason).")
            }
        }
    }

    static func encode(_ segment: String) -> String {
        segment.addingPercentEncoding(withAllowedCharacters: .alphanumerics.union(CharacterSet(charactersIn: "-_.~")))
            ?? segment
    }

    /// URLs carry registration tokens; errors show them redacted.
    static func redact(_ url: String) -> String {
        url.split(separator: "/").map { part in
            part.count > 40 ? Substring(Redaction.redact(String(part.prefix { $0 != "?" }))) : part
        }.joined(separator: "/")
    }

    /// Runs `work` for every index with at most `concurrency` in flight; results in input order.
    func forEachConcurrently<T: Sendable>(_ count: Int, _ work: @escaping @Sendable (Int) async throws -> T)
        async throws -> [T]
    {
        var results = [T?](repeating: nil, count: count)
        try await withThrowingTaskGroup(of: (Int, T).self) { group in
            var next = 0
            while next < min(concurrency, count) {
                let i = next
                group.addTask { (i, try await work(i)) }
                next += 1
            }
            while let (i, value) = try await group.next() {
                results[i] = value
                if next < count {
                    let j = next
                    group.addTask { (j, try await work(j)) }
                    next += 1
                }
            }
        }
        return results.map { $0! }
    }
}
