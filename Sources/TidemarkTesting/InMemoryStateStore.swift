import Foundation
import TidemarkCore

/// State in memory: the twin of the SQLite store for unit tests, passing the same conformance suite.
///
/// Like the real stores it keeps only what a write names (plus new tokens), bumps the serial once
/// per save, journals applies, and lets one lease hold the lock at a time.
public actor InMemoryStateStore: ServeRecordKeeping, HistoryTrimming, WorkspaceKeeping {
    /// How messages name the store.
    public nonisolated let location: String

    private struct Stored {
        var lineage: String
        var serial = 0
        var tokens: [String] = []
        var seenAt: [Int64] = []
        var deviceIDs: [String] = []
        var leftAt: [Int64] = []
        var dead: Set<UInt32> = []
        var topics: [String: TopicState] = [:]
        var groups: [String: GroupState] = [:]
        var backend: BackendIdentity?
        var versions: [String: Int] = [:]
        var inventoryRows: [String: Int] = [:]
    }

    private struct Journal {
        var startedAt: Int64
        var status: ApplyStatus
        var plan: Plan
        var done: Set<Int> = []
        var progress: [Int: OperationProgress] = [:]
    }

    private var stored: Stored?
    private var journal: [(id: String, entry: Journal)] = []
    private var holder: (id: UInt64, holder: LockHolder)?
    private var nextLease: UInt64 = 0
    /// Saves so far, for tests that count writes.
    public private(set) var saveCount = 0
    /// When set, the next save fails with this error and writes nothing (a full disk, a lost connection).
    public var failNextSave: (any Error)?

    /// The workspace its `serve` record is kept for.
    public nonisolated let workspace: String
    /// The clock its `serve` claims are judged by.
    private let clock: @Sendable () -> Date
    private var record: ServeRecord

    /// An empty store named `location`, holding `workspace`; `clock` judges `serve` claims.
    public init(
        location: String = "memory", workspace: String = "default", clock: @escaping @Sendable () -> Date = Date.init
    ) {
        self.location = location
        self.workspace = workspace
        self.clock = clock
        record = ServeRecord(workspace: workspace)
    }

    /// Makes the next save fail with `error` and write nothing (nil: saves succeed).
    public func setFailNextSave(_ error: (any Error)?) { failNextSave = error }

    /// The state as saved; nil before the first save.
    public func load() async throws -> State? {
        guard let stored else { return nil }
        let tokens = try TokenRegistry(
            tokens: stored.tokens, seenAt: stored.seenAt, deviceIDs: stored.deviceIDs, leftAt: stored.leftAt)
        return State(
            lineage: stored.lineage, serial: stored.serial, tokens: tokens, dead: TokenSet(stored.dead),
            topics: stored.topics, groups: stored.groups, backend: stored.backend, versions: stored.versions,
            inventoryRows: stored.inventoryRows)
    }

    /// Keeps what `write` names, as a real store writes it; returns the new serial.
    public func save(_ state: inout State, _ write: StateWrite, at now: Int64) async throws -> Int {
        if let failure = failNextSave {
            failNextSave = nil
            throw failure
        }
        var next = stored ?? Stored(lineage: state.lineage)
        if write.compact {
            next.tokens = []
            next.seenAt = []
            next.deviceIDs = []
            next.leftAt = []
            next.dead = []
        }
        let known = next.tokens.count
        for id in known..<state.tokens.count {
            next.tokens.append(state.tokens[UInt32(id)])
            next.seenAt.append(state.seenAt[id])
            next.deviceIDs.append(state.deviceIDs[id])
            next.leftAt.append(state.leftAt[id])
            if state.dead.contains(UInt32(id)) { next.dead.insert(UInt32(id)) }
        }
        let touched: [UInt32] = write.allTokens ? Array(0..<UInt32(min(known, state.tokens.count))) : write.tokens
        for id in touched where Int(id) < known {
            next.seenAt[Int(id)] = state.seenAt[Int(id)]
            next.deviceIDs[Int(id)] = state.deviceIDs[Int(id)]
            next.leftAt[Int(id)] = state.leftAt[Int(id)]
            if state.dead.contains(id) { next.dead.insert(id) } else { next.dead.remove(id) }
        }
        for name in Set(write.topics) { next.topics[name] = state.topics[name] }
        for name in Set(write.groups) { next.groups[name] = state.groups[name] }
        if let (id, plan) = write.beginApply {
            journal.append((id, Journal(startedAt: now, status: .running, plan: plan)))
        }
        for entry in write.finishedOperations {
            guard let i = journal.firstIndex(where: { $0.id == entry.applyID }) else { continue }
            journal[i].entry.done.insert(entry.index)
            journal[i].entry.progress[entry.index] = nil
        }
        for progress in write.operationProgress {
            guard let i = journal.firstIndex(where: { $0.id == progress.applyID }) else { continue }
            journal[i].entry.progress[progress.index] = progress
        }
        if let (id, status) = write.finishApply, let i = journal.firstIndex(where: { $0.id == id }) {
            journal[i].entry.status = status
        }
        if let backend = state.backend { next.backend = backend }
        next.inventoryRows = state.inventoryRows
        if write.restore {
            next.serial = state.serial
            next.versions.merge(state.versions) { _, new in new }
        } else {
            next.serial += 1
            for key in write.versionKeys { next.versions[key] = next.serial }
        }
        stored = next
        saveCount += 1
        state.saved(serial: next.serial, versionKeys: write.versionKeys, restored: write.restore)
        return next.serial
    }

    /// The apply that never finished, with its journal, if any.
    public func unfinishedApply() async throws -> UnfinishedApply? {
        guard
            let last = journal.filter({ $0.entry.status == .running }).max(by: {
                $0.entry.startedAt < $1.entry.startedAt
            })
        else { return nil }
        return UnfinishedApply(
            id: last.id, startedAt: Date(timeIntervalSince1970: TimeInterval(last.entry.startedAt)),
            plan: last.entry.plan, done: last.entry.done, progress: last.entry.progress)
    }

    /// The latest applies, newest first.
    public func applies(limit: Int) async throws -> [ApplyRecord] {
        journal.reversed().sorted { $0.entry.startedAt > $1.entry.startedAt }.prefix(limit).map {
            ApplyRecord(
                id: $0.id, status: $0.entry.status, startedAt: $0.entry.startedAt,
                operations: $0.entry.plan.operations.count, done: $0.entry.done.count)
        }
    }

    /// Deletes the applies beyond the newest `keep`, never a running one.
    public func trimHistory(keep: Int) async throws -> Int {
        let kept = Set(
            journal.sorted { ($0.entry.startedAt, $0.id) > ($1.entry.startedAt, $1.id) }.prefix(keep).map(\.id))
        let before = journal.count
        journal.removeAll { !kept.contains($0.id) && $0.entry.status != .running }
        return before - journal.count
    }

    /// Takes the store's lock; a second holder is refused as `locked`.
    public func lock(_ holder: LockHolder) async throws -> any StateLease {
        if let current = self.holder {
            throw StateStoreError(.locked, path: location, current.holder.description, holder: current.holder)
        }
        nextLease += 1
        self.holder = (nextLease, holder)
        return Lease(store: self, id: nextLease)
    }

    /// Who holds the lock, if anyone.
    public func lockHolder() async throws -> LockHolder? { holder?.holder }

    fileprivate func release(_ id: UInt64) {
        if holder?.id == id { holder = nil }
    }

    private struct Lease: StateLease {
        let store: InMemoryStateStore
        let id: UInt64
        func release() async { await store.release(id) }
    }

    /// Forgets the state, its journal and its `serve` record.
    public func deleteWorkspace() async throws {
        stored = nil
        journal = []
        record = ServeRecord(workspace: record.workspace)
    }

    /// Its one workspace, once saved.
    public func workspaces() async throws -> [String] { stored == nil ? [] : [record.workspace] }

    // MARK: - serve's records

    /// The workspace's record.
    public func serveRecord() async throws -> ServeRecord { record }

    /// The one workspace's record.
    public func serveRecords() async throws -> [ServeRecord] { [record] }

    /// Lets `change` edit the record with this store's clock.
    public func updateServeRecord<T: Sendable>(
        _ change: @Sendable @escaping (inout ServeRecord, Date) -> T
    ) async throws -> (ServeRecord, T) {
        let result = change(&record, clock())
        return (record, result)
    }
}
