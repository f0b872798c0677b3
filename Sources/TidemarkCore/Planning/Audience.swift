/// Who a message sent to an FCM condition would reach, judged from the manifests or from what
/// tidemark last observed.
public struct Audience: Sendable {
    /// Where the memberships the audience is judged from come from.
    public enum Source: String, Sendable, Codable, CaseIterable {
        /// The memberships the manifests declare.
        case desired
        /// The memberships state last observed (after a refresh or an apply).
        case observed
    }

    /// The condition, parsed.
    public var condition: FCMCondition
    /// Whether it was judged from the manifests or from observed memberships.
    public var source: Source
    /// Reached tokens, sorted.
    public var tokens: [String]
    /// Topics of the condition that `source` does not know at all.
    public var unknownTopics: [String]

    /// Evaluates `condition` for every live known token: `desired` members, or `state`'s observed sets.
    public init(condition: FCMCondition, source: Source, desired: DesiredState, state: State) {
        self.condition = condition
        self.source = source
        var sets: [String: TokenSet] = [:]
        let names = Set(condition.topics)
        switch source {
        case .desired:
            for topic in desired.topics where names.contains(topic.name) { sets[topic.name] = topic.members }
        case .observed:
            for name in names { if let topic = state.topics[name] { sets[name] = topic.observed } }
        }
        unknownTopics = names.filter { sets[$0] == nil }.sorted()
        var reached: [String] = []
        let candidates: TokenSet
        if condition.matches({ _ in false }) {
            // A negated condition reaches devices in none of the topics: every known device is a candidate.
            let known = source == .desired ? desired.knownTokens : TokenSet(Array(0..<UInt32(state.tokens.count)))
            candidates = known.union(TokenSet.union(of: Array(sets.values)))
        } else {
            // Otherwise a device must be in at least one named topic.
            candidates = TokenSet.union(of: Array(sets.values))
        }
        for id in candidates where !state.dead.contains(id) {
            if condition.matches({ sets[$0]?.contains(id) ?? false }) { reached.append(state.tokens[id]) }
        }
        tokens = reached.sorted()
    }
}

extension Audience {
    /// The live tokens of a named audience (or device group): as the manifests declare it (`desired`)
    /// or as state holds it after the last apply (`observed`); sorted. nil when neither names it.
    /// What an app that sends to each token (`sendEachForMulticast`) sends to.
    public static func members(
        named name: String, source: Source, desired: DesiredState, state: State
    ) -> (tokens: [String], isAudience: Bool)? {
        let set: TokenSet
        let isAudience: Bool
        switch source {
        case .desired:
            if let spec = desired.audiences.first(where: { $0.name == name }) {
                (set, isAudience) = (spec.members, true)
            } else if let spec = desired.groups.first(where: { $0.name == name }) {
                (set, isAudience) = (spec.members, false)
            } else {
                return nil
            }
        case .observed:
            guard let group = state.groups[name] else { return nil }
            (set, isAudience) = (group.members, group.audience)
        }
        return (set.subtracting(state.dead).map { state.tokens[$0] }.sorted(), isAudience)
    }
}
