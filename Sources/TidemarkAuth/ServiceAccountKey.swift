import CryptoExtras
import Foundation
import TidemarkCore

/// A Google service-account key file, as `GOOGLE_APPLICATION_CREDENTIALS` names it (reference §4.1).
///
/// `description` never shows the private key.
public struct ServiceAccountKey: Codable, Sendable, Equatable, CustomStringConvertible {
    /// The key file's type; "service_account".
    public var type: String
    /// The Google Cloud project the account belongs to.
    public var projectID: String
    /// The id of the key, sent as the JWT's `kid`.
    public var privateKeyID: String
    /// The RSA private key, PEM; never printed.
    public var privateKey: String
    /// The account's email: the assertion's issuer.
    public var clientEmail: String
    /// The account's numeric id.
    public var clientID: String
    /// Google's authorisation endpoint, as the file names it.
    public var authURI: String
    /// The token endpoint assertions are exchanged at.
    public var tokenURI: String
    /// The universe the account lives in ("googleapis.com").
    public var universeDomain: String

    enum CodingKeys: String, CodingKey {
        case type
        case projectID = "project_id"
        case privateKeyID = "private_key_id"
        case privateKey = "private_key"
        case clientEmail = "client_email"
        case clientID = "client_id"
        case authURI = "auth_uri"
        case tokenURI = "token_uri"
        case universeDomain = "universe_domain"
    }

    /// A key with these fields (tests and the emulator make their own).
    public init(
        projectID: String, privateKeyID: String, privateKey: String, clientEmail: String, clientID: String,
        tokenURI: String
    ) {
        self.type = "service_account"
        self.projectID = projectID
        self.privateKeyID = privateKeyID
        self.privateKey = privateKey
        self.clientEmail = clientEmail
        self.clientID = clientID
        self.authURI = "https://accounts.google.com/o/oauth2/auth"
        self.tokenURI = tokenURI
        self.universeDomain = "googleapis.com"
    }

    /// Reads a key file's JSON; the fields Google always writes are required.
    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        type = try c.decode(String.self, forKey: .type)
        projectID = try c.decode(String.self, forKey: .projectID)
        privateKeyID = try c.decodeIfPresent(String.self, forKey: .privateKeyID) ?? ""
        privateKey = try c.decode(String.self, forKey: .privateKey)
        clientEmail = try c.decode(String.self, forKey: .clientEmail)
        clientID = try c.decodeIfPresent(String.self, forKey: .clientID) ?? ""
        authURI = try c.decodeIfPresent(String.self, forKey: .authURI) ?? "https://accounts.google.com/o/oauth2/auth"
        tokenURI = try c.decodeIfPresent(String.self, forKey: .tokenURI) ?? "https://oauth2.googleapis.com/token"
        universeDomain = try c.decodeIfPresent(String.self, forKey: .universeDomain) ?? "googleapis.com"
    }

    /// A new key with a fresh 2048-bit RSA key pair (drawn by BoringSSL); the client id from `timing`.
    public static func generate(
        projectID: String, accountName: String = "tidemark-emulator", tokenURI: String, timing: Timing = .live
    ) throws
        -> ServiceAccountKey
    {
        let privateKey = try _RSA.Signing.PrivateKey(keySize: .bits2048)
        let keyID = SHA256Digest.hex(privateKey.publicKey.derRepresentation).prefix(40)
        var clientID = ""
        var generator = timing.generator
        for _ in 0..<21 { clientID += String(generator.next() % 10) }
        return ServiceAccountKey(
            projectID: projectID, privateKeyID: String(keyID),
            privateKey: privateKey.pkcs8PEMRepresentation,
            clientEmail: "\(accountName)@\(projectID).iam.gserviceaccount.com", clientID: clientID, tokenURI: tokenURI)
    }

    /// The RSA signing key, parsed from the PEM in `private_key`.
    public func signingKey() throws -> _RSA.Signing.PrivateKey {
        do {
            return try _RSA.Signing.PrivateKey(pemRepresentation: privateKey)
        } catch {
            throw AuthError(.malformedKey, "the private_key of \(clientEmail) is not an RSA private key in PEM form")
        }
    }

    /// The public half, PEM-encoded: what a token endpoint verifies assertions with.
    public func publicKeyPEM() throws -> String { try signingKey().publicKey.pemRepresentation }

    /// The key file's JSON, pretty-printed with sorted keys.
    public func jsonData() throws -> Data {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        return try encoder.encode(self)
    }

    /// The account, project and key id; never the private key.
    public var description: String { "service account \(clientEmail) (project \(projectID), key \(privateKeyID))" }
}
