/// Computes the operations that take state to the desired memberships.
///
/// Pure: the same desired state and state give the same operations, in the same order.
public struct Differ: Sendable {
    /// The most tokens per topic batch (1000, FCM's limit).
    public var batchSize: Int
    /// The most topics a token may be in (2000, FCM's limit); planning more is an error.
    public var maxTopicsPerToken: Int
    /// FCM turned device groups down (at the date the run's deadline rules see): an audience's FCM
    /// group is forgotten rather than called.
    public var groupsTurnedDown: Bool

    /// A differ with FCM's limits.
    public init(
        batchSize: Int = FCMLimits.maxBatchTokens, maxTopicsPerToken: Int = FCMLimits.maxTopicsPerToken,
        groupsTurnedDown: Bool = false
    ) {
        self.batchSize = batchSize
        self.maxTopicsPerToken = maxTopicsPerToken
        self.groupsTurnedDown = groupsTurnedDown
    }

    /// The operations and what the reviewer sees of them.
    public struct Result: Sendable {
        /// The operations, in execution order.
        public var operations: [PlannedOperation]
        /// Per-topic counts.
        public var topics: [TopicChange]
        /// Per-group changes.
        public var groups: [GroupChange]
        /// What the diff found that the reviewer must know (errors stop the plan).
        public var diagnostics: [Diagnostic]
        /// Declared memberships left unsubscribed because the device opted out (opt_outs: respect).
        public var optedOut = 0
    }

