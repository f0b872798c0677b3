import CryptoExtras
import Foundation
import Synchronization
import TidemarkAuth
import TidemarkCore

/// The emulator's OAuth2 side: the service-account keys it trusts, and the access tokens it issued.
///
/// Like Google's token endpoint it takes an RS256 JWT-bearer assertion, checks the signature
/// against a known key and the time claims, and ignores `aud` (client libraries disagree on it,
/// reference §4.2). Access tokens are opaque, bound to the key's project, and expire.
public final class AccessTokenAuthority: Sendable {
    /// What an access token stands for: whose it is, for which project and scopes, until when.
    public struct Grant: Sendable, Equatable {
        /// The FCM project the key belongs to.
        public var project: String
        /// The service account's email (`client_email`).
        public var clientEmail: String
        /// The OAuth scopes granted.
        public var scopes: [String]
        /// When the token stops being accepted.
        public var expires: Date
    }

    struct TrustedKey {
        var project: String
        var clientEmail: String
        var keyID: String
        var publicKey: _RSA.Signing.PublicKey
    }

    struct State {
        var keys: [TrustedKey] = []
        var tokens: [String: Grant] = [:]
        var lifetime: TimeInterval = 3599
        var issuedSincePurge = 0
    }

    /// The scopes that allow FCM calls, as Google's token endpoint grants them.
    public static let acceptedScopes = [
        "https://www.googleapis.com/auth/firebase.messaging", "https://www.googleapis.com/auth/cloud-platform",
    ]

    private let state = Mutex(State())
    private let timing: Timing

    /// `timing` is the clock for token lifetimes and the source of the tokens' random bytes.
    public init(timing: Timing = .live) { self.timing = timing }

    /// Trusts the public half of `key` for its project.
    public func trust(_ key: ServiceAccountKey) throws {
        try trust(
            publicKeyPEM: try key.publicKeyPEM(), clientEmail: key.clientEmail, keyID: key.privateKeyID,
            project: key.projectID)
    }

    /// Trusts a public key (PEM, SubjectPublicKeyInfo or PKCS#1) for `project`.
    public func trust(publicKeyPEM: String, clientEmail: String, keyID: String, project: String) throws {
        let publicKey: _RSA.Signing.PublicKey
        do {
            publicKey = try _RSA.Signing.PublicKey(pemRepresentation: publicKeyPEM)
        } catch {
            throw AuthError(.malformedKey, "public_key is not an RSA public key in PEM form")
        }
        state.withLock { state in
            state.keys.removeAll { $0.clientEmail == clientEmail && $0.keyID == keyID }
            state.keys.append(
                TrustedKey(project: project, clientEmail: clientEmail, keyID: keyID, publicKey: publicKey))
        }
    }

    /// The projects with at least one trusted key.
    public var projects: Set<String> { state.withLock { Set($0.keys.map(\.project)) } }

    /// Seconds an issued access token lives (Google: 3599).
    public var tokenLifetime: TimeInterval {
        get { state.withLock { $0.lifetime } }
        set { state.withLock { $0.lifetime = newValue } }
    }

    /// Verifies a signed JWT against the trusted keys; returns it parsed, with the key it was signed with.
    func verify(_ compact: String) throws -> (key: TrustedKey, jwt: JWT) {
        let jwt = try JWT(parsing: compact)
        guard jwt.header.alg == "RS256" else {
            throw AuthError(
                .unsupportedAlgorithm, "Invalid JWT: the signing algorithm must be RS256, not \(jwt.header.alg).")
        }
        // Google finds the key by its id: a JWT without one is refused, however well it is signed.
        guard let kid = jwt.header.kid, !kid.isEmpty else {
            throw AuthError(
                .unknownKey,
                "Invalid JWT Signature: the header names no key id (kid); sign with the private_key_id of the key file."
            )
        }
        let candidates = state.withLock { state in
            state.keys.filter { $0.clientEmail == jwt.claims.iss && $0.keyID == kid }
        }
        guard !candidates.isEmpty else {
            throw AuthError(
                .unknownKey,
                "Invalid JWT Signature: no key is registered for \(jwt.claims.iss) with key id \(jwt.header.kid ?? "(none)")."
            )
        }
        guard let key = candidates.first(where: { jwt.isSigned(by: $0.publicKey) }) else {
            throw AuthError(.badSignature, "Invalid JWT Signature.")
        }
        try jwt.checkTimes(now: timing.wallClock())
        return (key, jwt)
    }

