/// Receives each finished step of an operation, in completion order; the state store journals it durably.
///
/// A recorder without a queue implements `recorded(_:)` alone. One with a queue implements all three,
/// and its `recorded(_:)` must not call the protocol's `submit(_:)` (whose default calls `recorded`).
public protocol ApplyRecorder: Sendable {
    /// Records `step` and returns once it is durable.
    func recorded(_ step: OperationStep) async throws

    /// Queues `step` to be recorded and returns at once with a receipt, so the caller can send its next
    /// requests while the step is written; `durable(_:)` waits for it. By default the step is recorded
    /// before this returns.
    func submit(_ step: OperationStep) async throws -> JournalReceipt

    /// Returns once the step behind `receipt` is durable, or throws why it could not be recorded.
    func durable(_ receipt: JournalReceipt) async throws
}

/// A step handed to an `ApplyRecorder` with `submit(_:)`, to wait for with `durable(_:)`.
public struct JournalReceipt: Sendable, Hashable {
    /// The step's place in the order steps were submitted; negative for a step recorded already.
    let sequence: Int

    /// A step recorded before `submit(_:)` returned.
    public static let recorded = JournalReceipt(sequence: -1)
}

extension ApplyRecorder {
    /// Records `step` at once: a recorder without a queue.
    public func submit(_ step: OperationStep) async throws -> JournalReceipt {
        try await recorded(step)
        return .recorded
    }

    /// Nothing to wait for: `submit(_:)` recorded the step.
    public func durable(_ receipt: JournalReceipt) async throws {}

    /// Records a whole operation in one step.
    public func completed(
        index: Int, operation: PlannedOperation, outcomes: [TokenOutcome], groupKey: String?
    ) async throws {
        try await recorded(
            OperationStep(index: index, operation: operation, from: 0, outcomes: outcomes, groupKey: groupKey))
    }
}

/// A finished step of an operation: the outcomes of its tokens `from ..< from + outcomes.count`.
///
/// Group calls and batch transports finish an operation in one step; per-token transports (v1) finish
/// it in several, so that an apply killed part-way re-sends at most one step of it.
public struct OperationStep: Sendable {
    /// The operation's index in the plan.
    public var index: Int
    /// The whole operation the step belongs to.
    public var operation: PlannedOperation
    /// The operation's first token this step sent.
    public var from: Int
    /// The outcome of each token the step sent, in order.
    public var outcomes: [TokenOutcome]
    /// The group's key after the step, for a group call that returns one.
    public var groupKey: String?

    /// The step of operation `index` that sent its tokens `from ..< from + outcomes.count`.
    public init(index: Int, operation: PlannedOperation, from: Int, outcomes: [TokenOutcome], groupKey: String?) {
        self.index = index
        self.operation = operation
        self.from = from
        self.outcomes = outcomes
        self.groupKey = groupKey
    }

    /// The tokens this step sent.
    public var tokens: ArraySlice<String> { operation.tokens[from..<(from + outcomes.count)] }

    /// The step as an operation of its own, for recording in state.
    public var part: PlannedOperation {
        from == 0 && outcomes.count == operation.tokens.count
            ? operation : PlannedOperation(kind: operation.kind, target: operation.target, tokens: Array(tokens))
    }

    /// Whether this is the operation's last step.
    public var finishesOperation: Bool { from + outcomes.count >= operation.tokens.count }
}

/// Progress of an apply, for bars and log lines.
public struct ExecutionProgress: Sendable {
    /// Operations finished, this run's and those an interrupted run finished.
    public var operationsDone: Int
    /// Operations in the plan.
    public var operationsTotal: Int
    /// Token changes sent so far.
    public var tokensDone: Int
    /// Token changes in the plan.
    public var tokensTotal: Int

    /// Progress of an apply.
    public init(operationsDone: Int, operationsTotal: Int, tokensDone: Int, tokensTotal: Int) {
        self.operationsDone = operationsDone
        self.operationsTotal = operationsTotal
        self.tokensDone = tokensDone
        self.tokensTotal = tokensTotal
    }
}

