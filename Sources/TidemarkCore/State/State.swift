import Foundation

/// What tidemark remembers of a topic: the memberships it made and those it last saw.
public struct TopicState: Sendable, Equatable {
    /// Authoritative (tidemark removes anyone undeclared) or additive (only its own).
    public var mode: TopicMode
    /// A protected topic never loses members without `--allow-protected`.
    public var protect: Bool
    /// Memberships tidemark made or adopted; an additive topic removes these when no longer declared.
    public var managed: TokenSet
    /// Memberships seen by the last refresh or made by the last apply.
    public var observed: TokenSet
    /// Devices seen to unsubscribe themselves (outside tidemark) and not seen subscribed since: a topic
    /// with `opt_outs: respect` leaves them alone.
    public var optedOut: TokenSet

    /// The same topic with its sets cut down to the tokens of `scope`.
    public func restricted(to scope: TokenSet) -> TopicState {
        TopicState(
            mode: mode, protect: protect, managed: managed.intersection(scope), observed: observed.intersection(scope),
            optedOut: optedOut.intersection(scope))
    }

    /// Whether tidemark manages the topic: it made or adopted memberships there, or an apply recorded
    /// it as protected or authoritative. A topic state only saw (a refresh notes every topic a
    /// registration is in) is not managed.
    public var isManaged: Bool { !managed.isEmpty || protect || mode == .authoritative }

    /// A topic's state; empty sets by default.
    public init(
        mode: TopicMode = .additive, protect: Bool = false, managed: TokenSet = TokenSet(),
        observed: TokenSet = TokenSet(), optedOut: TokenSet = TokenSet()
    ) {
        self.mode = mode
        self.protect = protect
        self.managed = managed
        self.observed = observed
        self.optedOut = optedOut
    }
}

/// What tidemark remembers of a device group, or of an audience (a named set of devices with no
/// FCM group behind it, which shares the groups' names).
public struct GroupState: Sendable, Equatable {
    /// The notification key FCM returned; nil when the group is not known to exist. For an audience:
    /// the FCM group it was converted from, while that group lives (until retired or turned down).
    public var key: String?
    /// A protected group never loses members without `--allow-protected`.
    public var protect: Bool
    /// A device group: the members tidemark made. An audience: its members (and, while `key` is
    /// set, the FCM group's, which tidemark keeps in step until the group is retired).
    public var members: TokenSet
    /// A tidemark audience rather than an FCM device group.
    public var audience: Bool
    /// Every token FCM's export call listed for the group (members the app added included), when
    /// `groups export` last read it; nil when never exported.
    public var exported: TokenSet?
    /// When `exported` was read (seconds since 1970); 0 when never.
    public var exportedAt: Int64

    /// A group's (or audience's) state.
    public init(
        key: String?, protect: Bool = false, members: TokenSet = TokenSet(), audience: Bool = false,
        exported: TokenSet? = nil, exportedAt: Int64 = 0
    ) {
        self.key = key
        self.protect = protect
        self.members = members
        self.audience = audience
        self.exported = exported
        self.exportedAt = exportedAt
    }
}

/// tidemark's state: identity, managed and observed memberships, groups, token liveness.
///
/// Token ids index `tokens`; the planner interns the manifests' tokens into the same registry
/// (`State` is `TokenInterning`). Fields change only through the named operations below and in
/// `State+Observations.swift`, which keep the sets, the token columns and the versions in step.
public struct State: Sendable {
    /// Fixed for the life of a state; a plan from another lineage is refused.
    public private(set) var lineage: String
    /// Bumped on every write; a saved plan records the serial it was made from.
    public private(set) var serial: Int
    /// Every token state knows, interned (the ids its sets hold), with what is kept per token.
    public private(set) var tokens: TokenRegistry
    /// Tokens FCM reported as unregistered (NOT_FOUND).
    public private(set) var dead: TokenSet
    /// The topics tidemark manages, by name.
    public private(set) var topics: [String: TopicState]
    /// The device groups and audiences tidemark manages, by name.
    public private(set) var groups: [String: GroupState]
    /// The FCM project and backend this state belongs to (recorded by the first write); a run against
    /// another is refused.
    public private(set) var backend: BackendIdentity?
    /// The serial at which each topic and group last changed, by `State.versionKey`: a saved plan stays
    /// valid while the serial moved only in topics and groups it does not touch.
    public private(set) var versions: [String: Int]
    /// The devices each inventory source read (after `exclude_if`) when the last apply finished, by
    /// source name: what the shrink guard compares the next read with.
    public private(set) var inventoryRows: [String: Int]

