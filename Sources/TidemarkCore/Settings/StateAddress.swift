import Foundation

/// A topic, device group or audience named by kind and name, as `tidemark state rm` and the
/// manifests' `removed:` entries name them: `topic:NAME`, `group:NAME`, `audience:NAME`.
public struct StateAddress: Sendable, Hashable, CustomStringConvertible {
    /// What an address names.
    public enum Kind: String, Sendable, CaseIterable {
        case topic, group, audience
    }

    /// What it names.
    public var kind: Kind
    /// The topic's name, or the group's `notification_key_name`, or the audience's name.
    public var name: String

    /// The `kind` named `name`.
    public init(_ kind: Kind, _ name: String) {
        self.kind = kind
        self.name = name
    }

    /// Parses `topic:NAME`, `group:NAME` or `audience:NAME` (an exact name; no globs).
    public init(parsing text: String) throws(StateAddressError) {
        guard let colon = text.firstIndex(of: ":"), let kind = Kind(rawValue: String(text[..<colon])) else {
            throw StateAddressError(text: text)
        }
        let name = String(text[text.index(after: colon)...])
        guard !name.isEmpty, !name.contains("*"), !name.contains("?") else { throw StateAddressError(text: text) }
        self.init(kind, name)
    }

    /// "topic:weather", as written.
    public var description: String { "\(kind.rawValue):\(name)" }
}

/// Text that is not a state address (`tidemark state rm`, `state mv`, `import --target`).
public struct StateAddressError: TidemarkError, Equatable {
    /// The text as given.
    public var text: String

    /// `text` is not an address.
    public init(text: String) { self.text = text }

    /// `bad_address`.
    public var reason: FailureReason { "bad_address" }

    /// What is wrong, and how an address is written.
    public var description: String {
        "'\(text.escapedOnOneLine)' is not an address: write topic:NAME, group:NAME or audience:NAME, with the exact name ('tidemark state list' shows them)."
    }
}
