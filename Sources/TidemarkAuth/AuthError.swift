/// Why a credential, an assertion or an access token was not accepted.
///
/// The message never includes the credential itself.
public struct AuthError: Error, Sendable, Equatable, CustomStringConvertible {
    public enum Code: String, Sendable {
        case malformedKey
        case malformedJWT
        case unsupportedAlgorithm
        case unknownKey
        case badSignature
        case expired
        case invalidClaims
    }

    public var code: Code
    public var message: String

    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { message }
}
