/// A topic as the manifests want it, with members resolved to token ids.
public struct DesiredTopic: Sendable {
    public var name: String
    public var mode: TopicMode
    public var protect: Bool
    public var allowEmpty: Bool
    public var members: TokenSet
    public var location: SourceLocation?

    public init(
        name: String, mode: TopicMode = .additive, protect: Bool = false, allowEmpty: Bool = false,
        members: TokenSet, location: SourceLocation? = nil
    ) {
        self.name = name
        self.mode = mode
        self.protect = protect
        self.allowEmpty = allowEmpty
        self.members = members
        self.location = location
    }
}

/// A device group as the manifests want it.
public struct DesiredGroup: Sendable {
    public var name: String
    public var protect: Bool
    public var members: TokenSet
    public var location: SourceLocation?

    public init(name: String, protect: Bool = false, members: TokenSet, location: SourceLocation? = nil) {
        self.name = name
        self.protect = protect
        self.members = members
        self.location = location
    }
}

/// Everything the manifests declare, resolved against the inventory; ids are in the shared `TokenTable`.
public struct DesiredState: Sendable {
    /// Sorted by name.
    public var topics: [DesiredTopic]
    /// Sorted by name.
    public var groups: [DesiredGroup]
    /// Tokens of the inventory and tokens named directly by manifests.
    public var knownTokens: TokenSet

    public init(topics: [DesiredTopic], groups: [DesiredGroup], knownTokens: TokenSet) {
        self.topics = topics.sorted { $0.name < $1.name }
        self.groups = groups.sorted { $0.name < $1.name }
        self.knownTokens = knownTokens
    }
}
