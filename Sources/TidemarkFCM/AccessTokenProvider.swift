import AsyncHTTPClient
import Foundation
import NIOCore
import NIOFoundationCompat
import TidemarkAuth
import TidemarkCore

/// A problem with credentials, in one line that says what to fix. Never contains a credential.
public struct CredentialError: RetryableError, TidemarkError, Equatable {
    /// `credentials`.
    public var reason: FailureReason { "credentials" }

    /// What to fix, in one line.
    public var message: String
    /// Never retried: the credentials must change first.
    public var isRetryable: Bool { false }

    /// An error saying `message`.
    public init(_ message: String) { self.message = message }

    /// The message.
    public var description: String { message }
}

extension ServiceAccountKey {
    /// Reads a key file (`GOOGLE_APPLICATION_CREDENTIALS`), with a clear message for each way it can be wrong.
    public static func load(path: String) throws -> ServiceAccountKey {
        guard let data = FileManager.default.contents(atPath: path) else {
            throw CredentialError(
                "The service-account key file \(path) does not exist or cannot be read; set GOOGLE_APPLICATION_CREDENTIALS to the JSON key you downloaded from the Google Cloud console."
            )
        }
        let key: ServiceAccountKey
        do {
            key = try JSONDecoder().decode(ServiceAccountKey.self, from: data)
        } catch DecodingError.keyNotFound(let missing, _) {
            throw CredentialError(
                "The key file \(path) has no \"\(missing.stringValue)\"; download a new JSON key for the service account."
            )
        } catch {
            throw CredentialError(
                "The key file \(path) is not a service-account JSON key; download a new JSON key for the service account."
            )
        }
        guard key.type == "service_account" else {
            throw CredentialError(
                "The key file \(path) is of type \"\(key.type)\"; tidemark needs a service_account key.")
        }
        do {
            _ = try key.signingKey()
        } catch {
            throw CredentialError(
                "The private_key in \(path) is not an RSA private key in PEM form; download a new JSON key.")
        }
        return key
    }
}