    /// The JWT-bearer grant: an assertion in, an access token out.
    public func exchange(assertion: String) throws -> (token: String, grant: Grant) {
        let (key, jwt) = try verify(assertion)
        // The assertion is for a token endpoint (the key's token_uri: Google's, or the emulator's, also
        // when a test reaches it through a proxy path).
        guard let aud = URL(string: jwt.claims.aud), ["http", "https"].contains(aud.scheme ?? ""),
            aud.path.hasSuffix("/token")
        else {
            throw AuthError(
                .invalidClaims,
                "Invalid JWT: the audience '\(QuotedAnswer.safe(jwt.claims.aud))' is not a token endpoint; use the key file's token_uri."
            )
        }
        let scopes = (jwt.claims.scope ?? "").split(separator: " ").map(String.init)
        guard !scopes.isEmpty else {
            throw AuthError(
                .invalidClaims, "Invalid JWT: the claim set has no scope; ask for \(Self.acceptedScopes[0]).")
        }
        return issue { at, lifetime in
            Grant(
                project: key.project, clientEmail: key.clientEmail, scopes: scopes,
                expires: at.addingTimeInterval(lifetime))
        }
    }

    /// A new opaque access token for the grant `make` builds (from the issue time and the lifetime),
    /// remembered until it expires; every thousandth issue forgets the expired ones.
    private func issue(_ make: (Date, TimeInterval) -> Grant) -> (token: String, grant: Grant) {
        var random = timing.generator
        var bytes = [UInt8](repeating: 0, count: 48)
        for i in bytes.indices { bytes[i] = UInt8.random(in: 0...255, using: &random) }
        let token = "ya29.emu." + Base64URL.encode(bytes)
        let issuedAt = timing.wallClock()
        return state.withLock { state in
            let grant = make(issuedAt, state.lifetime)
            state.tokens[token] = grant
            state.issuedSincePurge += 1
            if state.issuedSincePurge >= 1000 {
                state.tokens = state.tokens.filter { $0.value.expires > issuedAt }
                state.issuedSincePurge = 0
            }
            return (token, grant)
        }
    }

    /// Workload identity federation, as Google's Security Token Service does it (RFC 8693): an OIDC
    /// token from a CI system for a federated access token. The emulator does not know the CI's
    /// signing keys, so it checks what it can: the token is a JWT, not expired, issued for the
    /// provider (`aud` is the provider's https URL, the default allowed audience), with a subject.
    public func federate(
        subjectToken: String, audience: String, scopes: [String]
    ) throws -> (
        token: String, grant: Grant
    ) {
        let provider =
            /^\/\/iam\.googleapis\.com\/projects\/[^\/]+\/locations\/[^\/]+\/workloadIdentityPools\/([^\/]+)\/providers\/[^\/]+$/
        guard audience.wholeMatch(of: provider) != nil else {
            throw AuthError(.invalidClaims, "The audience \(audience) is not a workload identity pool provider.")
        }
        let parts = subjectToken.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, let payload = Base64URL.decode(parts[1]),
            let claims = try? JSONSerialization.jsonObject(with: payload) as? [String: Any]
        else {
            throw AuthError(.malformedJWT, "The subject token is not a JWT.")
        }
        let audiences = (claims["aud"] as? [String]) ?? (claims["aud"] as? String).map { [$0] } ?? []
        guard audiences.contains("https:" + audience) else {
            throw AuthError(
                .invalidClaims,
                "The audience in the subject token (\(audiences.joined(separator: ", "))) does not match the expected audience https:\(audience)."
            )
        }
        if let exp = claims["exp"] as? Double, Date(timeIntervalSince1970: exp) <= timing.wallClock() {
            throw AuthError(.expired, "The subject token has expired.")
        }
        guard let subject = claims["sub"] as? String, !subject.isEmpty else {
            throw AuthError(.invalidClaims, "The subject token has no sub claim.")
        }
        // The federated principal may act on the project the emulator serves.
        let project = state.withLock { $0.keys.first?.project } ?? ""
        return issue { at, lifetime in
            Grant(
                project: project,
                clientEmail: "principal://iam.googleapis.com/\(audience.dropFirst(2))/subject/\(subject)",
                scopes: scopes, expires: at.addingTimeInterval(lifetime))
        }
    }

