/// What one refresh read from the backend, in token ids of the state's table.
public struct RefreshResult: Sendable {
    /// When the refresh read (seconds since 1970).
    public var at: Int64
    /// The tokens that were read; their observed topics replace what state had.
    public var refreshed: TokenSet
    /// Per topic, the refreshed tokens seen subscribed.
    public var subscribed: [String: TokenSet]
    /// Refreshed tokens FCM does not know.
    public var dead: TokenSet
    /// Per group name that was looked up: the key, or nil when the group does not exist.
    public var groupKeys: [String: String?]

    /// A refresh's result, as `Refresher` builds it.
    public init(
        at: Int64, refreshed: TokenSet, subscribed: [String: TokenSet], dead: TokenSet,
        groupKeys: [String: String?]
    ) {
        self.at = at
        self.refreshed = refreshed
        self.subscribed = subscribed
        self.dead = dead
        self.groupKeys = groupKeys
    }
}

extension State {
    /// How `refresh` differs from what state remembers, as tokens (so a saved plan carries it).
    public func observations(from refresh: RefreshResult) -> Observations {
        var result = Observations(refreshedAt: refresh.at)
        let names = Set(topics.keys).union(refresh.subscribed.keys).sorted()
        for name in names {
            let before = (topics[name]?.observed ?? TokenSet()).intersection(refresh.refreshed)
            let after = refresh.subscribed[name] ?? TokenSet()
            let added = after.subtracting(before)
            let removed = before.subtracting(after)
            if !added.isEmpty || !removed.isEmpty {
                result.topics.append(
                    Observations.TopicDelta(
                        topic: name, subscribed: strings(added),
                        unsubscribed: strings(removed)))
            }
        }
        result.dead = strings(refresh.dead.subtracting(dead))
        result.revived = strings(dead.intersection(refresh.refreshed).subtracting(refresh.dead))
        // Only whether a group exists is news: FCM answers a look-up with any of a group's key aliases, so
        // another key for a group state knows is the same group, not a change to write.
        for (name, key) in refresh.groupKeys.sorted(by: { $0.key < $1.key })
        where (groups[name]?.key == nil) != (key == nil) {
            result.groupKeys.append(Observations.GroupKey(group: name, key: key))
        }
        return result
    }

    func strings(_ set: TokenSet) -> [String] { set.map { tokens[$0] }.sorted() }
}