/// A token that an operation could not change, and why.
public struct TokenFailure: Sendable, Equatable, Codable {
    /// The operation's index in the plan.
    public var operation: Int
    /// Subscribe, unsubscribe or a group call.
    public var kind: PlannedOperation.Kind
    /// The topic or group.
    public var target: String
    /// The token that was not changed.
    public var token: String
    /// FCM's answer for it.
    public var error: TokenError
}

/// What an apply did.
public struct ExecutionReport: Sendable {
    /// Operations this run carried out.
    public var operationsRun = 0
    /// Requests sent to FCM.
    public var requests = 0
    /// Of the requests, those that repeated an earlier one.
    public var retries = 0
    /// Token changes FCM made.
    public var tokensChanged = 0
    /// Tokens FCM would not change, with why.
    public var failures: [TokenFailure] = []

    /// An empty report.
    public init() {}
}

/// Runs planned operations against a backend with bounded concurrency.
///
/// Removals run before additions so no device passes 2000 topics; group calls run in order per group.
/// Retryable per-token errors are retried for those tokens only, under the shared `RetryPolicy`;
/// others are reported and the run goes on.
public struct Executor: Sendable {
    /// Where the operations go.
    public var backend: any Backend
    /// Where each finished step is journaled.
    public var recorder: any ApplyRecorder
    /// Operations in flight at once (sequences of a group run in order).
    public var parallelism: Int
    /// When tokens that failed with a retryable error are tried again.
    public var policy: RetryPolicy
    /// Clock, sleep and jitter for retries; injected so tests need not sleep.
    public var timing: Timing
    /// Told after each finished operation, for bars and log lines.
    public var progress: (@Sendable (ExecutionProgress) -> Void)?
    /// Asked before every call: a run that lost its state lock sends nothing more.
    public var gate: LeaseGate? = nil

    /// An executor sending to `backend` and journaling through `recorder`.
    public init(
        backend: any Backend, recorder: any ApplyRecorder, parallelism: Int = 8,
        policy: RetryPolicy = RetryPolicy(), timing: Timing = .live,
        progress: (@Sendable (ExecutionProgress) -> Void)? = nil
    ) {
        self.backend = backend
        self.recorder = recorder
        self.parallelism = max(1, parallelism)
        self.policy = policy
        self.timing = timing
        self.progress = progress
    }

    /// Runs `operations` except those whose index is in `done`, each from the token `tokensDone` names
    /// (where an interrupted apply stopped); `groupKeys` are the keys state knows.
    public func run(
        _ operations: [PlannedOperation], done: Set<Int> = [], tokensDone: [Int: Int] = [:],
        groupKeys: [String: String] = [:]
    )
        async throws -> ExecutionReport
    {
        var report = ExecutionReport()
        let requestsBefore = backend.requestCount()
        let retriesBefore = backend.retryCount()
        let pending = operations.indices.filter { !done.contains($0) }
        var tracker = Tracker(total: operations.count, tokensTotal: operations.reduce(0) { $0 + $1.tokens.count })
        for index in operations.indices where done.contains(index) { tracker.add(operations[index].tokens.count) }
        for (index, count) in tokensDone where !done.contains(index) { tracker.tokensDone += count }
        // What there is to do (and what an interrupted run did), before the first answer.
        progress?(tracker.snapshot)
        let unsubscribes = pending.filter { operations[$0].kind == .unsubscribe }.map { [$0] }
        let subscribes = pending.filter { operations[$0].kind == .subscribe }.map { [$0] }
        // A topic's state-only steps (adoptions, a release) after its batches; nothing is sent for them.
        let topicSteps = pending.filter { operations[$0].kind.isTopicStep }.map { [$0] }
        var groupSequences: [String: [Int]] = [:]
        var groupOrder: [String] = []
        for index in pending where operations[index].kind.isGroup {
            let name = operations[index].target
            if groupSequences[name] == nil { groupOrder.append(name) }
            groupSequences[name, default: []].append(index)
        }
        for phase in [unsubscribes, subscribes, topicSteps, groupOrder.map { groupSequences[$0]! }]
        where !phase.isEmpty {
            try await runPhase(phase, operations, tokensDone: tokensDone, groupKeys: groupKeys, &report, &tracker)
        }
        if let requestsBefore, let after = backend.requestCount() { report.requests = after - requestsBefore }
        if let retriesBefore, let after = backend.retryCount() { report.retries = after - retriesBefore }
        return report
    }

