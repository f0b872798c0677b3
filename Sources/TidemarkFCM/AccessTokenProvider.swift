import AsyncHTTPClient
import Foundation
import NIOCore
import NIOFoundationCompat
import TidemarkAuth
import TidemarkCore

/// A problem with credentials, in one line that says what to fix. Never contains a credential.
public struct CredentialError: RetryableError, Sendable, Equatable, CustomStringConvertible {
    public var message: String
    public var isRetryable: Bool { false }

    public init(_ message: String) { self.message = message }

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

/// OAuth2 access tokens for a service account: an RS256 JWT-bearer assertion exchanged at the
/// key's `token_uri` (reference §4), cached and refreshed a minute before it expires.
///
/// The caller owns the `HTTPClient`. Tokens never appear in errors or logs.
public actor AccessTokenProvider {
    public static let scope = "https://www.googleapis.com/auth/firebase.messaging"

    private let key: ServiceAccountKey
    private let client: HTTPClient
    private let timing: Timing
    private let policy: RetryPolicy
    private var cached: (token: String, expires: Date)?
    private var inFlight: Task<(String, Date), any Error>?

    /// `policy` retries the token endpoint's 5xx, 429 and network failures, as for FCM's own calls.
    public init(key: ServiceAccountKey, client: HTTPClient, timing: Timing = .live, policy: RetryPolicy = RetryPolicy())
    {
        self.key = key
        self.client = client
        self.timing = timing
        self.policy = policy
    }

    /// A valid access token, fetching a new one when the cached one is within a minute of expiring.
    public func token() async throws -> String {
        if let cached, cached.expires.timeIntervalSince(timing.wallClock()) > 60 { return cached.token }
        if let inFlight { return try await inFlight.value.0 }
        let task = Task { try await self.fetchRetrying() }
        inFlight = task
        defer { inFlight = nil }
        let (token, expires) = try await task.value
        cached = (token, expires)
        return token
    }

    /// Forgets the cached token (after a 401, say), so the next call fetches a new one.
    public func invalidate() { cached = nil }

    /// A failure of the token endpoint that trying again may fix.
    private struct Transient: Error {
        var failure: RetryPolicy.Failure
        var message: String
    }

    /// Fetches under the retry policy: only a refusal of the key itself (`invalid_grant` and other 4xx)
    /// is final at once.
    private func fetchRetrying() async throws -> (String, Date) {
        let started = timing.now()
        var attempt = 0
        while true {
            attempt += 1
            do {
                return try await fetch()
            } catch let transient as Transient {
                switch policy.decide(
                    transient.failure, attempt: attempt, elapsed: timing.now() - started, timing: timing)
                {
                case .retry(let delay): try await timing.sleep(delay)
                case .giveUp(let reason): throw CredentialError("\(transient.message) (\(reason)).")
                }
            }
        }
    }

    private func fetch() async throws -> (String, Date) {
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
        let response: HTTPClientResponse
        do {
            response = try await client.execute(request, timeout: .seconds(30))
        } catch {
            throw Transient(
                failure: .network,
                message: "Could not reach the token endpoint \(key.tokenURI) of \(key.clientEmail): \(error)")
        }
        let body = try await response.body.collect(upTo: 1 << 20)
        let data = Data(buffer: body)
        let status = Int(response.status.code)
        if RetryPolicy.isRetryable(status: status) {
            throw Transient(
                failure: .status(
                    status,
                    retryAfter: response.headers.first(name: "Retry-After")
                        .flatMap { RetryPolicy.parseRetryAfter($0, now: timing.wallClock()) }),
                message:
                    "The token endpoint \(key.tokenURI) answered HTTP \(status) for \(key.clientEmail); it is Google's side (or a proxy's), not the key"
            )
        }
        guard response.status == .ok, let granted = FCMWire.decode(FCMWire.AccessToken.self, from: data) else {
            let refusal = FCMWire.decode(FCMWire.OAuthError.self, from: data)
            let code = refusal?.error ?? "HTTP \(response.status.code)"
            let detail = refusal?.errorDescription ?? ""
            let hint =
                code == "invalid_grant"
                ? "the key may be revoked or deleted, or this machine's clock is off; create a new key for \(key.clientEmail)"
                : "check the key file and the token_uri \(key.tokenURI)"
            throw CredentialError(
                "The token endpoint refused \(key.clientEmail): \(code)\(detail.isEmpty ? "" : " (\(detail))"); \(hint)."
            )
        }
        return (granted.accessToken, issuedAt.addingTimeInterval(TimeInterval(granted.expiresIn ?? 3599)))
    }
}