/// OAuth2 access tokens for FCM from any of `GoogleCredentials`: a service account's RS256
/// JWT-bearer assertion exchanged at its `token_uri` (reference §4); an external account's subject
/// token exchanged at the Security Token Service, then for a service account's token when the file
/// says to impersonate one; or the metadata server's token. Cached, and fetched again a minute
/// before it expires.
///
/// Requests go through `HTTPRoutes` (so through a proxy when the environment names one). Tokens,
/// subject tokens and keys never appear in errors or logs.
public actor AccessTokenProvider {
    /// The OAuth2 scope FCM's APIs take.
    public static let scope = "https://www.googleapis.com/auth/firebase.messaging"
    static let cloudPlatform = "https://www.googleapis.com/auth/cloud-platform"

    /// Where tokens come from: a key, an external account, the metadata server or the emulator.
    public let credentials: GoogleCredentials
    private let routes: HTTPRoutes
    private let timing: Timing
    private let policy: RetryPolicy
    private let narrator: RetryNarrator?
    private var cached: (token: String, expires: Date)?
    /// Where tokens outlive this provider (the process's other backends), when it shares one.
    private let cache: AccessTokenCache?
    /// Whether a fetch is in flight, and who waits for its answer: callers share one fetch.
    private var fetching = false
    private var waitingForFetch: [CheckedContinuation<Result<String, any Error>, Never>] = []
    /// Whether a token endpoint has answered this run: before that, a connection that says nothing is
    /// there (refused, an unknown host) is reported at once instead of retried for minutes.
    private var answered = false

    /// `policy` retries the token endpoints' 5xx, 429 and network failures, as for FCM's own calls.
    /// Retries that last more than a few seconds are said through `narrator`. With `cache`, a token
    /// another provider of the process fetched for the same credentials is used, and one fetched
    /// here is kept there.
    public init(
        credentials: GoogleCredentials, routes: HTTPRoutes, timing: Timing = .live, policy: RetryPolicy = RetryPolicy(),
        narrator: RetryNarrator? = nil, cache: AccessTokenCache? = nil
    ) {
        self.credentials = credentials
        self.routes = routes
        self.timing = timing
        self.policy = policy
        self.narrator = narrator
        self.cache = cache
    }

    /// A service account's tokens, straight through `client`.
    public init(key: ServiceAccountKey, client: HTTPClient, timing: Timing = .live, policy: RetryPolicy = RetryPolicy())
    {
        self.init(credentials: .serviceAccount(key), routes: HTTPRoutes(direct: client), timing: timing, policy: policy)
    }

    /// A valid access token, fetching a new one when the cached one is within a minute of expiring.
    public func token() async throws -> String {
        while true {
            let margin = timing.wallClock().addingTimeInterval(60)
            if let cached, cached.expires > margin { return cached.token }
            if let shared = cache?.token(for: credentials, validAfter: margin) {
                cached = shared
                return shared.token
            }
            if fetching {
                // The fetch in flight answers for everyone, failure included; only a fetch whose caller
                // was cancelled leaves its waiters to fetch again.
                let answer = await withCheckedContinuation { waitingForFetch.append($0) }
                if case .failure(let error) = answer, error is CancellationError, !Task.isCancelled { continue }
                return try answer.get()
            }
            fetching = true
            let answer: Result<(String, Date), any Error>
            do { answer = .success(try await fetchRetrying()) } catch { answer = .failure(error) }
            fetching = false
            if case .success(let fetched) = answer {
                cached = fetched
                cache?.keep(fetched.0, expires: fetched.1, for: credentials, now: timing.wallClock())
            }
            let waiting = waitingForFetch
            waitingForFetch = []
            for waiter in waiting { waiter.resume(returning: answer.map(\.0)) }
            return try answer.get().0
        }
    }

    /// Forgets the cached token (after a 401, say), here and in the shared cache, so the next call
    /// fetches a new one.
    public func invalidate() {
        if let token = cached?.token { cache?.forget(token, of: credentials) }
        cached = nil
    }

    /// A failure of a token endpoint that trying again may fix.
    private struct Transient: Error {
        var failure: RetryPolicy.Failure
        var message: String
        /// What was called (`the token endpoint of … at URL`), and what went wrong, for a retry's notice.
        var call: String
        var cause: String
    }

    /// Fetches under the retry policy: only a refusal of the credentials themselves (`invalid_grant`
    /// and other 4xx) is final at once.
    private func fetchRetrying() async throws -> (String, Date) {
        let started = timing.now()
        var attempt = 0
        while true {
            attempt += 1
            do {
                let fetched = try await fetch()
                narrator?.answered(attempt: attempt)
                return fetched
            } catch let transient as Transient {
                let elapsed = timing.now() - started
                switch policy.decide(transient.failure, attempt: attempt, elapsed: elapsed, timing: timing) {
                case .retry(let delay):
                    narrator?.retrying(
                        RetryNotice(
                            call: transient.call, cause: transient.cause, attempt: attempt, retryingAfter: delay,
                            elapsed: elapsed, policy: policy, setting: endpointSetting))
                    try await timing.sleep(delay)
                case .giveUp(let reason): throw CredentialError("\(transient.message) (\(reason)).")
                }
            }
        }
    }

    private func fetch() async throws -> (String, Date) {
        switch credentials {
        case .serviceAccount(let key): return try await fetch(key)
        case .externalAccount(let account): return try await fetch(account)
        case .metadataServer(let server): return try await fetch(server)
        }
    }

    /// Sends `request` to a token endpoint; a network failure or a status worth retrying is `Transient`.
    private func send(_ request: HTTPClientRequest, what: String) async throws -> (status: Int, body: Data) {
        let response: HTTPClientResponse
        do {
            response = try await routes.execute(request, timeout: .seconds(30))
        } catch let error as CredentialError {
            throw error
        } catch {
            let network = NetworkFailure.of(error)
            let message =
                "Could not reach \(what.prefix(1).lowercased() + what.dropFirst()) at \(Self.endpoint(request.url)): \(network.words)"
            if network.nothingThere, !answered {
                throw CredentialError("\(message). Nothing there has answered this run; check \(endpointSetting).")
            }
            throw Transient(
                failure: .network, message: message, call: "\(request.method) \(Self.endpoint(request.url))",
                cause: network.words)
        }
        answered = true
        let body = Data(buffer: try await response.body.collect(upTo: 1 << 20))
        let status = Int(response.status.code)
        if RetryPolicy.isRetryable(status: status) {
            throw Transient(
                failure: .status(
                    status,
                    retryAfter: response.headers.first(name: "Retry-After")
                        .flatMap { RetryPolicy.parseRetryAfter($0, now: timing.wallClock()) }),
                message:
                    "\(what) at \(Self.endpoint(request.url)) answered HTTP \(status); it is Google's side (or a proxy's), not \(ownSide)",
                call: "\(request.method) \(Self.endpoint(request.url))", cause: "HTTP \(status)")
        }
        return (status, body)
    }

    /// What chose the token endpoint, for messages.
    private var endpointSetting: String {
        switch credentials {
        case .serviceAccount: "the key file's token_uri (the emulator writes it; FCM_EMULATOR_HOST for the emulator)"
        case .externalAccount: "the credentials file's token_url and credential_source"
        case .metadataServer:
            "that this runs on Google Cloud (GCE_METADATA_HOST), or set GOOGLE_APPLICATION_CREDENTIALS"
        }
    }

    /// What a server failure is not the fault of.
    private var ownSide: String {
        if case .serviceAccount = credentials { return "the key" }
        return "the credentials"
    }

    /// A URL as messages show it: no password, token or query value (`URLRedaction.display`).
    static func endpoint(_ url: String) -> String { URLRedaction.display(url) }

    /// `application/x-www-form-urlencoded`.
    static func form(_ fields: [(String, String)]) -> String {
        var allowed = CharacterSet.alphanumerics
        allowed.insert(charactersIn: "-._~")
        return fields.map { name, value in
            "\(name)=\(value.addingPercentEncoding(withAllowedCharacters: allowed) ?? value)"
        }.joined(separator: "&")
    }

    /// The OAuth2-style refusal in `body`, as "code (description)", safe to print: cut short, and with
    /// `secrets` (what the request carried) and anything shaped like a credential replaced.
    static func refusal(_ body: Data, status: Int, hiding secrets: [String] = []) -> String {
        if let oauth = FCMWire.decode(FCMWire.OAuthError.self, from: body) {
            return QuotedAnswer.safe(
                oauth.error + (oauth.errorDescription.map { " (\($0))" } ?? ""), hiding: secrets)
        }
        if let object = try? JSONSerialization.jsonObject(with: body) as? [String: Any],
            let error = object["error"] as? [String: Any]
        {
            let status = error["status"] as? String ?? "HTTP \(status)"
            return QuotedAnswer.safe(status + ((error["message"] as? String).map { " (\($0))" } ?? ""), hiding: secrets)
        }
        return "HTTP \(status)"
    }

    /// What `url` carries that must not be printed (a password, query values), for hiding it where an
    /// endpoint quotes its request back.
    static func queryValues(_ url: String) -> [String] { URLRedaction.secrets(in: url) }

    // MARK: Service account

    private func fetch(_ key: ServiceAccountKey) async throws -> (String, Date) {
        let issuedAt = timing.wallClock()
        let iat = Int(issuedAt.timeIntervalSince1970)
        let assertion = try JWT.sign(
            JWTClaims(
                iss: key.clientEmail, aud: key.tokenURI, scope: Self.scope, iat: iat,
                exp: iat + 3600), keyID: key.privateKeyID, with: try key.signingKey())
        var request = HTTPClientRequest(url: key.tokenURI)
        request.method = .POST
        request.headers.add(name: "Content-Type", value: "application/x-www-form-urlencoded")
        request.body = .bytes(
            ByteBuffer(
                string:
                    "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion=\(assertion)"))
        let (status, data) = try await send(request, what: "The token endpoint of \(key.clientEmail)")
        guard status == 200, let granted = FCMWire.decode(FCMWire.AccessToken.self, from: data) else {
            let refusal = FCMWire.decode(FCMWire.OAuthError.self, from: data)
            let hidden = [assertion] + Self.queryValues(key.tokenURI)
            let code = refusal.map { QuotedAnswer.safe($0.error, hiding: hidden) } ?? "HTTP \(status)"
            let detail = QuotedAnswer.safe(refusal?.errorDescription ?? "", hiding: hidden)
            let hint =
                code == "invalid_grant"
                ? "the key may be revoked or deleted, or this machine's clock is off; create a new key for \(key.clientEmail)"
                : "check the key file and the token_uri \(Self.endpoint(key.tokenURI))"
            throw CredentialError(
                "The token endpoint refused \(key.clientEmail): \(code)\(detail.isEmpty ? "" : " (\(detail))"); \(hint)."
            )
        }
        return (granted.accessToken, issuedAt.addingTimeInterval(TimeInterval(granted.expiresIn ?? 3599)))
    }

    // MARK: External account (workload identity federation)

    /// The subject token the CI system issued: read from the file, or fetched from the URL.
    private func subjectToken(_ account: ExternalAccount) async throws -> String {
        let source = account.source
        let raw: Data
        let origin: String
        if let file = source.file {
            origin = "the subject token file \(file)"
            guard let data = FileManager.default.contents(atPath: file) else {
                throw CredentialError(
                    "\(origin) (credential_source.file) does not exist or cannot be read; the CI job's OIDC step should write it before tidemark runs."
                )
            }
            raw = data
        } else {
            let url = source.url!
            origin = "the subject token from \(Self.endpoint(url))"
            var request = HTTPClientRequest(url: url)
            for (name, value) in source.headers { request.headers.add(name: name, value: value) }
            let (status, data) = try await send(request, what: "The subject token URL (credential_source.url)")
            guard status == 200 else {
                throw CredentialError(
                    "The subject token URL \(Self.endpoint(url)) (credential_source.url) refused: \(Self.refusal(data, status: status, hiding: Self.queryValues(url) + Array(source.headers.values))); check the CI job's OIDC permission (GitHub: permissions: id-token: write)."
                )
            }
            raw = data
        }
        var token: String?
        if source.format == "json" {
            let object = try? JSONSerialization.jsonObject(with: raw) as? [String: Any]
            token = object?[source.fieldName ?? ""] as? String
            if token == nil {
                throw CredentialError(
                    "\(origin) is not JSON with a string field \"\(source.fieldName ?? "")\" (credential_source.format)."
                )
            }
        } else {
            token = String(decoding: raw, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        }
        guard let token, !token.isEmpty else { throw CredentialError("\(origin) is empty.") }
        return token
    }

    private func fetch(_ account: ExternalAccount) async throws -> (String, Date) {
        let subject = try await subjectToken(account)
        let issuedAt = timing.wallClock()
        var exchange = HTTPClientRequest(url: account.tokenURL)
        exchange.method = .POST
        exchange.headers.add(name: "Content-Type", value: "application/x-www-form-urlencoded")
        exchange.body = .bytes(
            ByteBuffer(
                string: Self.form([
                    ("grant_type", "urn:ietf:params:oauth:grant-type:token-exchange"),
                    ("audience", account.audience),
                    ("scope", account.impersonationURL == nil ? Self.scope : Self.cloudPlatform),
                    ("requested_token_type", "urn:ietf:params:oauth:token-type:access_token"),
                    ("subject_token_type", account.subjectTokenType),
                    ("subject_token", subject),
                ])))
        let (status, data) = try await send(exchange, what: "The Security Token Service")
        guard status == 200, let federated = FCMWire.decode(FCMWire.STSToken.self, from: data) else {
            throw CredentialError(
                "The Security Token Service at \(Self.endpoint(account.tokenURL)) refused the subject token for \(account.audience): \(Self.refusal(data, status: status, hiding: [subject] + Self.queryValues(account.tokenURL))); check the workload identity pool's provider (its issuer, allowed audiences and attribute condition) against the CI's token."
            )
        }
        let federatedExpiry = issuedAt.addingTimeInterval(TimeInterval(federated.expiresIn ?? 3599))
        guard let impersonation = account.impersonationURL else { return (federated.accessToken, federatedExpiry) }
        var generate = HTTPClientRequest(url: impersonation)
        generate.method = .POST
        generate.headers.add(name: "Content-Type", value: "application/json")
        generate.headers.add(name: "Authorization", value: "Bearer \(federated.accessToken)")
        generate.body = .bytes(
            ByteBuffer(data: try JSONEncoder().encode(FCMWire.GenerateAccessTokenRequest(scope: [Self.scope]))))
        let email = account.serviceAccountEmail ?? "the service account"
        let (answer, body) = try await send(generate, what: "IAM credentials (impersonating \(email))")
        guard answer == 200, let generated = FCMWire.decode(FCMWire.GeneratedAccessToken.self, from: body),
            let expires = Self.parseTime(generated.expireTime)
        else {
            throw CredentialError(
                "IAM credentials refused to let the workload identity act as \(email): \(Self.refusal(body, status: answer, hiding: [federated.accessToken, subject])); grant the pool's principal roles/iam.workloadIdentityUser on \(email)."
            )
        }
        return (generated.accessToken, expires)
    }

    /// RFC 3339, with or without fractional seconds.
    static func parseTime(_ text: String) -> Date? {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        if let date = formatter.date(from: text) { return date }
        formatter.formatOptions = [.withInternetDateTime]
        return formatter.date(from: text)
    }

    // MARK: Metadata server

    private func fetch(_ server: MetadataServer) async throws -> (String, Date) {
        let issuedAt = timing.wallClock()
        var request = HTTPClientRequest(url: server.tokenURL)
        request.headers.add(name: "Metadata-Flavor", value: "Google")
        let (status, data) = try await send(request, what: "The metadata server")
        guard status == 200, let granted = FCMWire.decode(FCMWire.AccessToken.self, from: data) else {
            throw CredentialError(
                "The metadata server \(server.host) gave no token: \(Self.refusal(data, status: status)); give the machine a service account with the Firebase Cloud Messaging Admin role, or set GOOGLE_APPLICATION_CREDENTIALS."
            )
        }
        return (granted.accessToken, issuedAt.addingTimeInterval(TimeInterval(granted.expiresIn ?? 3599)))
    }
}
