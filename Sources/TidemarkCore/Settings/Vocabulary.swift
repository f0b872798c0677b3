/// Which FCM tidemark talks to.
public enum BackendKind: String, Sendable, Codable, CaseIterable, CustomStringConvertible {
    /// The emulator's engine in-process, persisted under `.tidemark/`: no account needed.
    case embedded
    /// tidemark's emulator over HTTP (`FCM_EMULATOR_HOST`).
    case emulator
    /// The real service.
    case fcm

    /// The name as `tidemark.yaml` and flags spell it.
    public var description: String { rawValue }
    /// Whether calls go over HTTP through tidemark's client.
    public var isHTTP: Bool { self != .embedded }
}

/// How topic changes reach FCM.
public enum TopicTransport: String, Sendable, Codable, CaseIterable, CustomStringConvertible {
    /// The FCM topic subscription API: one request per membership change.
    case v1
    /// The deprecated Instance ID batch API: up to 1000 tokens a request.
    case iid

    /// The name as `tidemark.yaml` and flags spell it.
    public var description: String { rawValue }

    /// The requests an apply of `operations` sends on this transport, at least: a request per token on
    /// v1 (a group call is one), a request per operation on IID.
    public func requests(for operations: [PlannedOperation]) -> Int {
        switch self {
        case .iid: operations.filter { !$0.kind.isStateOnly }.count
        case .v1: operations.reduce(0) { $0 + ($1.kind.isStateOnly ? 0 : $1.kind.isGroup ? 1 : $1.tokens.count) }
        }
    }
}

/// What a subscription-change quota counts.
public enum QuotaUnit: String, Sendable, Codable, CaseIterable, CustomStringConvertible {
    /// Membership changes: a batch of N tokens costs N.
    case tokens
    /// HTTP requests: a batch costs 1.
    case requests

    /// The name as `tidemark.yaml` and flags spell it.
    public var description: String { rawValue }
}

extension CaseIterable where Self: RawRepresentable, RawValue == String {
    /// "a, b or c", for messages.
    public static var choices: String {
        let names = allCases.map(\.rawValue)
        guard names.count > 1 else { return names.joined() }
        return names.dropLast().joined(separator: ", ") + " or " + names.last!
    }
}