    /// Only topics and groups `targets` covers are diffed; the others are left as they are.
    ///
    /// With `scope` (the tokens of the devices that changed since a full plan found nothing to do),
    /// only those tokens' topic memberships are diffed: the operations are the full diff's that touch
    /// them, and the rails that look at a whole topic (emptying it) still see the whole topic. Groups
    /// and audiences are not diffed; the caller plans in full when a change touches one.
    public func diff(desired: DesiredState, state: State, targets: Targets = .all, scope: TokenSet? = nil) -> Result {
        var unsubscribes: [PlannedOperation] = []
        var subscribes: [PlannedOperation] = []
        var topicChanges: [TopicChange] = []
        var diagnostics: [Diagnostic] = []
        var addsPerToken: [(topic: String, ids: TokenSet)] = []
        var removesPerToken: [TokenSet] = []
        var declared = Set<String>()
        var respected = 0
        var steps: [PlannedOperation] = []

        for spec in desired.topics {
            declared.insert(spec.name)
            guard targets.coversTopic(spec.name) else { continue }
            let whole = state.topics[spec.name] ?? TopicState()
            let current = scope.map { whole.restricted(to: $0) } ?? whole
            let members = scope.map { spec.members.intersection($0) } ?? spec.members
            let live = members.subtracting(state.dead)
            var notes: [String] = []
            // Devices that unsubscribed themselves in the app: a user's choice, left alone when respected.
            let optedOut = live.intersection(current.optedOut).subtracting(current.observed)
            let add: TokenSet
            if spec.optOuts == .respect, !optedOut.isEmpty {
                respected += optedOut.count
                add = live.subtracting(current.observed).subtracting(optedOut)
                notes.append(
                    "\(optedOut.count) declared device\(optedOut.count == 1 ? "" : "s") opted out in the app and \(optedOut.count == 1 ? "is" : "are") left unsubscribed (opt_outs: respect)"
                )
            } else {
                add = live.subtracting(current.observed)
            }
            let remove: TokenSet
            switch spec.mode {
            case .additive:
                remove = current.managed.subtracting(members).intersection(current.observed).subtracting(
                    state.dead)
            case .authoritative:
                remove = current.observed.subtracting(members).subtracting(state.dead)
                notes.append(
                    "authoritative over devices tidemark knows; devices it has never seen are not visible to FCM reads and are not touched"
                )
            }
            if !remove.isEmpty, !whole.observed.isEmpty,
                whole.observed.union(add).subtracting(remove).subtracting(state.dead).isEmpty
            {
                let count = "\(remove.count) known subscriber\(remove.count == 1 ? "" : "s")"
                if spec.protect {
                    diagnostics.append(
                        .error(
                            "topic '\(spec.name)' is protected (protect: true), and this plan would empty it: it unsubscribes all \(count). Declare members for it, or set protect: false if emptying it is intended.",
                            at: spec.location
                        ).coded("rail.protect").about(.topic, spec.name))
                } else if !spec.allowEmpty {
                    diagnostics.append(
                        .error(
                            "this plan would empty topic '\(spec.name)': it unsubscribes all \(count). Set 'allow_empty: true' on the topic if that is intended.",
                            at: spec.location
                        ).coded("rail.allow_empty").about(.topic, spec.name))
                }
            }
            let deadDeclared = members.intersection(state.dead)
            if !deadDeclared.isEmpty {
                notes.append(
                    "\(PlanRenderer.counted(deadDeclared.count, "declared token")) \(deadDeclared.count == 1 ? "is" : "are") unregistered in FCM and \(deadDeclared.count == 1 ? "is" : "are") skipped"
                )
            }
            // Declared members FCM already holds, in a topic tidemark manages nothing of yet (new to
            // state, or declared again after a release): recorded as tidemark's own, nothing is sent.
            let adopt = whole.managed.isEmpty ? live.intersection(current.observed) : TokenSet()
            if !adopt.isEmpty {
                notes.append(
                    "\(PlanRenderer.counted(adopt.count, "membership")) FCM already holds \(adopt.count == 1 ? "becomes" : "become") tidemark's own (adopted); nothing is sent for \(adopt.count == 1 ? "it" : "them")"
                )
            }
            unsubscribes += batches(.unsubscribe, spec.name, remove, state.tokens.table)
            subscribes += batches(.subscribe, spec.name, add, state.tokens.table)
            steps += batches(.topicAdopt, spec.name, adopt, state.tokens.table)
            addsPerToken.append((spec.name, add))
            removesPerToken.append(remove)
            if !add.isEmpty || !remove.isEmpty || !deadDeclared.isEmpty || !adopt.isEmpty {
                var change = TopicChange(
                    topic: spec.name, mode: spec.mode, subscribe: add.count,
                    unsubscribe: remove.count, removedFromManifests: false, notes: notes)
                if !adopt.isEmpty { change.adopted = adopt.count }
                topicChanges.append(change)
            }
        }
        for name in state.topics.keys.sorted() where !declared.contains(name) && targets.coversTopic(name) {
            let current = scope.map { state.topics[name]!.restricted(to: $0) } ?? state.topics[name]!
            // Released: nothing is sent, protected or not; state forgets the topic. A topic state only
            // saw is not managed: there is nothing to release.
            if desired.releases(StateAddress(.topic, name)), current.isManaged {
                steps.append(PlannedOperation(kind: .topicRelease, target: name, tokens: []))
                var change = TopicChange(
                    topic: name, mode: current.mode, subscribe: 0, unsubscribe: 0, removedFromManifests: true,
                    notes: [Self.releaseNote(subscribers: current.observed.count, managed: current.managed.count)])
                change.released = true
                topicChanges.append(change)
                continue
            }
            let remove = current.managed.intersection(current.observed).subtracting(state.dead)
            guard !remove.isEmpty else { continue }
            if current.protect {
                diagnostics.append(
                    .error(
                        "topic '\(name)' is protected (protect: true when last applied) and is no longer in the manifests; removing it would unsubscribe the \(remove.count) membership\(remove.count == 1 ? "" : "s") tidemark made. Put it back, or first apply it with protect: false."
                    ).coded("rail.protect").about(.topic, name))
            }
            unsubscribes += batches(.unsubscribe, name, remove, state.tokens.table)
            removesPerToken.append(remove)
            topicChanges.append(
                TopicChange(
                    topic: name, mode: current.mode, subscribe: 0, unsubscribe: remove.count,
                    removedFromManifests: true,
                    notes: [
                        "no longer in the manifests: tidemark removes the memberships it made. To stop managing it and leave everyone subscribed, list it under 'removed:' as {topic: \(name), unsubscribe: false} (or run 'tidemark state rm topic:\(name)')"
                    ]))
        }
        diagnostics += checkTopicCap(state: state, adds: addsPerToken, removes: removesPerToken, scope: scope)
        if scope != nil {
            return Result(
                operations: unsubscribes + subscribes + steps, topics: topicChanges, groups: [],
                diagnostics: diagnostics, optedOut: respected)
        }
        diagnostics += releaseWarnings(desired: desired, state: state, declared: declared)
        let (groupOps, groupChanges, groupDiagnostics) = diffGroups(desired: desired, state: state, targets: targets)
        diagnostics += groupDiagnostics
        let (audienceOps, audienceChanges, audienceDiagnostics) = diffAudiences(
            desired: desired, state: state, targets: targets)
        diagnostics += audienceDiagnostics
        return Result(
            operations: unsubscribes + subscribes + steps + groupOps + audienceOps, topics: topicChanges,
            groups: groupChanges + audienceChanges,
            diagnostics: diagnostics, optedOut: respected)
    }

