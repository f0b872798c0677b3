import Foundation

/// `--drift-only`: what a plan re-asserts when it may only undo drift. The desired state is what the
/// last apply established, as state remembers it, not what the manifests say now: manifest edits and
/// inventory churn waiting on `main` are left for a normal apply.
public struct DriftOnlyNote: Sendable, Codable, Equatable {
    /// Membership changes and group calls the manifests and inventory call for that this plan leaves alone.
    public var waiting: Int

    /// A note of `waiting` changes left alone.
    public init(waiting: Int) { self.waiting = waiting }
}

extension State {
    /// The desired state of `--drift-only`: every topic with the memberships tidemark made or adopted
    /// (`managed`), its mode and protection as last applied, and every group with the members it
    /// holds in state. Settings state does not keep (`opt_outs`, `allow_empty`) come from `declared`
    /// while the topic is still declared; an authoritative topic that tidemark left empty may stay empty.
    public func established(declared: DesiredState) -> DesiredState {
        let declaredTopics = Dictionary(declared.topics.map { ($0.name, $0) }, uniquingKeysWith: { a, _ in a })
        let declaredGroups = Dictionary(declared.groups.map { ($0.name, $0) }, uniquingKeysWith: { a, _ in a })
        var result: [DesiredTopic] = []
        for (name, topic) in topics {
            let spec = declaredTopics[name]
            guard !topic.managed.isEmpty || topic.mode == .authoritative else { continue }
            result.append(
                DesiredTopic(
                    name: name, mode: topic.mode, protect: topic.protect,
                    allowEmpty: spec?.allowEmpty ?? false || topic.managed.isEmpty,
                    optOuts: spec?.optOuts, members: topic.managed, location: spec?.location))
        }
        var groupsResult: [DesiredGroup] = []
        var audiences: [DesiredGroup] = []
        for (name, group) in groups where group.audience {
            // An audience as it stands: its FCM group, if any, neither retired nor changed.
            audiences.append(DesiredGroup(name: name, protect: group.protect, members: group.members))
        }
        for (name, group) in groups where !group.audience && !group.members.isEmpty {
            groupsResult.append(
                DesiredGroup(
                    name: name, protect: group.protect, members: group.members,
                    location: declaredGroups[name]?.location))
        }
        return DesiredState(
            topics: result, groups: groupsResult, audiences: audiences, knownTokens: declared.knownTokens)
    }
}

extension Plan {
    /// The changes of `full` (a plan from the manifests, made from the same refresh) that are not in
    /// this plan: what a drift-only plan leaves waiting. Counted per membership and group call.
    public func waiting(comparedWith full: Plan) -> Int {
        struct Change: Hashable {
            var kind: PlannedOperation.Kind
            var target: String
            var token: String
        }
        var mine = Set<Change>()
        for op in operations {
            for token in op.tokens { mine.insert(Change(kind: op.kind, target: op.target, token: token)) }
        }
        var count = 0
        var groupCalls = Set<String>()
        for op in full.operations {
            for token in op.tokens where !mine.contains(Change(kind: op.kind, target: op.target, token: token)) {
                if op.kind.isStateOnly { continue }
                if op.kind.isGroup { groupCalls.insert("\(op.kind.rawValue)\u{0}\(op.target)") } else { count += 1 }
            }
        }
        return count + groupCalls.count
    }
}
