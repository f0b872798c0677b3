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

/// Which API carries topic changes and reads (`transport` in tidemark.yaml, `--transport`): FCM's
/// topic subscription API (`v1`), the deprecated Instance ID batch API (`iid`), or one a front end
/// registers with the HTTP backend's `TopicAPIRegistry`. A name, compared by its spelling.
public struct TopicTransport: RawRepresentable, Hashable, Sendable, Codable, CustomStringConvertible,
    ExpressibleByStringLiteral
{
    /// How the requests an apply sends on a transport are counted.
    public enum Requests: Sendable, Equatable {
        /// One request per token changed (a group call is one).
        case perToken
        /// One request per operation (a batch of up to 1000 tokens).
        case perOperation
    }

    /// The name as `tidemark.yaml` and flags spell it.
    public let rawValue: String

    /// The transport called `rawValue`.
    public init(rawValue: String) { self.rawValue = rawValue }
    /// The transport called `value`.
    public init(stringLiteral value: String) { self.init(rawValue: value) }

    /// The FCM topic subscription API: one request per membership change.
    public static let v1: TopicTransport = "v1"
    /// The deprecated Instance ID batch API: up to 1000 tokens a request.
    public static let iid: TopicTransport = "iid"
    /// The transports tidemark carries itself.
    public static let builtIn: [TopicTransport] = [.v1, .iid]

    /// The name as `tidemark.yaml` and flags spell it.
    public var description: String { rawValue }

    /// `transports` as a message offers them: `v1 (the FCM topic subscription API) or iid`.
    public static func describe(_ transports: [TopicTransport]) -> String {
        let names = transports.map { $0 == .v1 ? "v1 (the FCM topic subscription API)" : $0.rawValue }
        guard names.count > 1 else { return names.first ?? "none" }
        return names.dropLast().joined(separator: ", ") + " or " + names.last!
    }

    /// The requests an apply of `operations` sends, at least, on a transport that counts them `counted`.
    public static func requests(for operations: [PlannedOperation], counted: Requests) -> Int {
        switch counted {
        case .perOperation: operations.filter { !$0.kind.isStateOnly }.count
        case .perToken: operations.reduce(0) { $0 + ($1.kind.isStateOnly ? 0 : $1.kind.isGroup ? 1 : $1.tokens.count) }
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