    /// What a released topic's plan says: nothing sent, who stays subscribed.
    static func releaseNote(subscribers: Int, managed: Int) -> String {
        let made = managed == 0 ? "" : " (\(PlanRenderer.formatCount(managed)) of them made or adopted by tidemark)"
        return
            "released (removed: with unsubscribe: false): nothing is sent to FCM; its \(PlanRenderer.counted(subscribers, "known subscriber")) stay\(subscribers == 1 ? "s" : "") subscribed\(made), and state forgets the topic"
    }

    /// A `removed:` entry that releases nothing state holds is harmless once applied (the entry may
    /// stay), but one that misses by a letter or by its kind while the plan removes the entry it
    /// meant would unsubscribe what the author meant to keep: that is said.
    func releaseWarnings(desired: DesiredState, state: State, declared: Set<String>) -> [Diagnostic] {
        let audiences = Set(desired.audiences.map(\.name))
        let groups = Set(desired.groups.map(\.name))
        var warnings: [Diagnostic] = []
        for release in desired.released {
            let address = release.address
            let name = address.name
            switch address.kind {
            case .topic:
                guard state.topics[name] == nil else { continue }
                if let group = state.groups[name] {
                    warnings.append(
                        .warning(
                            "'removed:' names \(address), which state does not hold; state holds '\(name)' as \(group.audience ? "an audience" : "a device group"): write '\(group.audience ? "audience" : "group"): \(name)'.",
                            at: release.location))
                } else if let closest = nearest(
                    name, in: state.topics.keys.filter { !declared.contains($0) }.sorted())
                {
                    warnings.append(
                        .warning(
                            "'removed:' names \(address), which state does not hold, so it releases nothing; did you mean topic:\(closest), which leaves the manifests in this plan?",
                            at: release.location))
                }
            case .group, .audience:
                let wantsAudience = address.kind == .audience
                if let group = state.groups[name] {
                    guard group.audience != wantsAudience else { continue }
                    warnings.append(
                        .warning(
                            "'removed:' names \(address), but state holds '\(name)' as \(group.audience ? "an audience" : "a device group"): write '\(group.audience ? "audience" : "group"): \(name)', or it is not released.",
                            at: release.location))
                } else if let closest = nearest(
                    name,
                    in: state.groups.filter {
                        $0.value.audience == wantsAudience && !groups.contains($0.key) && !audiences.contains($0.key)
                    }.keys.sorted())
                {
                    warnings.append(
                        .warning(
                            "'removed:' names \(address), which state does not hold, so it releases nothing; did you mean \(address.kind.rawValue):\(closest), which leaves the manifests in this plan?",
                            at: release.location))
                } else if state.topics[name] != nil {
                    warnings.append(
                        .warning(
                            "'removed:' names \(address), which state does not hold; state holds '\(name)' as a topic: write 'topic: \(name)'.",
                            at: release.location))
                }
            }
        }
        return warnings
    }

    /// Splits `ids` into requests of at most `batchSize` tokens, sorted so plans are stable across machines.
    func batches(
        _ kind: PlannedOperation.Kind, _ topic: String, _ ids: TokenSet, _ table: TokenTable
    )
        -> [PlannedOperation]
    {
        guard !ids.isEmpty else { return [] }
        let tokens = ids.map { table[$0] }.sorted()
        return stride(from: 0, to: tokens.count, by: batchSize).map { start in
            PlannedOperation(
                kind: kind, target: topic, tokens: Array(tokens[start..<min(start + batchSize, tokens.count)]))
        }
    }

