/// What a plan's selection and its rails speak of: a topic, or a group (audiences count as groups).
public enum SubjectKind: String, Sendable, Codable {
    case topic, group
}

/// One topic or group (or audience) by its exact name: what a rail refuses and holds
/// (`Diagnostic.subject`, `HeldChange`); `Targets.Subject`.
public struct PlanSubject: Sendable, Hashable, Codable, CustomStringConvertible {
    /// A topic, or a group (audiences count as groups).
    public var kind: SubjectKind
    /// Its exact name (no glob).
    public var name: String

    /// The `kind` named `name`.
    public init(_ kind: SubjectKind, _ name: String) {
        self.kind = kind
        self.name = name
    }

    /// "topic:weather".
    public var description: String { "\(kind.rawValue):\(name)" }
}
