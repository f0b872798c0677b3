import CryptoExtras
import Foundation

/// The claims tidemark reads and writes in an RS256 JWT: an OAuth2 JWT-bearer assertion (reference §4.2).
public struct JWTClaims: Codable, Sendable, Equatable {
    /// The issuer: the service account's email.
    public var iss: String
    /// The subject, when it is not the issuer.
    public var sub: String?
    /// The audience: the token endpoint the assertion is for.
    public var aud: String
    /// The OAuth2 scopes asked for, space-separated.
    public var scope: String?
    /// Issued at (seconds since 1970).
    public var iat: Int
    /// Expires at (seconds since 1970); Google accepts at most an hour after `iat`.
    public var exp: Int

    /// Claims for an assertion.
    public init(iss: String, sub: String? = nil, aud: String, scope: String?, iat: Int, exp: Int) {
        self.iss = iss
        self.sub = sub
        self.aud = aud
        self.scope = scope
        self.iat = iat
        self.exp = exp
    }
}

/// The header of a JWT.
public struct JWTHeader: Codable, Sendable, Equatable {
    /// The signing algorithm; tidemark signs and accepts only RS256.
    public var alg: String
    /// The token type ("JWT").
    public var typ: String?
    /// The id of the key that signed it (the service account's `private_key_id`).
    public var kid: String?

    /// A header for a token signed by key `kid`.
    public init(alg: String = "RS256", typ: String? = "JWT", kid: String?) {
        self.alg = alg
        self.typ = typ
        self.kid = kid
    }
}

/// A compact-serialised JWT, split and decoded but not yet verified.
public struct JWT: Sendable {
    /// The decoded header.
    public var header: JWTHeader
    /// The decoded claims.
    public var claims: JWTClaims
    let signingInput: String
    let signature: Data

    /// Splits and decodes `compact`; checks nothing about the signature.
    public init(parsing compact: some StringProtocol) throws {
        let parts = compact.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, let headerData = Base64URL.decode(parts[0]),
            let claimsData = Base64URL.decode(parts[1]),
            let signature = Base64URL.decode(parts[2])
        else { throw AuthError(.malformedJWT, "the assertion is not a compact JWT (three base64url parts)") }
        do {
            header = try JSONDecoder().decode(JWTHeader.self, from: headerData)
            claims = try JSONDecoder().decode(JWTClaims.self, from: claimsData)
        } catch {
            throw AuthError(
                .malformedJWT, "the assertion's header or claims are not the expected JSON (iss, aud, iat, exp)")
        }
        signingInput = "\(parts[0]).\(parts[1])"
        self.signature = signature
    }

    /// Signs `claims` with RS256 (RSASSA-PKCS1-v1_5 over SHA-256).
    public static func sign(_ claims: JWTClaims, keyID: String?, with key: _RSA.Signing.PrivateKey) throws -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        let header = Base64URL.encode(try encoder.encode(JWTHeader(kid: keyID)))
        let body = Base64URL.encode(try encoder.encode(claims))
        let input = "\(header).\(body)"
        let signature = try key.signature(for: Data(input.utf8), padding: .insecurePKCS1v1_5)
        return "\(input).\(Base64URL.encode(signature.rawRepresentation))"
    }

    /// Whether the signature is a valid RS256 signature by `key`.
    public func isSigned(by key: _RSA.Signing.PublicKey) -> Bool {
        guard header.alg == "RS256" else { return false }
        return key.isValidSignature(
            _RSA.Signing.RSASignature(rawRepresentation: signature), for: Data(signingInput.utf8),
            padding: .insecurePKCS1v1_5)
    }

    /// Checks the time claims against `now` with `leeway` seconds of clock skew, as Google does.
    public func checkTimes(now: Date, leeway: Int = 60, maxLifetime: Int = 3600) throws {
        let t = Int(now.timeIntervalSince1970)
        let (lifetime, overflow) = claims.exp.subtractingReportingOverflow(claims.iat)
        guard claims.exp > claims.iat, !overflow, lifetime <= maxLifetime else {
            throw AuthError(.invalidClaims, "Invalid JWT: exp must be after iat and at most \(maxLifetime) s later.")
        }
        guard claims.iat <= t &+ leeway else {
            throw AuthError(
                .invalidClaims,
                "Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe. Check your iat and exp values in the JWT claim."
            )
        }
        guard claims.exp > t &- leeway else {
            throw AuthError(
                .expired,
                "Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe. Check your iat and exp values in the JWT claim."
            )
        }
    }
}