    /// Seconds since 1970 when each token was last seen by a refresh or an apply; 0 = never.
    public var seenAt: [Int64] { tokens.seenAt }
    /// The inventory's device id of each token ("" when unknown); see `TokenRegistry.deviceIDs`.
    public var deviceIDs: [String] { tokens.deviceIDs }
    /// When each token stopped being declared (0 while declared); see `TokenRegistry.leftAt`.
    public var leftAt: [Int64] { tokens.leftAt }

    /// `inventoryRows` as stored: JSON with sorted keys, empty when there are none.
    public var inventoryRowsText: String {
        guard !inventoryRows.isEmpty,
            let data = try? JSONSerialization.data(withJSONObject: inventoryRows, options: [.sortedKeys])
        else { return "" }
        return String(decoding: data, as: UTF8.self)
    }

    /// Reads `inventoryRowsText`; nil when it is not what tidemark writes.
    public static func inventoryRows(from text: String) -> [String: Int]? {
        if text.isEmpty { return [:] }
        guard let object = try? JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any] else {
            return nil
        }
        var rows: [String: Int] = [:]
        for (key, value) in object {
            guard let number = value as? NSNumber, let count = Int(exactly: number.doubleValue), count >= 0 else {
                return nil
            }
            rows[key] = count
        }
        return rows
    }

    /// The key of a topic's or group's version.
    public static func versionKey(_ kind: Targets.Kind, _ name: String) -> String { "\(kind.rawValue):\(name)" }

    /// A state that was never saved has an empty lineage; the first save gives it one (drawn from
    /// the injected `Timing`, so nothing here draws randomness). Stores build what they load with
    /// every field; sets must hold only ids of `tokens`.
    public init(
        lineage: String = "", serial: Int = 0, tokens: TokenRegistry = TokenRegistry(),
        dead: TokenSet = TokenSet(), topics: [String: TopicState] = [:], groups: [String: GroupState] = [:],
        backend: BackendIdentity? = nil, versions: [String: Int] = [:], inventoryRows: [String: Int] = [:]
    ) {
        self.lineage = lineage
        self.serial = serial
        self.tokens = tokens
        self.dead = dead
        self.topics = topics
        self.groups = groups
        self.backend = backend
        self.versions = versions
        self.inventoryRows = inventoryRows
    }

    /// Notes which tokens stopped (or started again) being declared; returns the tokens whose
    /// `leftAt` changed (to be written). Proportional to the churn in writes, not to the fleet.
    public mutating func noteDepartures(declared: TokenSet, at now: Int64) -> [UInt32] {
        var changed: [UInt32] = []
        var next = declared.makeIterator()
        var upcoming = next.next()
        for index in 0..<tokens.count {
            let id = UInt32(index)
            while let d = upcoming, d < id { upcoming = next.next() }
            let isDeclared = upcoming == id
            if isDeclared, leftAt[index] != 0 {
                tokens.setLeft(id, at: 0)
                changed.append(id)
            } else if !isDeclared, leftAt[index] == 0 {
                tokens.setLeft(id, at: now)
                changed.append(id)
            }
        }
        return changed
    }

    /// The device id of a token, when known.
    public func deviceID(of id: UInt32) -> String? { tokens.deviceID(of: id) }

    /// Records which device each of the inventory's tokens belongs to; returns the tokens whose device
    /// id changed (to be written). Tokens are interned when new.
    public mutating func recordDevices(_ inventory: Inventory) -> [UInt32] {
        var changed: [UInt32] = []
        for (index, token) in inventory.tokens.enumerated() {
            let id = tokens.intern(token)
            if deviceIDs[Int(id)] != inventory.deviceIDs[index] {
                tokens.setDeviceID(id, inventory.deviceIDs[index])
                changed.append(id)
            }
        }
        return changed
    }

    /// Memberships tidemark knows of: observed subscriptions over every topic.
    public var observedMembershipCount: Int { topics.values.reduce(0) { $0 + $1.observed.count } }

    /// The topics each token is observed in, counted; used for the 2000-topic cap.
    func observedTopicCounts() -> [UInt16] {
        var counts = [UInt16](repeating: 0, count: tokens.count)
        for topic in topics.values {
            for id in topic.observed where Int(id) < counts.count { counts[Int(id)] &+= 1 }
        }
        return counts
    }
}

extension State {
    /// The id of `token` in state's registry, adding it when new.
    @discardableResult
    public mutating func intern(_ token: String) -> UInt32 { tokens.intern(token) }

    /// Lends the token registry to `body` to intern tokens into it (manifests resolved into the ids
    /// state uses). The registry only grows, and keeps its columns in step itself.
    public mutating func interning<R>(_ body: (inout TokenRegistry) throws -> R) rethrows -> R {
        try body(&tokens)
    }

    /// `interning` for a body that waits (manifests read while they are resolved).
    public mutating func interning<R>(_ body: (inout TokenRegistry) async throws -> R) async rethrows -> R {
        try await body(&tokens)
    }