    private struct Tracker {
        var total: Int
        var tokensTotal: Int
        var operationsDone = 0
        var tokensDone = 0

        mutating func add(_ tokens: Int) {
            operationsDone += 1
            tokensDone += tokens
        }

        var snapshot: ExecutionProgress {
            ExecutionProgress(
                operationsDone: operationsDone, operationsTotal: total, tokensDone: tokensDone,
                tokensTotal: tokensTotal)
        }
    }

    private struct Finished: Sendable {
        var index: Int
        /// The first token this run sent (later than 0 when an interrupted apply got part of the way).
        var from: Int
        var outcomes: [TokenOutcome]
        var requests: Int
    }

    /// Runs sequences of operations, sequences in parallel; each sequence's operations one after another.
    /// Every operation is journaled as soon as it finishes, before the next of its sequence starts, so a
    /// failure in a later step of a group never loses the steps before it.
    private func runPhase(
        _ sequences: [[Int]], _ operations: [PlannedOperation], tokensDone: [Int: Int],
        groupKeys: [String: String], _ report: inout ExecutionReport, _ tracker: inout Tracker
    ) async throws {
        try await BoundedConcurrency.forEach(sequences.count, width: parallelism) { [self] s in
            let sequence = sequences[s]
            var finished: [Finished] = []
            var key = groupKeys[operations[sequence[0]].target]
            for index in sequence {
                let op = operations[index]
                if op.kind.isGroup || op.kind.isStateOnly {
                    let result = try await performGroup(op, key: key)
                    key = result.groupKey ?? key
                    try await recorder.recorded(
                        OperationStep(
                            index: index, operation: op, from: 0, outcomes: result.outcomes,
                            groupKey: result.groupKey))
                    finished.append(
                        Finished(index: index, from: 0, outcomes: result.outcomes, requests: result.requests))
                } else {
                    let from = min(tokensDone[index] ?? 0, op.tokens.count)
                    var outcomes: [TokenOutcome] = []
                    var requests = 0
                    var position = from
                    let step = backend.journalStep ?? op.tokens.count
                    // A step is journaled while the next one is sent: the requests never wait on a save
                    // (at a million devices a save rewrites topics of a million members). At most the
                    // step being sent and the one being journaled are not yet durable, and steps are
                    // journaled in order: the next is submitted only once the one before it is durable.
                    var journaling: JournalReceipt?
                    /// Waits until the step being journaled, if any, is durable.
                    func journaled() async throws {
                        guard let pending = journaling else { return }
                        journaling = nil
                        try await recorder.durable(pending)
                    }
                    do {
                        repeat {
                            let end = min(op.tokens.count, position + max(1, step))
                            let result = try await change(op, Array(op.tokens[position..<end]))
                            try await journaled()
                            journaling = try await recorder.submit(
                                OperationStep(
                                    index: index, operation: op, from: position, outcomes: result.outcomes,
                                    groupKey: nil))
                            outcomes += result.outcomes
                            requests += result.requests
                            position = end
                        } while position < op.tokens.count
                        try await journaled()
                    } catch {
                        // A step that finished is journaled before the failure goes on.
                        try? await journaled()
                        throw error
                    }
                    finished.append(Finished(index: index, from: from, outcomes: outcomes, requests: requests))
                }
            }
            return finished
        } each: { _, results in
            for result in results {
                let op = operations[result.index]
                report.operationsRun += 1
                report.requests += result.requests
                for (token, outcome) in zip(op.tokens[result.from...], result.outcomes) {
                    switch outcome {
                    case .ok: if !op.kind.isStateOnly { report.tokensChanged += 1 }
                    case .failed(let error):
                        report.failures.append(
                            TokenFailure(
                                operation: result.index, kind: op.kind, target: op.target,
                                token: token, error: error))
                    }
                }
                tracker.add(result.outcomes.count)
                progress?(tracker.snapshot)
            }
        }
    }

