import Foundation
import TidemarkCore

/// Journals an apply: each finished operation updates state and commits with its journal entry.
public actor ApplySession: ApplyRecorder {
    public let id: String
    private let store: SQLiteStateStore
    private let now: @Sendable () -> Int64
    public private(set) var state: State

    public init(id: String, store: SQLiteStateStore, state: State,
        now: @escaping @Sendable () -> Int64 = { Int64(Date().timeIntervalSince1970) })
    {
        self.id = id
        self.store = store
        self.state = state
        self.now = now
    }

    /// Starts a new apply: records the plan's observations and bookkeeping with the journal header, in one transaction.
    public static func begin(plan: Plan, desired: DesiredState, store: SQLiteStateStore, state: State,
        id: String = UUID().uuidString.lowercased(), now: @escaping @Sendable () -> Int64 = { Int64(Date().timeIntervalSince1970) })
        throws -> ApplySession
    {
        let before = state
        var state = state
        state.growToTable()
        let seen = plan.observations.refreshedAt == nil ? TokenSet() : TokenSet(0..<UInt32(state.tokens.count))
        state.apply(plan.observations, seen: seen)
        state.reconcileBookkeeping(with: desired, operations: plan.operations, targets: try plan.selection)
        var write = SQLiteStateStore.Write()
        write.includeTopicsAndGroups(before: before, after: state)
        if plan.observations.refreshedAt != nil {
            write.allTokens = true
        } else {
            write.tokens = (plan.observations.dead + plan.observations.revived).compactMap { state.tokens.id($0) }
        }
        write.beginApply = (id, plan)
        try store.save(&state, write, at: now())
        return ApplySession(id: id, store: store, state: state, now: now)
    }

    /// Continues an apply that was interrupted.
    public static func resume(_ unfinished: SQLiteStateStore.UnfinishedApply, store: SQLiteStateStore, state: State,
        now: @escaping @Sendable () -> Int64 = { Int64(Date().timeIntervalSince1970) }) -> ApplySession
    {
        ApplySession(id: unfinished.id, store: store, state: state, now: now)
    }

    public func completed(index: Int, operation: PlannedOperation, outcomes: [TokenOutcome], groupKey: String?) async throws {
        let at = now()
        let changedTopics = state.record(operation, outcomes: outcomes, groupKey: groupKey, at: at)
        var write = SQLiteStateStore.Write()
        if operation.kind.isGroup { write.groups = [operation.target] }
        write.topics = Array(changedTopics)
        write.tokens = operation.tokens.compactMap { state.tokens.id($0) }
        let ok = outcomes.filter(\.isOK).count
        write.finishedOperation = (id, index, ok, outcomes.count - ok)
        try store.save(&state, write, at: at)
    }

    /// Marks the apply finished (or abandoned) in the journal.
    public func finish(status: String = "finished") throws {
        var write = SQLiteStateStore.Write()
        write.finishApply = (id, status)
        try store.save(&state, write, at: now())
    }
}