    /// Records that token `id` was seen at `at` (seconds since 1970).
    public mutating func setSeen(_ id: UInt32, at: Int64) { tokens.setSeen(id, at: at) }

    /// Records the device token `id` belongs to ("" when unknown).
    public mutating func setDeviceID(_ id: UInt32, _ deviceID: String) { tokens.setDeviceID(id, deviceID) }

    /// Records when token `id` stopped being declared (0: declared again).
    public mutating func setLeft(_ id: UInt32, at: Int64) { tokens.setLeft(id, at: at) }

    /// Sets topic `name` as given (nil forgets it): for importing state and for fixtures. Its sets must
    /// hold only ids of `tokens`.
    public mutating func setTopic(_ name: String, _ topic: TopicState?) {
        if let topic { precondition(holdsKnownIDs(topic.managed, topic.observed, topic.optedOut)) }
        topics[name] = topic
    }

    /// Changes topic `name` (empty when state does not know it) through `body`: for fixtures. Its sets
    /// must hold only ids of `tokens` afterwards.
    public mutating func updateTopic(_ name: String, _ body: (inout TopicState) -> Void) {
        var topic = topics[name] ?? TopicState()
        body(&topic)
        setTopic(name, topic)
    }

    /// Sets group (or audience) `name` as given (nil forgets it): for importing state and for
    /// fixtures. Its sets must hold only ids of `tokens`.
    public mutating func setGroup(_ name: String, _ group: GroupState?) {
        if let group { precondition(holdsKnownIDs(group.members, group.exported ?? TokenSet())) }
        groups[name] = group
    }

    /// Sets which tokens are dead as given, leaving the topics alone (`markDead` takes dead tokens out
    /// of them): for importing state and for fixtures.
    public mutating func setDead(_ ids: TokenSet) {
        precondition(holdsKnownIDs(ids))
        dead = ids
    }

    /// Whether every id of `sets` is one of `tokens` (sets are sorted: the last id decides).
    private func holdsKnownIDs(_ sets: TokenSet...) -> Bool {
        sets.allSatisfy { set in set.ids.last.map { Int($0) < tokens.count } ?? true }
    }

    /// Records a store's write: the new serial, and the versions of the topics and groups it wrote
    /// (`versionKeys`), unless the write restored a state as it was (its versions came with it).
    public mutating func saved(serial: Int, versionKeys: [String], restored: Bool = false) {
        self.serial = serial
        if !restored { for key in versionKeys { versions[key] = serial } }
    }
}

// MARK: - What refreshes and applies record

extension State {
    /// Records what `refresh` read and returns how it differed from what state remembered.
    @discardableResult
    public mutating func recordRefresh(_ refresh: RefreshResult) -> Observations {
        let observations = observations(from: refresh)
        recordObservations(observations, seen: refresh.refreshed)
        return observations
    }

    /// Records observations in state: observed memberships, dead tokens, group keys and when tokens were seen.
    ///
    /// `seen` are the tokens the refresh read; they get `refreshedAt` as their last-seen time.
    public mutating func recordObservations(_ observations: Observations, seen: TokenSet = TokenSet()) {
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
        if let at = observations.refreshedAt {
            for id in seen where !dead.contains(id) { tokens.setSeen(id, at: at) }
        }
    }

    /// Records what a refresh saw, that `read` was read then, and a saved plan's sweep when given;
    /// returns the tokens whose rows changed (to be written).
    public mutating func recordReads(
        _ observations: Observations, read: TokenSet, swept: SweptRegistrations?
    )
        -> [UInt32]
    {
        recordObservations(observations, seen: read)
        if let swept { noteRead(swept.ids, at: swept.at) }
        return read.ids + (swept?.ids.ids ?? [])
            + (observations.dead + observations.revived).compactMap { tokens.id($0) }
    }

    /// Records that `ids` were read at `at` (a saved plan's sweep), keeping any later read.
    private mutating func noteRead(_ ids: TokenSet, at: Int64) {
        for id in ids where Int(id) < tokens.count && !dead.contains(id) {
            tokens.setSeen(id, at: max(seenAt[Int(id)], at))
        }
    }