    /// IAM credentials' generateAccessToken: a caller holding a valid (federated) token acts as a
    /// service account whose key the emulator trusts.
    public func impersonate(
        bearer: String, serviceAccount email: String, scopes: [String]
    ) throws -> (
        token: String, grant: Grant
    ) {
        let at = timing.wallClock()
        guard let caller = state.withLock({ $0.tokens[bearer] }), caller.expires > at else {
            throw AuthError(.badSignature, "Request had invalid authentication credentials.")
        }
        guard caller.scopes.contains("https://www.googleapis.com/auth/cloud-platform") else {
            throw AuthError(.invalidClaims, "Request had insufficient authentication scopes.")
        }
        guard let key = state.withLock({ $0.keys.first { $0.clientEmail == email } }) else {
            throw AuthError(.unknownKey, "Not found; Gaia id not found for email \(email)")
        }
        return issue { at, lifetime in
            Grant(
                project: key.project, clientEmail: key.clientEmail, scopes: scopes,
                expires: at.addingTimeInterval(lifetime))
        }
    }

    /// The metadata server's token: for the machine's default service account (the first trusted key).
    public func metadataToken(scopes: [String]) throws -> (token: String, grant: Grant) {
        guard let key = state.withLock({ $0.keys.first }) else {
            throw AuthError(.unknownKey, "No service account is attached to this instance.")
        }
        return issue { at, lifetime in
            Grant(
                project: key.project, clientEmail: key.clientEmail, scopes: scopes,
                expires: at.addingTimeInterval(lifetime))
        }
    }

    /// What checking a bearer token found.
    public enum Verdict: Sendable, Equatable {
        case granted(Grant)
        case invalid
        case expired
        case insufficientScopes
    }

    /// The audiences a self-signed JWT may name to stand for an access token to the APIs the emulator
    /// serves (Google's rule for self-signed JWTs: the API's service endpoint).
    public static let apiAudiences: Set<String> = [
        "https://fcm.googleapis.com/", "https://fcm.googleapis.com", "https://iid.googleapis.com/",
        "https://iid.googleapis.com", "https://fcm.googleapis.com/google.firebase.fcm.v1.FirebaseMessagingService",
    ]

    /// Checks a bearer credential: an access token this authority issued, or a self-signed JWT (reference §4.3).
    ///
    /// A self-signed JWT is honoured as Google honours one: its `aud` must be the API (not the token
    /// endpoint: an assertion made for the exchange is not an access token, and is refused), and when
    /// it carries a `scope` claim, that must include the messaging or cloud-platform scope.
    public func authenticate(bearer: String) -> Verdict {
        let at = timing.wallClock()
        if let grant = state.withLock({ $0.tokens[bearer] }) {
            guard grant.expires > at else { return .expired }
            return Self.hasScope(grant.scopes) ? .granted(grant) : .insufficientScopes
        }
        guard bearer.split(separator: ".").count == 3, let (key, jwt) = try? verify(bearer) else { return .invalid }
        guard Self.apiAudiences.contains(jwt.claims.aud) else { return .invalid }
        let scopes = (jwt.claims.scope ?? "").split(separator: " ").map(String.init)
        if !scopes.isEmpty, !Self.hasScope(scopes) { return .insufficientScopes }
        return .granted(
            Grant(
                project: key.project, clientEmail: key.clientEmail,
                scopes: scopes.isEmpty ? Self.acceptedScopes : scopes,
                expires: Date(timeIntervalSince1970: Double(jwt.claims.exp))))
    }

    static func hasScope(_ scopes: [String]) -> Bool { scopes.contains { acceptedScopes.contains($0) } }

    /// Forgets every issued access token (admin reset); trusted keys stay.
    public func revokeAll() { state.withLock { $0.tokens.removeAll() } }
}