    /// Every device must stay within FCM's 2000 topics after the plan: observed − removed + added.
    /// With `scope`, only its tokens are counted (the sets are all within it).
    func checkTopicCap(
        state: State, adds: [(topic: String, ids: TokenSet)], removes: [TokenSet], scope: TokenSet? = nil
    ) -> [Diagnostic] {
        var over: [(id: UInt32, count: Int32)] = []
        if let scope {
            var counts: [UInt32: Int32] = [:]
            for id in scope { counts[id] = Int32(state.topics.values.count { $0.observed.contains(id) }) }
            for set in removes { for id in set { counts[id, default: 0] -= 1 } }
            for entry in adds { for id in entry.ids { counts[id, default: 0] += 1 } }
            over = counts.filter { Int($0.value) > maxTopicsPerToken }.map { ($0.key, $0.value) }.sorted {
                $0.id < $1.id
            }
        } else {
            // One count per token of the registry, which every set's ids index.
            var counts = state.observedTopicCounts().map { Int32($0) }
            for set in removes { for id in set { counts[Int(id)] -= 1 } }
            for entry in adds { for id in entry.ids { counts[Int(id)] += 1 } }
            for (id, count) in counts.enumerated() where Int(count) > maxTopicsPerToken {
                over.append((UInt32(id), count))
            }
        }
        var diagnostics: [Diagnostic] = []
        for (id, count) in over.prefix(10) {
            diagnostics.append(
                .error(
                    "token \(Redaction.redact(state.tokens[id])) would hold \(count) topics after this plan (FCM allows \(maxTopicsPerToken)); it is subscribed to topics tidemark does not manage. Remove it from some topics first."
                ))
        }
        if over.count > 10 {
            diagnostics.append(.error("\(over.count - 10) more tokens would pass \(maxTopicsPerToken) topics."))
        }
        return diagnostics
    }

    private func diffGroups(
        desired: DesiredState, state: State, targets: Targets
    )
        -> ([PlannedOperation], [GroupChange], [Diagnostic])
    {
        var operations: [PlannedOperation] = []
        var changes: [GroupChange] = []
        var diagnostics: [Diagnostic] = []
        // An audience of the same name converts the group: `diffAudiences` plans it.
        var declared = Set(desired.audiences.map(\.name))
        for spec in desired.groups {
            declared.insert(spec.name)
            guard targets.coversGroup(spec.name) else { continue }
            let live = spec.members.subtracting(state.dead)
            let names = { (set: TokenSet) in set.map { state.tokens[$0] }.sorted() }
            if let current = state.groups[spec.name], current.audience {
                diagnostics.append(
                    .error(
                        "'\(spec.name)' was converted to an audience; tidemark does not turn an audience back into a device group, which FCM is ending. Declare it under 'audiences:'.",
                        at: spec.location))
                continue
            }
            guard let current = state.groups[spec.name], current.key != nil else {
                guard !live.isEmpty else {
                    diagnostics.append(
                        .warning(
                            "device group '\(spec.name)' has no registered members; it is not created.",
                            at: spec.location))
                    continue
                }
                operations.append(PlannedOperation(kind: .groupCreate, target: spec.name, tokens: names(live)))
                changes.append(GroupChange(group: spec.name, action: .create, add: live.count, remove: 0, notes: []))
                continue
            }
            if current.members.isEmpty {
                // Known to exist (found by key look-up) but never managed: members are invisible, add ours.
                operations.append(PlannedOperation(kind: .groupAdd, target: spec.name, tokens: names(live)))
                changes.append(
                    GroupChange(
                        group: spec.name, action: .adopt, add: live.count, remove: 0,
                        notes: [
                            "the group exists in FCM but not in state; its other members cannot be read and are kept"
                        ]))
                continue
            }
            let add = live.subtracting(current.members)
            let remove = current.members.subtracting(spec.members)
            guard !add.isEmpty || !remove.isEmpty else { continue }
            let steps = Self.groupSteps(current: current.members, add: add, remove: remove)
            for (kind, ids) in steps {
                operations.append(PlannedOperation(kind: kind, target: spec.name, tokens: names(ids)))
            }
            changes.append(
                GroupChange(group: spec.name, action: .update, add: add.count, remove: remove.count, notes: []))
        }
        for name in state.groups.keys.sorted() where !declared.contains(name) && targets.coversGroup(name) {
            let current = state.groups[name]!
            if !current.audience, desired.releases(StateAddress(.group, name)) {
                operations.append(PlannedOperation(kind: .groupRelease, target: name, tokens: []))
                changes.append(
                    GroupChange(
                        group: name, action: .release, add: 0, remove: 0,
                        notes: [
                            "released: nothing is sent to FCM; the group keeps its \(PlanRenderer.counted(current.members.count, "member")) tidemark knows, and state forgets it"
                        ]))
                continue
            }
            guard !current.audience, current.key != nil, !current.members.isEmpty else { continue }
            if current.protect {
                diagnostics.append(
                    .error(
                        "device group '\(name)' is protected (protect: true when last applied) and is no longer in the manifests; removing it would delete the group in FCM. Put it back, or first apply it with protect: false."
                    ).coded("rail.protect").about(.group, name))
            }
            operations.append(
                PlannedOperation(
                    kind: .groupRemove, target: name,
                    tokens: current.members.map { state.tokens[$0] }.sorted()))
            changes.append(
                GroupChange(
                    group: name, action: .delete, add: 0, remove: current.members.count,
                    notes: [
                        "no longer in the manifests: all members are removed, which deletes the group in FCM. To stop managing it and keep it, list it under 'removed:' as {group: \(name), unsubscribe: false} (or run 'tidemark state rm group:\(name)')"
                    ]))
        }
        return (operations, changes, diagnostics)
    }

