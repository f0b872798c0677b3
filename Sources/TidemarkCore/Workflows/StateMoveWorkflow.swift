import Foundation

/// What a `tidemark state mv` journals on each side while it runs: the intent that the next run of
/// the same command finishes, and that every other command on either side refuses to act past.
public struct StateMoveRecord: Sendable, Codable, Equatable {
    /// Which side of the move a journal entry is on.
    public enum Side: String, Sendable, Codable {
        /// The state the entry leaves.
        case source
        /// The state the entry joins.
        case target
    }

    /// The move's id, the same on both sides.
    public var id: String
    /// `topic:NAME`, `group:NAME` or `audience:NAME`.
    public var address: String
    /// Which side this journal entry is on.
    public var side: Side
    /// The state it leaves, as messages name it (a path or a redacted URL, and the workspace).
    public var from: String
    /// The state it joins.
    public var to: String

    /// The record of move `id` of `address` from `from` to `to`, on `side`.
    public init(id: String, address: String, side: Side, from: String, to: String) {
        self.id = id
        self.address = address
        self.side = side
        self.from = from
        self.to = to
    }
}

/// What `tidemark state mv` moved.
public struct StateMoveOutcome: Sendable {
    /// What moved, with its counts.
    public var moved: ReleasedEntry
    /// Whether this run finished a move an earlier run started (it was interrupted).
    public var resumed: Bool
    /// The serials written: the source's and the target's.
    public var serials: (source: Int, target: Int)
}

/// `tidemark state mv ADDRESS --to-workspace W [--to-state URL]`: moves a topic, device group or
/// audience, with its tokens (when each was last seen, its device, when it left) and memberships,
/// from one state to another: another workspace of the same store, or another store. Nothing is
/// sent to FCM.
///
/// Four writes, each one transaction: the source journals the move, the target takes the entry and
/// journals it, the source lets the entry go and closes its journal, the target closes its journal.
/// A run killed between any two leaves both journals saying what is left; every other command on
/// either side refuses while they do (so the entry is never acted on in two places), and running the
/// same `state mv` again finishes it. The caller holds both states' locks.
public struct StateMoveWorkflow: Sendable {
    /// The state the entry leaves.
    public var source: any StateStore
    /// The state the entry joins.
    public var target: any StateStore
    /// The source as messages name it (with its workspace).
    public var sourceName: String
    /// The target as messages name it (with its workspace).
    public var targetName: String
    /// The clock and the ids of the writes.
    public var timing: Timing
    /// The version journaled with the move.
    public var tidemarkVersion: String
    /// Called after each of the four writes with its number (1–4): where a test stops the move as a
    /// kill would.
    public var afterWrite: @Sendable (Int) async throws -> Void = { _ in }

    /// A move from `source` to `target`.
    public init(
        source: any StateStore, target: any StateStore, sourceName: String, targetName: String,
        timing: Timing = .live, tidemarkVersion: String
    ) {
        self.source = source
        self.target = target
        self.sourceName = sourceName
        self.targetName = targetName
        self.timing = timing
        self.tidemarkVersion = tidemarkVersion
    }

    /// Moves `address`, or finishes the interrupted move of it.
    public func run(_ address: StateAddress) async throws -> StateMoveOutcome {
        let sourcePending = try await source.unfinishedApply()
        let targetPending = try await target.unfinishedApply()
        for (pending, side) in [(sourcePending, StateMoveRecord.Side.source), (targetPending, .target)] {
            guard let pending else { continue }
            // Only this move's own journal may be pending: anything else is finished first.
            guard let move = pending.plan.move, move.address == address.description, move.side == side,
                move.from == sourceName, move.to == targetName
            else { throw WorkflowError.unfinished(pending, at: side == .source ? sourceName : targetName) }
        }
        if let s = sourcePending?.plan.move, let t = targetPending?.plan.move, s.id != t.id {
            throw WorkflowError.unfinished(targetPending!, at: targetName)
        }
        var from = try await source.load() ?? State()
        var to = try await target.load() ?? State()
        let id = sourcePending?.id ?? targetPending?.id ?? timing.uuid()
        let resumed = sourcePending != nil || targetPending != nil
        // The source's FCM project (checked against the target's below); what a new target state takes.
        let backend = from.backend ?? to.backend ?? BackendIdentity(kind: .embedded, project: "unknown")
        let journal = { (side: StateMoveRecord.Side, state: State) in
            plan(
                StateMoveRecord(id: id, address: address.description, side: side, from: sourceName, to: targetName),
                address, state: state, backend: backend)
        }

        // The order of the writes decides what a pending journal means: the source journals first and
        // closes third, so a target journal pending without a source one means the source let go.
        let step =
            switch (sourcePending, targetPending) {
            case (nil, nil): 1
            case (.some, nil): 2
            case (.some, .some): 3
            case (nil, .some): 4
            }
        if step == 1 {
            guard from.holds(address) else {
                throw WorkflowError.notInState([(address.description, "")], location: sourceName)
            }
            guard !to.holds(address) else { throw WorkflowError.targetHolds(address.description, location: targetName) }
            if let a = from.backend, let b = to.backend, a != b {
                throw WorkflowError.stateOfAnotherBackend(location: targetName, state: b, now: a)
            }
            // Two workspaces of one database: both writes in one transaction, with no journal.
            var (taken, takenWrite) = taking(address, from: from, into: to, backend: backend)
            var (left, leftWrite, entry) = lettingGo(address, from: from)
            if let source = source as? any JointSaving {
                do {
                    let serials = try await source.saveTogether(
                        &left, leftWrite, with: target, &taken, takenWrite, at: timing.unixTime())
                    let moved = entry ?? ReleasedEntry(address: address.description, managed: 0, observed: 0)
                    return StateMoveOutcome(moved: moved, resumed: false, serials: serials)
                } catch let error as StateStoreError where error.code == .unsupported {}
            }
            var write = StateWrite()
            write.beginApply = (id, journal(.source, from))
            try await source.save(&from, write, at: timing.unixTime())
            try await afterWrite(1)
        }
        if step <= 2 {
            guard !to.holds(address) else {
                // The target came to hold one of its own while the move waited (its own apply): undone,
                // the source keeps its entry, and nothing is in two places.
                var write = StateWrite()
                write.finishApply = (id, .abandoned)
                try await source.save(&from, write, at: timing.unixTime())
                throw WorkflowError.targetHolds(address.description, location: targetName, undone: true)
            }
            var write: StateWrite
            (to, write) = taking(address, from: from, into: to, backend: backend)
            write.beginApply = (id, journal(.target, to))
            try await target.save(&to, write, at: timing.unixTime())
            try await afterWrite(2)
        }
        var moved = to.entry(address)
        if step <= 3 {
            var write: StateWrite
            let entry: ReleasedEntry?
            (from, write, entry) = lettingGo(address, from: from)
            moved = entry ?? moved
            write.finishApply = (id, .finished)
            try await source.save(&from, write, at: timing.unixTime())
            try await afterWrite(3)
        }
        var write = StateWrite()
        write.finishApply = (id, .finished)
        try await target.save(&to, write, at: timing.unixTime())
        try await afterWrite(4)
        let entry = moved ?? ReleasedEntry(address: address.description, managed: 0, observed: 0)
        return StateMoveOutcome(moved: entry, resumed: resumed, serials: (from.serial, to.serial))
    }