    /// Subscribes or unsubscribes `tokens`, retrying the tokens that failed with a retryable error.
    private func change(
        _ op: PlannedOperation, _ tokens: [String]
    ) async throws -> (outcomes: [TokenOutcome], requests: Int) {
        var outcomes = [TokenOutcome](repeating: .failed(.internalError), count: tokens.count)
        var remaining = Array(tokens.indices)
        var requests = 0
        let started = timing.now()
        var attempt = 0
        while true {
            attempt += 1
            let sending = remaining.map { tokens[$0] }
            let answers = try await withRetries {
                try await gate?.check()
                return
                    op.kind == .subscribe
                    ? try await backend.subscribe(topic: op.target, tokens: sending)
                    : try await backend.unsubscribe(topic: op.target, tokens: sending)
            }
            requests += 1
            var retry: [Int] = []
            for (position, answer) in zip(remaining, answers) {
                outcomes[position] = answer
                if case .failed(let error) = answer, error.isRetryable { retry.append(position) }
            }
            remaining = retry
            if remaining.isEmpty { break }
            guard
                case .retry(let delay) = policy.decide(
                    .tokens, attempt: attempt, elapsed: timing.now() - started,
                    timing: timing)
            else { break }
            try await timing.sleep(delay)
        }
        return (outcomes, requests)
    }

    private func performGroup(
        _ op: PlannedOperation, key: String?
    ) async throws -> (outcomes: [TokenOutcome], groupKey: String?, requests: Int) {
        if op.kind.isGroupCall { try await gate?.check() }
        switch op.kind {
        case .subscribe, .unsubscribe:
            preconditionFailure("topic changes run through change(_:_:)")
        case .audienceSet, .audienceDelete, .audienceUnlink, .topicAdopt, .topicRelease, .groupRelease:
            // An audience lives in state only, and adopting or releasing sends nothing: recording the
            // step is the whole of it.
            return (op.tokens.map { _ in .ok }, nil, 0)
        case .groupCreate:
            do {
                let key = try await withRetries { try await backend.createGroup(name: op.target, tokens: op.tokens) }
                return (op.tokens.map { _ in .ok }, key, 1)
            } catch let error as GroupError where error.kind == .alreadyExists {
                // Created by an earlier, interrupted apply or by someone else: adopt it by its key.
                guard let existing = try await backend.groupKey(name: op.target) else { throw error }
                let key = try await backend.addToGroup(name: op.target, key: existing, tokens: op.tokens)
                return (op.tokens.map { _ in .ok }, key, 3)
            }
        case .groupAdd:
            let current: String?
            if let key { current = key } else { current = try await backend.groupKey(name: op.target) }
            guard let current else {
                let created = try await backend.createGroup(name: op.target, tokens: op.tokens)
                return (op.tokens.map { _ in .ok }, created, 2)
            }
            do {
                let newKey = try await withRetries {
                    try await backend.addToGroup(name: op.target, key: current, tokens: op.tokens)
                }
                return (op.tokens.map { _ in .ok }, newKey, 1)
            } catch let error as GroupError where error.kind == .notFound {
                // The group vanished (every member left); create it anew with these members.
                let created = try await backend.createGroup(name: op.target, tokens: op.tokens)
                return (op.tokens.map { _ in .ok }, created, 2)
            }
        case .groupRemove:
            let current: String?
            if let key { current = key } else { current = try await backend.groupKey(name: op.target) }
            guard let current else { return (op.tokens.map { _ in .ok }, nil, 1) }
            do {
                try await withRetries {
                    try await backend.removeFromGroup(name: op.target, key: current, tokens: op.tokens)
                }
            } catch let error as GroupError where error.kind == .notFound {
                // Already gone: removing members of a deleted group is done.
            }
            return (op.tokens.map { _ in .ok }, nil, 1)
        }
    }

    /// Retries a whole call that failed with an error retries may fix: not a `GroupError`, not one the
    /// backend already retried as far as the policy allows (`RetryableError.isRetryable == false`).
    private func withRetries<T: Sendable>(_ body: () async throws -> T) async throws -> T {
        let started = timing.now()
        var attempt = 0
        while true {
            attempt += 1
            do {
                return try await body()
            } catch let error as GroupError {
                throw error
            } catch is CancellationError {
                throw CancellationError()
            } catch {
                if let known = error as? any RetryableError, !known.isRetryable { throw error }
                guard
                    case .retry(let delay) = policy.decide(
                        .network, attempt: attempt,
                        elapsed: timing.now() - started, timing: timing)
                else { throw error }
                try await timing.sleep(delay)
            }
        }
    }
}
