/// The answers that mean "FCM does not know this registration", kept in one place: only these mark a
/// token dead. Anything else FCM did not document for a single token stops the command instead, so
/// a wrong URL or a proxy's error page can never read as a fleet of dead devices.
///
/// Configurable (`unregistered:` in tidemark.yaml), since the reference marks some of these as
/// inferred rather than documented.
public struct UnregisteredAnswers: Sendable, Equatable {
    /// v1: a JSON google.rpc.Status whose `status` or FcmError `errorCode` is one of these.
    public var v1: Set<String>
    /// IID: per-token result codes in a batch answer.
    public var iid: Set<String>

    /// The answers that mean unregistered, per transport (FCM's documented ones by default).
    public init(v1: Set<String> = ["NOT_FOUND", "UNREGISTERED"], iid: Set<String> = ["NOT_FOUND"]) {
        self.v1 = v1
        self.iid = iid
    }

    /// FCM's documented answers: `NOT_FOUND` and `UNREGISTERED` (v1), `NOT_FOUND` (IID).
    public static let `default` = UnregisteredAnswers()

    /// The answers a v1 call can carry (reference §1.2): google.rpc.Code names and FcmError codes.
    public static let documentedV1Codes: Set<String> = [
        "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
        "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED",
        "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED", "UNSPECIFIED_ERROR", "UNREGISTERED",
        "SENDER_ID_MISMATCH", "QUOTA_EXCEEDED", "THIRD_PARTY_AUTH_ERROR",
    ]

    /// Per-token IID codes FCM documents (reference §1.3): they fail that token and the run goes on.
    public static let documentedIIDCodes: Set<String> = [
        "NOT_FOUND", "INVALID_ARGUMENT", "INTERNAL", "TOO_MANY_TOPICS", "RESOURCE_EXHAUSTED", "PERMISSION_DENIED",
        "DEADLINE_EXCEEDED", "UNAVAILABLE", "UNKNOWN",
    ]
}