    /// Marks `ids` dead (FCM answered that it does not know them) and takes them out of every topic;
    /// returns the topics whose memberships changed.
    @discardableResult
    public mutating func markDead(_ ids: TokenSet) -> Set<String> {
        guard !ids.isEmpty else { return [] }
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
    public mutating func recordOutcome(
        _ operation: PlannedOperation, outcomes: [TokenOutcome], groupKey: String?, markDead: Bool = true
    )
        -> Set<String>
    {
        var changedTopics: Set<String> = []
        let ids = operation.tokens.map { tokens.intern($0) }
        switch operation.kind {
        // An adoption records what FCM holds as a subscribe records what it made (its outcomes are all ok).
        case .subscribe, .unsubscribe, .topicAdopt:
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
            if operation.kind != .unsubscribe {
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
        case .topicRelease:
            topics[operation.target] = nil
            changedTopics.insert(operation.target)
        case .groupRelease:
            groups[operation.target] = nil
        }
        return changedTopics
    }

    /// Before an apply: adopt declared memberships already in place, forget managed ones that are gone,
    /// and record each declared topic's mode. The planned removals stay managed until they run.
    /// A partial plan's bookkeeping touches only the topics and groups it `targets`.
    public mutating func prepareForApply(
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

    /// `tidemark import`: records what a refresh saw and adopts, for declared topics that `targets`
    /// covers, the observed memberships of declared members as tidemark's own. Never forgets
    /// anything it managed before; returns how many memberships were adopted per topic.
    @discardableResult
    public mutating func adopt(_ desired: DesiredState, targets: Targets = .all) -> [String: Int] {
        var adopted: [String: Int] = [:]
        for spec in desired.topics where targets.coversTopic(spec.name) {
            var topic = topics[spec.name] ?? TopicState()
            let found = spec.members.subtracting(dead).intersection(topic.observed).subtracting(topic.managed)
            topic.managed.formUnion(found)
            topic.mode = spec.mode
            topic.protect = spec.protect
            topics[spec.name] = topic
            if !found.isEmpty { adopted[spec.name] = found.count }
        }
        for spec in desired.groups where targets.coversGroup(spec.name) {
            groups[spec.name]?.protect = spec.protect
        }
        return adopted
    }

    /// An apply given up (`ApplySession.abandon`): with `read` (its in-flight registrations read from
    /// FCM since), each unfinished subscribe and unsubscribe takes what FCM holds for the tokens read;
    /// without it, the unfinished subscribes' tokens are recorded as managed, as the safe side.
    /// Returns the topics whose memberships changed.
    mutating func recordUnfinished(_ unfinished: UnfinishedApply, read: RefreshResult?) -> Set<String> {
        var changed: Set<String> = []
        for (index, op) in unfinished.plan.operations.enumerated()
        where (op.kind == .subscribe || op.kind == .unsubscribe) && !unfinished.done.contains(index) {
            let from = min(unfinished.progress[index]?.tokensDone ?? 0, op.tokens.count)
            let ids = TokenSet(op.tokens[from...].map { tokens.intern($0) })
            var topic = topics[op.target] ?? TopicState()
            if let read {
                let known = ids.intersection(read.refreshed).subtracting(read.dead)
                guard !known.isEmpty else { continue }
                let holds = known.intersection(read.subscribed[op.target] ?? TokenSet())
                let lacks = known.subtracting(holds)
                topic.observed = topic.observed.union(holds).subtracting(lacks)
                if op.kind == .subscribe {
                    topic.managed.formUnion(holds)
                    topic.optedOut.subtract(holds)
                } else {
                    topic.managed.subtract(lacks)
                    topic.optedOut.subtract(lacks)
                }
            } else {
                guard op.kind == .subscribe else { continue }
                topic.managed.formUnion(ids)
            }
            topics[op.target] = topic
            changed.insert(op.target)
        }
        return changed
    }

    /// Gives a state about to be saved for the first time the FCM project and backend it belongs to
    /// and its lineage (none when `lineage` is empty); a state that has them keeps them.
    public mutating func claim(backend: BackendIdentity, lineage: @autoclosure () -> String = "") {
        if self.lineage.isEmpty { self.lineage = lineage() }
        self.backend = self.backend ?? backend
    }

    /// Records the devices each inventory source read, for the next run's shrink guard.
    public mutating func recordInventoryRows(_ rows: [String: Int]) { inventoryRows = rows }

    /// Forgets the groups `isKept` rejects (device groups FCM no longer serves).
    public mutating func keepGroups(where isKept: (_ name: String, _ group: GroupState) -> Bool) {
        groups = groups.filter { isKept($0.key, $0.value) }
    }

    /// Records what `groups export` read of group `name`: every member token FCM listed, at `at`.
    /// A group state did not know is remembered with `key`.
    public mutating func recordExport(group name: String, key: String, members: [String], at: Int64) {
        var entry = groups[name] ?? GroupState(key: key)
        entry.key = entry.key ?? key
        entry.exported = TokenSet(members.map { tokens.intern($0) })
        entry.exportedAt = at
        groups[name] = entry
    }
}

extension State {
    /// The memberships tidemark manages: each topic's and each device group's or audience's members
    /// (`tidemark_managed_memberships`).
    public var managedMemberships: Int {
        topics.values.reduce(0) { $0 + $1.managed.count } + groups.values.reduce(0) { $0 + $1.members.count }
    }
}
