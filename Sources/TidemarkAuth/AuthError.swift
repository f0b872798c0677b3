/// Why a credential, an assertion or an access token was not accepted.
///
/// The message never includes the credential itself.
public struct AuthError: Error, Sendable, Equatable, CustomStringConvertible {
    /// What kind of problem it is, for callers (and tests) that act on it.
    public enum Code: String, Sendable {
        case malformedKey
        case malformedJWT
        case unsupportedAlgorithm
        case unknownKey
        case badSignature
        case expired
        case invalidClaims
    }

    /// What kind of problem it is.
    public var code: Code
    /// What is wrong, as a sentence; never the credential itself.
    public var message: String

    /// An error of `code` saying `message`.
    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    /// The message.
    public var description: String { message }
}