    /// `state` once it has taken the entry at `address` from `source`, and the write that saves that.
    private func taking(
        _ address: StateAddress, from source: State, into state: State, backend: BackendIdentity
    ) -> (State, StateWrite) {
        var next = state
        next.claim(backend: backend, lineage: timing.uuid())
        var write = StateWrite()
        write.tokens = next.receive(address, from: source)
        write.includeTopicsAndGroups(before: state, after: next)
        return (next, write)
    }

    /// `state` once it has let the entry at `address` go, the write that saves that, and what it held.
    private func lettingGo(_ address: StateAddress, from state: State) -> (State, StateWrite, ReleasedEntry?) {
        var next = state
        let entry: ReleasedEntry? = if case .released(let entry) = next.release(address) { entry } else { nil }
        var write = StateWrite()
        write.includeTopicsAndGroups(before: state, after: next)
        return (next, write, entry)
    }

    /// The journal entry of one side: a plan with no call to FCM, carrying the move (the source's
    /// names the release it is about to make).
    private func plan(
        _ move: StateMoveRecord, _ address: StateAddress, state: State, backend: BackendIdentity
    ) -> Plan {
        let kind: PlannedOperation.Kind = address.kind == .topic ? .topicRelease : .groupRelease
        var plan = Plan(
            tidemarkVersion: tidemarkVersion, createdAt: timing.wallClock(), lineage: state.lineage,
            serial: state.serial, manifestsDigest: "state-mv", backend: state.backend ?? backend, refreshed: false,
            operations: move.side == .source ? [PlannedOperation(kind: kind, target: address.name, tokens: [])] : [],
            topics: [], groups: [], diagnostics: [], observations: Observations())
        plan.move = move
        return plan
    }
}

extension State {
    /// Whether state holds the topic, device group or audience at `address`: a topic only when it
    /// manages it (`TopicState.isManaged`), not when a refresh only saw it.
    public func holds(_ address: StateAddress) -> Bool {
        switch address.kind {
        case .topic: topics[address.name]?.isManaged ?? false
        case .group: groups[address.name].map { !$0.audience } ?? false
        case .audience: groups[address.name]?.audience ?? false
        }
    }

    /// Takes the entry at `address` as `source` holds it, interning its tokens with what `source`
    /// knows of each (when it was last seen, its device, when it left) where this state knows less;
    /// returns the tokens to write.
    public mutating func receive(_ address: StateAddress, from source: State) -> [UInt32] {
        var written: [UInt32] = []
        func map(_ set: TokenSet) -> TokenSet {
            var ids: [UInt32] = []
            for id in set {
                let index = Int(id)
                let own = intern(source.tokens[id])
                if seenAt[Int(own)] < source.seenAt[index] { setSeen(own, at: source.seenAt[index]) }
                if deviceIDs[Int(own)].isEmpty, !source.deviceIDs[index].isEmpty {
                    setDeviceID(own, source.deviceIDs[index])
                }
                if leftAt[Int(own)] == 0, source.leftAt[index] != 0 { setLeft(own, at: source.leftAt[index]) }
                ids.append(own)
                written.append(own)
            }
            return TokenSet(ids)
        }
        switch address.kind {
        case .topic:
            guard let topic = source.topics[address.name] else { return [] }
            // What this state saw of the topic on its own (it did not manage it) is kept beside it.
            let seen = topics[address.name]
            setTopic(
                address.name,
                TopicState(
                    mode: topic.mode, protect: topic.protect, managed: map(topic.managed),
                    observed: map(topic.observed).union(seen?.observed ?? TokenSet()),
                    optedOut: map(topic.optedOut).union(seen?.optedOut ?? TokenSet())))
        case .group, .audience:
            guard let group = source.groups[address.name] else { return [] }
            setGroup(
                address.name,
                GroupState(
                    key: group.key, protect: group.protect, members: map(group.members), audience: group.audience,
                    exported: group.exported.map(map), exportedAt: group.exportedAt))
        }
        return written
    }
}