    /// Audiences: named sets in state with no FCM group behind them, so their changes are state-only
    /// steps. A device group named by an audience is converted in one step that deletes nothing in
    /// FCM: the group keeps its key and is kept in step with the audience (so senders to the key reach
    /// the same devices) until `retire_group_key: true` says the app no longer sends to it; then its
    /// members are removed, which deletes it. After FCM's turn-down the group is only forgotten.
    private func diffAudiences(
        desired: DesiredState, state: State, targets: Targets
    )
        -> ([PlannedOperation], [GroupChange], [Diagnostic])
    {
        var operations: [PlannedOperation] = []
        var changes: [GroupChange] = []
        var diagnostics: [Diagnostic] = []
        let names = { (set: TokenSet) in set.map { state.tokens[$0] }.sorted() }
        let declaredGroups = Set(desired.groups.map(\.name))
        var declared = Set<String>()
        for spec in desired.audiences {
            declared.insert(spec.name)
            guard targets.coversGroup(spec.name) else { continue }
            let live = spec.members.subtracting(state.dead)
            func set() {
                operations.append(PlannedOperation(kind: .audienceSet, target: spec.name, tokens: names(live)))
            }
            guard let current = state.groups[spec.name], current.audience || current.key != nil else {
                set()
                changes.append(
                    GroupChange(
                        group: spec.name, action: .create, add: live.count, remove: 0,
                        notes: spec.retireGroupKey
                            ? ["retire_group_key: true, but state knows no FCM group of this name: nothing to retire"]
                            : [],
                        audience: true))
                continue
            }
            let add = live.subtracting(current.members)
            let remove = current.members.subtracting(live)
            let converting = !current.audience
            let action: GroupChange.Action
            var notes: [String] = []
            if let key = current.key {
                let shownKey = Redaction.redact(key)
                if groupsTurnedDown {
                    // The FCM group is gone with device groups: forget it; nothing is sent to FCM.
                    if converting || !add.isEmpty || !remove.isEmpty { set() }
                    operations.append(PlannedOperation(kind: .audienceUnlink, target: spec.name, tokens: []))
                    action = converting ? .convert : .update
                    notes.append(
                        "FCM turned device groups down: the group \(shownKey) no longer exists and is forgotten; nothing is sent to FCM"
                    )
                } else if spec.retireGroupKey {
                    if current.members.isEmpty {
                        diagnostics.append(
                            .error(
                                "audience '\(spec.name)': retire_group_key: true, but tidemark never managed the members of FCM group \(shownKey), so it cannot empty (delete) it. Run 'tidemark groups export \(spec.name)' to see them, or leave the key until FCM's turn-down.",
                                at: spec.location))
                        continue
                    }
                    if current.protect {
                        diagnostics.append(
                            .error(
                                "audience '\(spec.name)' is protected (protect: true when last applied): retiring its FCM group would delete the group in FCM. First apply it with protect: false.",
                                at: spec.location
                            ).coded("rail.protect").about(.group, spec.name))
                    }
                    operations.append(
                        PlannedOperation(kind: .groupRemove, target: spec.name, tokens: names(current.members)))
                    set()
                    action = .retire
                    notes.append(
                        "retire_group_key: true: the FCM group \(shownKey) is deleted (its \(current.members.count) member\(current.members.count == 1 ? "" : "s") removed); senders to its key reach no one after this apply"
                    )
                    if converting { notes.append("converted from a device group; its members stay in the audience") }
                } else {
                    if live.count > FCMLimits.maxGroupMembers {
                        diagnostics.append(
                            .error(
                                "audience '\(spec.name)' has \(live.count) members, but its FCM group \(shownKey) is still kept in step and FCM allows at most \(FCMLimits.maxGroupMembers) per group. Set retire_group_key: true once the app no longer sends to the group key, or narrow the members.",
                                at: spec.location))
                        continue
                    }
                    if !add.isEmpty || !remove.isEmpty {
                        if live.isEmpty {
                            diagnostics.append(
                                .error(
                                    "audience '\(spec.name)' has no members, but its FCM group \(shownKey) is kept in step, and an empty group is deleted. Set retire_group_key: true to delete the group.",
                                    at: spec.location))
                            continue
                        }
                        for (kind, ids) in Self.groupSteps(current: current.members, add: add, remove: remove) {
                            operations.append(PlannedOperation(kind: kind, target: spec.name, tokens: names(ids)))
                        }
                    }
                    if converting || !add.isEmpty || !remove.isEmpty { set() }
                    action = converting ? .convert : .update
                    if converting {
                        notes.append(
                            "converted from a device group: nothing is deleted in FCM; the group \(shownKey) is kept in step until retire_group_key: true says the app no longer sends to its key"
                        )
                    }
                }
            } else {
                guard !add.isEmpty || !remove.isEmpty else { continue }
                set()
                action = .update
            }
            if action == .update, add.isEmpty, remove.isEmpty, notes.isEmpty { continue }
            changes.append(
                GroupChange(
                    group: spec.name, action: action, add: add.count, remove: remove.count, notes: notes,
                    audience: true))
        }
        for name in state.groups.keys.sorted()
        where !declared.contains(name) && !declaredGroups.contains(name) && targets.coversGroup(name) {
            let current = state.groups[name]!
            guard current.audience else { continue }
            if desired.releases(StateAddress(.audience, name)) {
                operations.append(PlannedOperation(kind: .groupRelease, target: name, tokens: []))
                let group =
                    current.key != nil && !groupsTurnedDown
                    ? "; the FCM group it was converted from is left as it is" : ""
                changes.append(
                    GroupChange(
                        group: name, action: .release, add: 0, remove: 0,
                        notes: [
                            "released: state forgets it and its \(PlanRenderer.counted(current.members.count, "member"))\(group)"
                        ],
                        audience: true))
                continue
            }
            if current.protect {
                diagnostics.append(
                    .error(
                        "audience '\(name)' is protected (protect: true when last applied) and is no longer in the manifests. Put it back, or first apply it with protect: false."
                    ).coded("rail.protect").about(.group, name))
            }
            var notes = ["no longer in the manifests: tidemark forgets it (nothing in FCM)"]
            if let key = current.key, !groupsTurnedDown, !current.members.isEmpty {
                operations.append(PlannedOperation(kind: .groupRemove, target: name, tokens: names(current.members)))
                notes = [
                    "no longer in the manifests: the FCM group \(Redaction.redact(key)) it was converted from is deleted too (all members removed)"
                ]
            }
            operations.append(PlannedOperation(kind: .audienceDelete, target: name, tokens: []))
            changes.append(
                GroupChange(
                    group: name, action: .delete, add: 0, remove: current.members.count, notes: notes, audience: true))
        }
        return (operations, changes, diagnostics)
    }

