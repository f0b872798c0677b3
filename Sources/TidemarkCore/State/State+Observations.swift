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

    /// Records what `refresh` read and returns how it differed from what state remembered.
    @discardableResult
    public mutating func absorb(_ refresh: RefreshResult) -> Observations {
        let observations = observations(from: refresh)
        apply(observations, seen: refresh.refreshed)
        return observations
    }

    /// Records observations in state: observed memberships, dead tokens, group keys and when tokens were seen.
    ///
    /// `seen` are the tokens the refresh read; they get `refreshedAt` as their last-seen time.
    public mutating func apply(_ observations: Observations, seen: TokenSet = TokenSet()) {
        for delta in observations.topics {
            var topic = topics[delta.topic] ?? TopicState()
            let subscribed = TokenSet(delta.subscribed.map { tokens.intern($0) })
            let unsubscribed = TokenSet(delta.unsubscribed.map { tokens.intern($0) })
            topic.observed = topic.observed.union(subscribed).subtracting(unsubscribed)
            // Seen to leave on their own: an opt-out, until seen to come back on their own.
            topic.optedOut = topic.optedOut.union(unsubscribed).subtracting(subscribed)
            topics[delta.topic] = topic
        }
        let newlyDead = TokenSet(observations.dead.map { tokens.intern($0) })
        dead = dead.union(newlyDead).subtracting(TokenSet(observations.revived.map { tokens.intern($0) }))
        if !newlyDead.isEmpty {
            for name in topics.keys {
                topics[name]!.observed.subtract(newlyDead)
                topics[name]!.managed.subtract(newlyDead)
                topics[name]!.optedOut.subtract(newlyDead)
            }
        }
        for entry in observations.groupKeys {
            var group = groups[entry.group] ?? GroupState(key: nil)
            group.key = entry.key
            // A vanished device group lost its members; an audience keeps its own.
            if entry.key == nil, !group.audience { group.members = TokenSet() }
            groups[entry.group] = group
        }
        growToTable()
        if let at = observations.refreshedAt {
            for id in seen where !dead.contains(id) { seenAt[Int(id)] = at }
        }
    }

    /// Records what a refresh saw, that `read` was read then, and a saved plan's sweep when given;
    /// returns the tokens whose rows changed (to be written).
    public mutating func recordReads(
        _ observations: Observations, read: TokenSet, swept: SweptRegistrations?
    )
        -> [UInt32]
    {
        apply(observations, seen: read)
        if let swept { noteRead(swept.ids, at: swept.at) }
        return read.ids + (swept?.ids.ids ?? [])
            + (observations.dead + observations.revived).compactMap { tokens.id($0) }
    }

    /// Records that `ids` were read at `at` (a saved plan's sweep), keeping any later read.
    private mutating func noteRead(_ ids: TokenSet, at: Int64) {
        growToTable()
        for id in ids where Int(id) < seenAt.count && !dead.contains(id) { seenAt[Int(id)] = max(seenAt[Int(id)], at) }
    }

    /// Marks `ids` dead (FCM answered that it does not know them) and takes them out of every topic;
    /// returns the topics whose memberships changed.
    @discardableResult
    public mutating func markDead(_ ids: TokenSet) -> Set<String> {
        guard !ids.isEmpty else { return [] }
        growToTable()
        dead.formUnion(ids)
        var changed: Set<String> = []
        for name in topics.keys {
            let counts = (topics[name]!.observed.count, topics[name]!.managed.count)
            topics[name]!.observed.subtract(ids)
            topics[name]!.managed.subtract(ids)
            if (topics[name]!.observed.count, topics[name]!.managed.count) != counts { changed.insert(name) }
        }
        return changed
    }

    /// Records the outcome of one executed operation; returns the topics whose memberships changed.
    @discardableResult
    ///
    /// With `markDead: false`, a token answered as unregistered is left as it was (neither changed nor
    /// marked dead): an apply holds such answers back until its dead-token guard has judged them.
    public mutating func record(
        _ operation: PlannedOperation, outcomes: [TokenOutcome], groupKey: String?, markDead: Bool = true
    )
        -> Set<String>
    {
        var changedTopics: Set<String> = []
        let ids = operation.tokens.map { tokens.intern($0) }
        growToTable()
        switch operation.kind {
        case .subscribe, .unsubscribe:
            var succeeded: [UInt32] = []
            var gone: [UInt32] = []
            for (id, outcome) in zip(ids, outcomes) {
                switch outcome {
                case .ok: succeeded.append(id)
                // Only an unknown registration is dead; an invalid argument or a full device is alive.
                case .failed(let error) where error.meansUnregistered: gone.append(id)
                case .failed: break
                }
            }
            var topic = topics[operation.target] ?? TopicState()
            let done = TokenSet(succeeded)
            if operation.kind == .subscribe {
                topic.observed.formUnion(done)
                topic.managed.formUnion(done)
                topic.optedOut.subtract(done)
            } else {
                topic.observed.subtract(done)
                topic.managed.subtract(done)
            }
            topics[operation.target] = topic
            changedTopics.insert(operation.target)
            if markDead { changedTopics.formUnion(self.markDead(TokenSet(gone))) }
        case .groupCreate, .groupAdd:
            var group = groups[operation.target] ?? GroupState(key: nil)
            group.key = groupKey ?? group.key
            group.members.formUnion(TokenSet(ids))
            groups[operation.target] = group
        case .groupRemove:
            var group = groups[operation.target] ?? GroupState(key: nil)
            group.members.subtract(TokenSet(ids))
            if group.members.isEmpty {
                // FCM deleted the emptied group. An audience outlives the group it was converted
                // from (its members are set again by the audience step that follows), and what
                // `groups export` read is kept: FCM keeps no copy.
                if group.audience || group.exported != nil {
                    group.key = nil
                    groups[operation.target] = group
                } else {
                    groups[operation.target] = nil
                }
            } else {
                groups[operation.target] = group
            }
        case .audienceSet:
            var group = groups[operation.target] ?? GroupState(key: nil)
            // A device group converted keeps its key (while the FCM group lives) and its export.
            group.audience = true
            group.members = TokenSet(ids)
            groups[operation.target] = group
        case .audienceDelete:
            groups[operation.target] = nil
        case .audienceUnlink:
            groups[operation.target]?.key = nil
        }
        return changedTopics
    }

    /// Before an apply: adopt declared memberships already in place, forget managed ones that are gone,
    /// and record each declared topic's mode. The planned removals stay managed until they run.
    /// A partial plan's bookkeeping touches only the topics and groups it `targets`.
    public mutating func reconcileBookkeeping(
        with desired: DesiredState, operations: [PlannedOperation],
        targets: Targets = .all
    ) {
        var removals: [String: TokenSet] = [:]
        for op in operations where op.kind == .unsubscribe {
            removals[op.target, default: TokenSet()].formUnion(TokenSet(op.tokens.compactMap { tokens.id($0) }))
        }
        var declared = Set<String>()
        for spec in desired.topics {
            declared.insert(spec.name)
            guard targets.coversTopic(spec.name) else { continue }
            var topic = topics[spec.name] ?? TopicState()
            let live = spec.members.subtracting(dead)
            let pending = removals[spec.name] ?? TokenSet()
            topic.managed = topic.managed.intersection(live.union(pending)).union(live.intersection(topic.observed))
            topic.mode = spec.mode
            topic.protect = spec.protect
            // Opt-outs matter only for declared members.
            topic.optedOut = topic.optedOut.intersection(spec.members)
            topics[spec.name] = topic
        }
        for name in Array(topics.keys) where !declared.contains(name) && targets.coversTopic(name) {
            topics[name]!.managed = topics[name]!.managed.intersection(removals[name] ?? TokenSet())
            if topics[name]!.managed.isEmpty, topics[name]!.observed.isEmpty { topics[name] = nil }
        }
        for spec in desired.groups where targets.coversGroup(spec.name) {
            // A group about to be created keeps its protection from the start.
            if groups[spec.name] == nil, spec.protect { groups[spec.name] = GroupState(key: nil) }
            groups[spec.name]?.protect = spec.protect
        }
        for spec in desired.audiences where targets.coversGroup(spec.name) {
            // Only an audience that exists: a new one is made by its audience step.
            groups[spec.name]?.protect = spec.protect
        }
    }
}
