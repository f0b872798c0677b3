import Foundation

/// What a state store keeps for `tidemark serve` about one workspace, beside its state: which
/// replica reconciles it (the owner, until its claim expires unless renewed), what people asked of it
/// (`tidemark suspend`, `resume`, `reconcile`) and the status its owner last published (what
/// `tidemark status` shows).
///
/// Owning a workspace is not holding its state lock: the owner takes the lock only for each
/// reconcile, so a person's `tidemark apply` waits at most for one reconcile.
public struct ServeRecord: Sendable, Equatable {
    /// The workspace.
    public var workspace: String
    /// The replica that reconciles it (`host/pid#instance`), while its claim is live.
    public var owner: String?
    /// When the owner's claim ends unless renewed.
    public var ownerExpires: Date?
    /// Grows with every new owner: a status or control written by an earlier owner is told apart.
    public var ownerFence: Int64 = 0
    /// Whether `tidemark suspend` stopped it (until `tidemark resume`).
    public var suspended = false
    /// Who suspended or resumed it last, and when, as a person reads it.
    public var suspendedBy: String?
    /// When `tidemark reconcile` last asked for a reconcile now.
    public var reconcileRequestedAt: Date?
    /// Who asked.
    public var reconcileRequestedBy: String?
    /// The status the owner last published (the JSON `/status` serves for the workspace).
    public var status: Data?
    /// When it was published.
    public var statusAt: Date?
    /// The replicas that run the workspace (its owner and those standing by), each with when its
    /// presence ends unless renewed: how replicas learn of each other, to spread their workspaces.
    /// A write drops the entries that ended by the store's clock.
    public var replicas: [String: Date] = [:]

    /// The record of a workspace nothing was recorded for yet.
    public init(workspace: String) { self.workspace = workspace }

    /// Whether `replica` owns the workspace at `now`.
    public func isOwned(by replica: String, at now: Date) -> Bool {
        owner == replica && (ownerExpires.map { $0 > now } ?? false)
    }

    /// The owner whose claim is live at `now`, if any.
    public func liveOwner(at now: Date) -> String? {
        guard let owner, let ownerExpires, ownerExpires > now else { return nil }
        return owner
    }

    /// The replicas whose presence is live at `now` (the owner among them while it renews), by name.
    public func liveReplicas(at now: Date) -> [String] {
        replicas.filter { $0.value > now }.keys.sorted()
    }
}

/// What a person asks of a workspace that `serve` reconciles.
public enum ServeControl: String, Sendable, CaseIterable, Codable {
    /// Reconcile at once, whatever the schedule says (`tidemark reconcile`).
    case reconcile
    /// Stop reconciling until resumed (`tidemark suspend`).
    case suspend
    /// Reconcile again on the schedule (`tidemark resume`).
    case resume
}

extension ServeRecord {
    /// A time as the stores keep the record's times: milliseconds since 1970, 0 for none.
    public static func millis(_ date: Date?) -> Int64 {
        date.map { Int64(($0.timeIntervalSince1970 * 1000).rounded()) } ?? 0
    }

    /// A time the stores kept (`millis`); nil for 0.
    public static func date(millis: Int64) -> Date? {
        millis > 0 ? Date(timeIntervalSince1970: TimeInterval(millis) / 1000) : nil
    }

    /// Records `replica`'s presence until `expires` (dropping the presences and the claim that ended
    /// by `now`) and, when `take`, claims the workspace for it until `expires` unless another
    /// replica's claim is live; a new owner (or one whose claim had lapsed) bumps the fence. A replica
    /// that owns the workspace renews its claim whatever `take` says. Returns whether `replica` owns it
    /// now. Every store applies this rule in a transaction of its own.
    @discardableResult
    public mutating func claim(_ replica: String, until expires: Date, now: Date, take: Bool = true) -> Bool {
        replicas = replicas.filter { $0.value > now }
        replicas[replica] = expires
        let live = liveOwner(at: now)
        if live == nil, owner != nil {
            owner = nil
            ownerExpires = nil
        }
        if let live, live != replica { return false }
        guard live == replica || take else { return false }
        if live == nil { ownerFence += 1 }
        owner = replica
        ownerExpires = expires
        return true
    }

    /// Ends `replica`'s claim (nothing when another replica owns the workspace); `leaving` ends its
    /// presence too.
    public mutating func release(_ replica: String, leaving: Bool = true) {
        if leaving { replicas[replica] = nil }
        guard owner == replica else { return }
        owner = nil
        ownerExpires = nil
    }