    /// Orders add and remove calls so a group never passes 20 members and is never emptied (which would delete it).
    static func groupSteps(
        current: TokenSet, add: TokenSet, remove: TokenSet
    )
        -> [(PlannedOperation.Kind, TokenSet)]
    {
        var steps: [(PlannedOperation.Kind, TokenSet)] = []
        func push(_ kind: PlannedOperation.Kind, _ set: TokenSet) { if !set.isEmpty { steps.append((kind, set)) } }
        let limit = FCMLimits.maxGroupMembers
        if current.count + add.count <= limit {
            push(.groupAdd, add)
            push(.groupRemove, remove)
        } else if current.count - remove.count >= 1 {
            push(.groupRemove, remove)
            push(.groupAdd, add)
        } else {
            // Every member is replaced and both sets together exceed the cap: keep one old member
            // while the new ones arrive; if even that is one too many, hold back one new member.
            let keep = TokenSet(sorted: [remove.ids[0]])
            push(.groupRemove, remove.subtracting(keep))
            if 1 + add.count <= limit {
                push(.groupAdd, add)
                push(.groupRemove, keep)
            } else {
                let last = TokenSet(sorted: [add.ids[add.count - 1]])
                push(.groupAdd, add.subtracting(last))
                push(.groupRemove, keep)
                push(.groupAdd, last)
            }
        }
        return steps
    }
}
