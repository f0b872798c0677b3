/// What a state store may do beyond what every store does (load, save, the journal, the lock): each
/// a protocol of its own that a store adopts, and that the runtime asks for by name (`Runtime`'s
/// `historyTrimming()`, `workspaceKeeping()`, `leaseKeeping()`, `serveRecords()`), refusing, with
/// what to use instead, when the configured store does not adopt it. No store carries a requirement
/// it can only refuse.

/// A store that deletes old applies from its history (`history_keep`: `serve` applies all day).
public protocol HistoryTrimming: StateStore {
    /// Deletes the applies of the history beyond the newest `keep` (oldest first), with their journal
    /// rows; an apply still running is never deleted. Returns how many went.
    @discardableResult
    func trimHistory(keep: Int) async throws -> Int
}

/// A store whose file or database holds several workspaces, and knows them (`tidemark workspace`).
public protocol WorkspaceKeeping: StateStore {
    /// The workspaces the store's file or database holds state for, by name, sorted; this store's own
    /// among them once it was saved.
    func workspaces() async throws -> [String]

    /// Deletes this workspace's state, journal, history and `serve` records, in one transaction, under
    /// the lock its caller holds (`tidemark workspace delete`); other workspaces stay as they are.
    /// Sends nothing anywhere: what FCM holds stays.
    func deleteWorkspace() async throws
}

/// A store that writes two of its database's workspaces in one transaction (`tidemark state mv`
/// between them, with no journal to finish).
public protocol JointSaving: StateStore {
    /// Writes `write` of `state` here and `otherWrite` of `otherState` into `other` in one
    /// transaction; returns both serials. Throws `StateStoreError` `.unsupported` when `other` is not
    /// a workspace of the same database (the move then goes through the journal).
    func saveTogether(
        _ state: inout State, _ write: StateWrite, with other: any StateStore, _ otherState: inout State,
        _ otherWrite: StateWrite, at now: Int64
    ) async throws -> (Int, Int)
}

/// A store whose lock is a lease: it expires unless its heartbeat renews it, and a person can break
/// it (`tidemark state force-unlock`). A store without it has a lock that ends with its process.
public protocol LeaseKeeping: StateStore {
    /// The lease held now, or nil when none is.
    func lease() async throws -> LeaseRecord?

    /// Breaks the lease whose id starts with `prefix`, recording `holder` as who broke it; returns the
    /// holder it broke, or nil when no lease is held.
    func forceUnlock(_ prefix: String, by holder: LockHolder) async throws -> LockHolder?
}

/// A store that several runners share, and with it FCM's per-project write quota.
public protocol QuotaSharing: StateStore {
    /// The bucket of FCM's write quota for the FCM project `key`, shared by every run on this store.
    func quotaLedger(key: String) -> any QuotaLedger
}

/// A token bucket shared by every process that draws on one FCM project's quota (FCM's limit is per
/// project, not per process): `reserve` takes `permits` at once, going into debt if need be, and
/// returns the seconds the caller must wait before using them.
public protocol QuotaLedger: Sendable {
    func reserve(_ permits: Double, rate: Double, capacity: Double) async throws -> Double
}