    /// `replicas` as the stores keep it: JSON of each replica's presence end in milliseconds.
    public static func replicasText(_ replicas: [String: Date]) -> String {
        guard !replicas.isEmpty else { return "" }
        let ends = replicas.mapValues { millis($0) }
        let data = (try? JSONSerialization.data(withJSONObject: ends, options: [.sortedKeys])) ?? Data()
        return String(decoding: data, as: UTF8.self)
    }

    /// Reads what `replicasText` wrote (nothing for an empty or unreadable text: presences are
    /// renewed every few seconds, so one lost is soon back).
    public static func replicas(text: String) -> [String: Date] {
        guard !text.isEmpty,
            let object = try? JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any]
        else { return [:] }
        var replicas: [String: Date] = [:]
        for (replica, value) in object {
            if let millis = (value as? NSNumber)?.int64Value, let date = date(millis: millis) {
                replicas[replica] = date
            }
        }
        return replicas
    }

    /// Records `control` asked by `by` at `now`.
    public mutating func record(_ control: ServeControl, by: String, reason: String? = nil, at now: Date) {
        let why = reason.map { ": \($0)" } ?? ""
        switch control {
        case .reconcile:
            reconcileRequestedAt = now
            reconcileRequestedBy = by + why
        case .suspend, .resume:
            suspended = control == .suspend
            suspendedBy = "\(by) at \(ISO8601DateFormatter().string(from: now))\(why)"
        }
    }
}

/// A state store that keeps `serve`'s records (owners, control requests, statuses): a capability a
/// store adopts, not one every store has. `Runtime.serveRecords()` finds it in the store `state`
/// opens, and says plainly when the store keeps none.
///
/// The store writes one read-modify-write of the workspace's record on its own clock
/// (`updateServeRecord`) and reads the records; claiming, releasing, requesting and publishing then
/// follow `ServeRecord`'s rules the same way in every store.
public protocol ServeRecordKeeping: StateStore {
    /// This workspace's record (an empty one when nothing was recorded).
    func serveRecord() async throws -> ServeRecord

    /// Every workspace's record in this store (for `tidemark status` with no workspace), by name.
    func serveRecords() async throws -> [ServeRecord]

    /// Reads this workspace's record (an empty one when none was written), lets `change` edit it with
    /// the store's clock, and writes it back, in one transaction; returns the record and `change`'s result.
    func updateServeRecord<T: Sendable>(
        _ change: @Sendable @escaping (inout ServeRecord, Date) -> T
    ) async throws -> (ServeRecord, T)
}

extension ServeRecordKeeping {
    /// Claims the workspace for `replica` for `duration` when nobody else's claim is live (or renews
    /// `replica`'s own), recording its presence; returns the record after the claim.
    public func claimOwnership(_ replica: String, for duration: Duration) async throws -> ServeRecord {
        try await claimOwnership(replica, for: duration, take: true)
    }

    /// Gives up `replica`'s claim and presence (a replica that stops), so another takes the workspace at once.
    public func releaseOwnership(_ replica: String) async throws {
        try await releaseOwnership(replica, leaving: true)
    }

    /// Records `replica`'s presence for `duration` and, when `take`, claims the workspace for it unless
    /// another replica's claim is live (or renews `replica`'s own), by the store's clock (`ServeRecord.claim`);
    /// returns the record after it: `replica` owns it when `isOwned(by:)` says so.
    public func claimOwnership(_ replica: String, for duration: Duration, take: Bool) async throws -> ServeRecord {
        try await updateServeRecord { record, now in
            record.claim(replica, until: now.addingTimeInterval(Timing.seconds(duration)), now: now, take: take)
        }.0
    }

    /// Ends `replica`'s claim, and its presence when `leaving`.
    public func releaseOwnership(_ replica: String, leaving: Bool) async throws {
        _ = try await updateServeRecord { record, _ in record.release(replica, leaving: leaving) }
    }

    /// Records `control` (`ServeRecord.record`) by the store's clock.
    @discardableResult
    public func requestControl(_ control: ServeControl, by: String, reason: String? = nil) async throws -> ServeRecord {
        try await updateServeRecord { record, now in record.record(control, by: by, reason: reason, at: now) }.0
    }

    /// Keeps `status` when `replica` owns the workspace by the store's clock.
    @discardableResult
    public func publishStatus(_ status: Data, replica: String) async throws -> Bool {
        try await updateServeRecord { record, now -> Bool in
            guard record.isOwned(by: replica, at: now) else { return false }
            record.status = status
            record.statusAt = now
            return true
        }.1
    }
}
