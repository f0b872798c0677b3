import Foundation

/// Journals an apply: each finished operation updates state and commits with its journal entry.
public actor ApplySession: ApplyRecorder {
    /// The apply's id in the journal (a random UUID).
    public nonisolated let id: String
    private let store: any StateStore
    private let timing: Timing
    /// State as the last save left it.
    public private(set) var state: State
    /// Saves run one at a time, in the order they were asked for: the actor is reentrant at every
    /// `await`, and a save from an older snapshot must never land after a newer one.
    private var saving = false
    private var waiting: [CheckedContinuation<Void, Never>] = []
    /// Operations that got part of the way: tokens sent, and of them how many changed and failed.
    private var partial: [Int: (tokens: Int, ok: Int, failed: Int)]
    /// FCM's own "unregistered" answers, held to the dead-token guard.
    private var answers: DeadAnswers
    /// Where the journal's saves run, beside the requests; nil saves in the task that waits for them.
    private let writer: JournalWriter?

    init(
        id: String, store: any StateStore, state: State, timing: Timing, progress: [Int: OperationProgress] = [:],
        answers: DeadAnswers = DeadAnswers(), writer: JournalWriter? = nil
    ) {
        self.id = id
        self.writer = writer
        self.store = store
        self.state = state
        self.timing = timing
        self.partial = progress.mapValues { ($0.tokensDone, $0.ok, $0.failed) }
        self.answers = answers
    }

    /// The unregistered answers an apply got from FCM. They mark tokens dead only when the apply
    /// finishes, and only while they stay believable: when too many of the inventory's registrations
    /// are answered so (the wrong FCM, an emulator without its data), the apply stops before any
    /// token is recorded as dead, so no hook tells the app's database to drop its own fleet.
    public struct DeadAnswers: Sendable {
        var deadTokenGuard: DeadTokenGuard?
        /// Whether a token is one of the inventory's (only those count, as in a refresh's guard).
        var listed: (@Sendable (String) -> Bool)?
        /// Where the answers came from (`Backend.location`).
        var location: String
        /// Inventory registrations answered, and of them how many as unregistered (newly).
        var answered = 0
        var dead = 0
        /// Tokens answered as unregistered, marked dead when the apply finishes.
        var held = TokenSet()

        /// Answers held to `deadTokenGuard` (nil believes every answer), counting only tokens of `inventory`.
        public init(deadTokenGuard: DeadTokenGuard? = nil, inventory: Inventory? = nil, location: String = "FCM") {
            self.deadTokenGuard = deadTokenGuard
            if let inventory {
                self.listed = { @Sendable token in inventory.index(ofToken: token) != nil }
            }
            self.location = location
        }
    }

    /// Starts a new apply: records the plan's observations and bookkeeping with the journal header, in
    /// one save. A state that does not exist yet is created by that save.
    public static func begin(
        plan: Plan, desired: DesiredState, store: any StateStore, state: State,
        timing: Timing = .live, inventory: Inventory? = nil, read: TokenSet = TokenSet(),
        swept: SweptRegistrations? = nil, answers: DeadAnswers = DeadAnswers(),
        inventoryRows: [String: Int]? = nil, writer: JournalWriter? = nil
    ) async throws -> ApplySession {
        let now = timing.unixTime()
        let before = state
        var state = state
        // The devices each source read: the next run's shrink guard compares with these.
        if let inventoryRows { state.recordInventoryRows(inventoryRows) }
        state.claim(backend: plan.backend)
        var devicesChanged = inventory.map { state.recordDevices($0) } ?? []
        PhaseTrace.mark("journal: devices recorded")
        if inventory != nil { devicesChanged += state.noteDepartures(declared: desired.knownTokens, at: now) }
        PhaseTrace.mark("journal: departures noted")
        // Only what was read is recorded as read: a partial refresh leaves the rest's times alone.
        let readTokens = state.recordReads(plan.observations, read: read, swept: swept)
        PhaseTrace.mark("journal: reads recorded")
        state.prepareForApply(with: desired, operations: plan.operations, targets: try plan.selection)
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
        return ApplySession(id: id, store: store, state: state, timing: timing, answers: answers, writer: writer)
    }

    /// Continues an apply that was interrupted.
    public static func resume(
        _ unfinished: UnfinishedApply, store: any StateStore, state: State,
        timing: Timing = .live, answers: DeadAnswers = DeadAnswers(), writer: JournalWriter? = nil
    ) -> ApplySession {
        ApplySession(
            id: unfinished.id, store: store, state: state, timing: timing, progress: unfinished.progress,
            answers: answers, writer: writer)
    }

    /// Steps submitted and not yet taken by a save, in the order they were submitted.
    private var queued: [(sequence: Int, step: OperationStep)] = []
    private var submitted = 0
    /// Whether the writer has a save of the queue still to start.
    private var scheduled = false
    /// Steps a save is writing now.
    private var writing: Set<Int> = []
    /// How saves of steps ended, kept until `durable(_:)` asks.
    private var results: [Int: Result<Void, any Error>] = [:]
    /// Callers of `durable(_:)` waiting for a save, by step.
    private var waiters: [Int: CheckedContinuation<Void, any Error>] = [:]

    /// Records a finished step of an operation in state and journals it; callable from many tasks, and
    /// returns once the step is durable. The operation's last step journals it as finished, with the
    /// counts of all its steps.
    public func recorded(_ step: OperationStep) async throws {
        let receipt = enqueue(step)
        try await durable(receipt)
    }

    /// Queues a finished step for the journal and returns at once; `durable(_:)` waits for it. With a
    /// writer, the steps queued while a save runs are committed together by the next save (a group
    /// commit): a save rewrites the rows of the topics it touches, which for a topic of a million
    /// members costs far more than one step of requests, and one save per step would pace an apply
    /// below FCM's quota.
    public func submit(_ step: OperationStep) -> JournalReceipt { enqueue(step) }

    private func enqueue(_ step: OperationStep) -> JournalReceipt {
        let sequence = submitted
        submitted += 1
        queued.append((sequence, step))
        if let writer, !scheduled {
            scheduled = writer.schedule { await self.commitQueued() }
        }
        return JournalReceipt(sequence: sequence)
    }

    /// Returns once the step behind `receipt` is durable. Without a writer, the caller saves what is
    /// queued itself.
    public func durable(_ receipt: JournalReceipt) async throws {
        while true {
            if let result = results.removeValue(forKey: receipt.sequence) { return try result.get() }
            let isQueued = queued.contains { $0.sequence == receipt.sequence }
            guard isQueued || writing.contains(receipt.sequence) else { return }  // recorded, and asked already
            if isQueued, !scheduled {
                await commitQueued()
                continue
            }
            return try await withCheckedThrowingContinuation { waiters[receipt.sequence] = $0 }
        }
    }

    /// Saves every queued step in one write, once the save before it finished.
    private func commitQueued() async {
        try? await oneAtATime {
            scheduled = false
            let batch = queued
            queued = []
            guard !batch.isEmpty else { return }
            writing.formUnion(batch.map(\.sequence))
            let result: Result<Void, any Error>
            do {
                try await save(batch.map(\.step))
                result = .success(())
            } catch {
                result = .failure(error)
            }
            for (sequence, _) in batch {
                writing.remove(sequence)
                if let waiter = waiters.removeValue(forKey: sequence) {
                    waiter.resume(with: result)
                } else {
                    results[sequence] = result
                }
            }
        }
    }

    /// Counts the steps' unregistered answers and stops the apply when they are more than uninstalls
    /// explain (before the steps are recorded).
    private func judge(_ steps: [OperationStep]) throws {
        var counts = (answered: answers.answered, dead: answers.dead)
        var seen = Set<String>()
        for step in steps where step.operation.kind == .subscribe || step.operation.kind == .unsubscribe {
            for (token, outcome) in zip(step.tokens, step.outcomes) where answers.listed?(token) ?? true {
                counts.answered += 1
                guard case .failed(let error) = outcome, error.meansUnregistered else { continue }
                let known = state.tokens.id(token).map { state.dead.contains($0) } ?? false
                if !known, seen.insert(token).inserted { counts.dead += 1 }
            }
        }
        if let limit = answers.deadTokenGuard,
            let violation = limit.violation(
                newlyDead: counts.dead, read: counts.answered, location: answers.location, phase: .apply)
        {
            throw WorkflowError.tooManyDead(violation)
        }
        (answers.answered, answers.dead) = counts
    }

    private func save(_ steps: [OperationStep]) async throws {
        try judge(steps)
        let at = timing.unixTime()
        var next = state
        var parts = partial
        var topics: Set<String> = []
        var groups: Set<String> = []
        var write = StateWrite()
        var progress: [Int: OperationProgress] = [:]
        var held: [UInt32] = []
        for step in steps {
            let part = step.part
            topics.formUnion(
                next.recordOutcome(part, outcomes: step.outcomes, groupKey: step.groupKey, markDead: false))
            for (token, outcome) in zip(part.tokens, step.outcomes) {
                if case .failed(let error) = outcome, error.meansUnregistered, let id = next.tokens.id(token) {
                    held.append(id)
                }
            }
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
        answers.held.formUnion(TokenSet(held))
    }

    /// Gives up an interrupted apply. Operations in flight when it stopped may have happened in part
    /// (a batch FCM carried out before the answer came back).
    ///
    /// With `read` (the registrations `ApplyWorkflow.inFlight` names, read from FCM since), state takes
    /// what FCM holds for each of them: a membership its unsubscribe removed is gone and no longer
    /// managed (tidemark's own removal, not an opt-out), one it kept stays; a membership its subscribe
    /// made is managed, so the next plan removes what the manifests no longer declare; every other topic
    /// read is recorded as a refresh records it. Without it (another backend answers now), the
    /// unfinished subscribes' tokens not yet journaled are recorded as managed, as the safe side.
    public func abandon(_ unfinished: UnfinishedApply, read: RefreshResult? = nil) async throws {
        try await oneAtATime {
            var next = state
            var write = StateWrite()
            var topics = next.recordUnfinished(unfinished, read: read)
            if let read {
                let before = next
                next.recordRefresh(read)
                for (name, topic) in next.topics where before.topics[name] != topic { topics.insert(name) }
                write.tokens = read.refreshed.ids
            }
            write.topics = topics.sorted()
            write.finishApply = (id, .abandoned)
            try await store.save(&next, write, at: timing.unixTime())
            state = next
        }
    }

    /// Marks the apply finished (or abandoned) in the journal, and the tokens FCM answered as
    /// unregistered dead, in the same save.
    public func finish(status: ApplyStatus = .finished) async throws {
        try await oneAtATime {
            var next = state
            var write = StateWrite()
            let dead = answers.held.subtracting(next.dead)
            write.topics = next.markDead(dead).sorted()
            write.tokens = dead.ids
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
