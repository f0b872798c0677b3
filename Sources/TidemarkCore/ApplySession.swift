import Foundation

/// Journals an apply: each finished operation updates state and commits with its journal entry.
public actor ApplySession: ApplyRecorder {
    public nonisolated let id: String
    private let store: any StateStore
    private let timing: Timing
    public private(set) var state: State
    /// Saves run one at a time, in the order they were asked for: the actor is reentrant at every
    /// `await`, and a save from an older snapshot must never land after a newer one.
    private var saving = false
    private var waiting: [CheckedContinuation<Void, Never>] = []
    /// Operations that got part of the way: tokens sent, and of them how many changed and failed.
    private var partial: [Int: (tokens: Int, ok: Int, failed: Int)]

    init(id: String, store: any StateStore, state: State, timing: Timing, progress: [Int: OperationProgress] = [:]) {
        self.id = id
        self.store = store
        self.state = state
        self.timing = timing
        self.partial = progress.mapValues { ($0.tokensDone, $0.ok, $0.failed) }
    }

    /// Starts a new apply: records the plan's observations and bookkeeping with the journal header, in
    /// one save. A state that does not exist yet is created by that save.
    public static func begin(
        plan: Plan, desired: DesiredState, store: any StateStore, state: State,
        timing: Timing = .live, inventory: Inventory? = nil, read: TokenSet = TokenSet(),
        swept: SweptRegistrations? = nil
    ) async throws -> ApplySession {
        let now = timing.unixTime()
        let before = state
        var state = state
        state.backend = state.backend ?? plan.backend
        state.growToTable()
        var devicesChanged = inventory.map { state.recordDevices($0) } ?? []
        PhaseTrace.mark("journal: devices recorded")
        if inventory != nil { devicesChanged += state.noteDepartures(declared: desired.knownTokens, at: now) }
        PhaseTrace.mark("journal: departures noted")
        // Only what was read is recorded as read: a partial refresh leaves the rest's times alone.
        let readTokens = state.recordReads(plan.observations, read: read, swept: swept)
        PhaseTrace.mark("journal: reads recorded")
        state.reconcileBookkeeping(with: desired, operations: plan.operations, targets: try plan.selection)
        PhaseTrace.mark("journal: bookkeeping reconciled")
        var write = StateWrite()
        write.includeTopicsAndGroups(before: before, after: state)
        PhaseTrace.mark("journal: \(write.topics.count) topics, \(write.groups.count) groups to write")
        if !read.isEmpty, read.count >= state.tokens.count {
            write.allTokens = true
        } else {
            write.tokens = readTokens + devicesChanged
        }
        let id = timing.uuid()
        write.beginApply = (id, plan)
        try await store.save(&state, write, at: now)
        return ApplySession(id: id, store: store, state: state, timing: timing)
    }

    /// Continues an apply that was interrupted.
    public static func resume(
        _ unfinished: UnfinishedApply, store: any StateStore, state: State,
        timing: Timing = .live
    ) -> ApplySession {
        ApplySession(id: unfinished.id, store: store, state: state, timing: timing, progress: unfinished.progress)
    }

    /// Steps finished and not yet saved, with the callers waiting for them.
    private var queued: [(step: OperationStep, done: CheckedContinuation<Void, any Error>)] = []

    /// Records a finished step of an operation in state and journals it; callable from many tasks, and
    /// returns once the step is durable. Steps that finish while a save is running are committed
    /// together by the next one (a group commit): a save rewrites the rows of the topics it touches,
    /// which for a topic of a million members costs far more than one step of requests, so one save
    /// per step would pace an apply below FCM's quota. The operation's last step journals it as
    /// finished, with the counts of all its steps.
    public func recorded(_ step: OperationStep) async throws {
        try await withCheckedThrowingContinuation { (done: CheckedContinuation<Void, any Error>) in
            queued.append((step, done))
            if queued.count == 1 { Task { await self.commitQueued() } }
        }
    }

    /// Saves every queued step in one write, once the save before it finished.
    private func commitQueued() async {
        try? await oneAtATime {
            let batch = queued
            queued = []
            guard !batch.isEmpty else { return }
            do {
                try await save(batch.map(\.step))
                for entry in batch { entry.done.resume() }
            } catch {
                for entry in batch { entry.done.resume(throwing: error) }
            }
        }
    }

    private func save(_ steps: [OperationStep]) async throws {
        let at = timing.unixTime()
        var next = state
        var parts = partial
        var topics: Set<String> = []
        var groups: Set<String> = []
        var write = StateWrite()
        var progress: [Int: OperationProgress] = [:]
        for step in steps {
            let part = step.part
            topics.formUnion(next.record(part, outcomes: step.outcomes, groupKey: step.groupKey))
            if part.kind.isGroup { groups.insert(part.target) }
            write.tokens += part.tokens.compactMap { next.tokens.id($0) }
            let before = parts[step.index] ?? (0, 0, 0)
            let succeeded = step.outcomes.filter(\.isOK).count
            let ok = before.ok + succeeded
            let failed = before.failed + step.outcomes.count - succeeded
            if step.finishesOperation {
                write.finishedOperations.append(JournalEntry(applyID: id, index: step.index, ok: ok, failed: failed))
                progress[step.index] = nil
                parts[step.index] = nil
            } else {
                let done = step.from + step.outcomes.count
                progress[step.index] = OperationProgress(
                    applyID: id, index: step.index, tokensDone: done, ok: ok, failed: failed)
                parts[step.index] = (done, ok, failed)
            }
        }
        write.topics = topics.sorted()
        write.groups = groups.sorted()
        write.operationProgress = progress.keys.sorted().map { progress[$0]! }
        try await store.save(&next, write, at: at)
        state = next
        partial = parts
    }

    /// Gives up an interrupted apply. Its unfinished subscribes may have happened in part (a batch in
    /// flight when it was killed), so their tokens not yet journaled are recorded as managed in their
    /// topics: the next plan then removes whatever of them the manifests no longer declare, and
    /// ownership stays exact.
    public func abandon(_ unfinished: UnfinishedApply) async throws {
        try await oneAtATime {
            var next = state
            var write = StateWrite()
            for (index, op) in unfinished.plan.operations.enumerated()
            where op.kind == .subscribe && !unfinished.done.contains(index) {
                let from = min(unfinished.progress[index]?.tokensDone ?? 0, op.tokens.count)
                let ids = TokenSet(op.tokens[from...].map { next.tokens.intern($0) })
                next.growToTable()
                var topic = next.topics[op.target] ?? TopicState()
                topic.managed.formUnion(ids)
                next.topics[op.target] = topic
                write.topics.append(op.target)
            }
            write.finishApply = (id, .abandoned)
            try await store.save(&next, write, at: timing.unixTime())
            state = next
        }
    }

    /// Marks the apply finished (or abandoned) in the journal.
    public func finish(status: ApplyStatus = .finished) async throws {
        try await oneAtATime {
            var next = state
            var write = StateWrite()
            write.finishApply = (id, status)
            try await store.save(&next, write, at: timing.unixTime())
            state = next
        }
    }

    private func oneAtATime(_ body: () async throws -> Void) async throws {
        while saving { await withCheckedContinuation { waiting.append($0) } }
        saving = true
        defer {
            saving = false
            if !waiting.isEmpty { waiting.removeFirst().resume() }
        }
        try await body()
    }
}
