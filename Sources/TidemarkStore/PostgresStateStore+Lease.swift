import Foundation
import Logging
import NIOCore
import PostgresNIO
import Synchronization
import TidemarkCore

#if canImport(Glibc)
import Glibc
#endif

extension PostgresStateStore {
    // MARK: - Lease

    /// A lease row per workspace: holder, heartbeat, expiry, and a fencing counter that grows with
    /// every lease taken. Saves check it, so a runner whose lease expired or was broken never writes.
    public func lock(_ holder: LockHolder) async throws -> any StateLease {
        let leaseID = UUID().uuidString.lowercased()
        let holderJSON = String(decoding: try JSONEncoder.lockHolder.encode(holder), as: UTF8.self)
        let millis = Int64(leaseDuration.components.seconds * 1000)
        try await ensureSchema()
        let asked = ContinuousClock.now
        let fence: Int64 = try await link.transaction { c in
            try await c.run(
                """
                INSERT INTO tidemark_leases (workspace, lease_id, holder, fence, started_at, heartbeat_at, expires_at)
                VALUES (\(self.workspace), '', '{}', 0, 0, 0, 0) ON CONFLICT (workspace) DO NOTHING
                """)
            let row = try await c.first(
                """
                SELECT lease_id, holder, expires_at > \(unescaped: Self.nowSQL), fence FROM tidemark_leases
                WHERE workspace = \(self.workspace) FOR UPDATE
                """)
            guard let row else { throw self.damaged("table 'tidemark_leases': the lease row vanished") }
            let (currentID, currentHolder, live, fence) = try self.decode(
                row, (String, String, Bool, Int64).self, table: "tidemark_leases")
            if live {
                let current = try? JSONDecoder.lockHolder.decode(LockHolder.self, from: Data(currentHolder.utf8))
                if let current, Self.isDeadLocalProcess(current) {
                    // The holder ran on this machine and is gone (killed): its lease is stale.
                    try await self.recordBreak(
                        c, leaseID: currentID, holder: currentHolder, by: holderJSON, reason: "holder process gone")
                } else {
                    throw StateStoreError(
                        .locked, path: self.location,
                        "\(current?.description ?? "another run") (lease \(currentID.prefix(8)); it expires unless renewed; 'tidemark state force-unlock \(currentID.prefix(8))' breaks it)",
                        holder: current)
                }
            }
            let next = fence + 1
            try await c.run(
                """
                UPDATE tidemark_leases SET lease_id = \(leaseID), holder = \(holderJSON), operation = \(holder.operation),
                    fence = \(next), started_at = \(unescaped: Self.nowSQL), heartbeat_at = \(unescaped: Self.nowSQL),
                    expires_at = \(unescaped: Self.nowSQL) + \(millis)
                WHERE workspace = \(self.workspace)
                """)
            return next
        }
        held.withLock { $0 = (leaseID, fence) }
        activity.progressed()
        return PostgresLease(
            store: self, id: leaseID, fence: fence, duration: leaseDuration, confirmedAt: asked,
            activity: activity)
    }

    /// Who holds the workspace's lease, if anyone holds one that has not expired.
    public func lockHolder() async throws -> LockHolder? {
        try await ensureSchema()
        return try await link.transaction(readOnly: true) { c in
            guard
                let row = try await c.first(
                    """
                    SELECT holder FROM tidemark_leases WHERE workspace = \(self.workspace)
                    AND expires_at > \(unescaped: Self.nowSQL)
                    """)
            else { return nil }
            let text = try self.decode(row, String.self, table: "tidemark_leases")
            return try? JSONDecoder.lockHolder.decode(LockHolder.self, from: Data(text.utf8))
        }
    }

    /// Breaks the workspace's lease whose id starts with `prefix`, recording who broke it.
    public func forceUnlock(_ prefix: String, by holder: LockHolder) async throws -> LockHolder? {
        let by = String(decoding: try JSONEncoder.lockHolder.encode(holder), as: UTF8.self)
        try await ensureSchema()
        return try await link.transaction { c in
            guard
                let row = try await c.first(
                    """
                    SELECT lease_id, holder FROM tidemark_leases WHERE workspace = \(self.workspace)
                    AND expires_at > \(unescaped: Self.nowSQL) FOR UPDATE
                    """)
            else { return nil }
            let (id, text) = try self.decode(row, (String, String).self, table: "tidemark_leases")
            guard !prefix.isEmpty, id.hasPrefix(prefix.lowercased()) else {
                throw StateStoreError(
                    .io, path: self.location,
                    "the lease held now is \(id.prefix(8)), not '\(prefix)'; check 'tidemark state lock' and try again")
            }
            try await self.recordBreak(c, leaseID: id, holder: text, by: by, reason: "tidemark state force-unlock")
            return try? JSONDecoder.lockHolder.decode(LockHolder.self, from: Data(text.utf8))
        }
    }

    /// One bucket in this database for every run applying to the FCM project `key` names.
    public func quotaLedger(key: String) -> any QuotaLedger { PostgresQuotaLedger(url: url, key: key) }

    /// The lease held now, with its id, or nil.
    public func lease() async throws -> LeaseRecord? {
        try await ensureSchema()
        return try await link.transaction(readOnly: true) { c in
            guard
                let row = try await c.first(
                    """
                    SELECT lease_id, holder, expires_at FROM tidemark_leases WHERE workspace = \(self.workspace)
                    AND expires_at > \(unescaped: Self.nowSQL)
                    """)
            else { return nil }
            let (id, text, expires) = try self.decode(row, (String, String, Int64).self, table: "tidemark_leases")
            guard let holder = try? JSONDecoder.lockHolder.decode(LockHolder.self, from: Data(text.utf8)) else {
                return nil
            }
            return LeaseRecord(
                id: id, holder: holder, expires: Date(timeIntervalSince1970: TimeInterval(expires) / 1000))
        }
    }

    func recordBreak(
        _ c: PostgresLink.Connection, leaseID: String, holder: String, by: String, reason: String
    ) async throws {
        try await c.run(
            """
            INSERT INTO tidemark_lease_breaks (workspace, lease_id, holder, broken_by, reason, broken_at)
            VALUES (\(workspace), \(leaseID), \(holder), \(by), \(reason), \(unescaped: Self.nowSQL))
            """)
        try await c.run("UPDATE tidemark_leases SET expires_at = 0 WHERE workspace = \(workspace)")
    }

    /// The server's process ids of this store's connections, opening them when closed (tests that drop them).
    func connectionPIDs() async throws -> [Int32] {
        var pids: [Int32] = []
        for link in [link, leaseLink] {
            let row = try await link.transaction { c in try await c.first("SELECT pg_backend_pid()") }
            if let row { pids.append(try decode(row, Int32.self, table: "pg_backend_pid")) }
        }
        return pids
    }

    /// What the server says of a lease this run took.
    enum LeaseCheck {
        /// Still this run's, for `remaining` more by the server's clock.
        case held(remaining: Duration)
        /// No longer this run's: why.
        case lost(String)
        /// The server could not be asked.
        case unreachable(StateStoreError)
    }

    /// Extends the lease by its duration from now (the server's clock), when it is still this run's.
    func renew(_ id: String, fence: Int64) async -> LeaseCheck {
        let millis = Int64(leaseDuration.components.seconds * 1000)
        return await askLease(id, fence: fence) { c in
            try await c.first(
                """
                UPDATE tidemark_leases SET heartbeat_at = \(unescaped: Self.nowSQL), expires_at = \(unescaped: Self.nowSQL) + \(millis)
                WHERE workspace = \(self.workspace) AND lease_id = \(id) AND fence = \(fence) AND expires_at > \(unescaped: Self.nowSQL)
                RETURNING expires_at - \(unescaped: Self.nowSQL)
                """)
        }
    }

    /// Whether the lease is still this run's, without writing (a plain read never waits on a save's lock).
    func checkHeld(_ id: String, fence: Int64) async -> LeaseCheck {
        await askLease(id, fence: fence) { c in
            try await c.first(
                """
                SELECT expires_at - \(unescaped: Self.nowSQL) FROM tidemark_leases
                WHERE workspace = \(self.workspace) AND lease_id = \(id) AND fence = \(fence) AND expires_at > \(unescaped: Self.nowSQL)
                """)
        }
    }

    func askLease(
        _ id: String, fence: Int64, _ query: @Sendable @escaping (PostgresLink.Connection) async throws -> PostgresRow?
    ) async -> LeaseCheck {
        do {
            return try await leaseLink.transaction { c in
                if let row = try await query(c) {
                    let remaining = try self.decode(row, Int64.self, table: "tidemark_leases")
                    return .held(remaining: .milliseconds(remaining))
                }
                guard
                    let row = try await c.first(
                        """
                        SELECT lease_id, holder, expires_at > \(unescaped: Self.nowSQL) FROM tidemark_leases
                        WHERE workspace = \(self.workspace)
                        """)
                else { return .lost("its lease row is gone") }
                let (current, holder, live) = try self.decode(
                    row, (String, String, Bool).self, table: "tidemark_leases")
                if current != id {
                    let other = try? JSONDecoder.lockHolder.decode(LockHolder.self, from: Data(holder.utf8))
                    return .lost(
                        "its lease expired without a heartbeat (was this process paused or cut off?) and was taken by \(other?.description ?? "another run")"
                    )
                }
                return .lost(
                    live
                        ? "its lease was broken or taken over"
                        : "its lease expired without a heartbeat (was this process paused or cut off?) or was broken with 'tidemark state force-unlock'"
                )
            }
        } catch let error as StateStoreError {
            return .unreachable(error)
        } catch {
            return .unreachable(StateStoreError(.io, path: location, PostgresURL.explain(error)))
        }
    }

    /// The error of a run that lost its lease: it stops before its next request to FCM.
    func lostLease(_ why: String) -> StateStoreError {
        StateStoreError(
            .leaseLost, path: location,
            "this run no longer holds the lease, because \(why). It stopped before sending anything more to FCM and wrote nothing more; what finished before is journaled. Run the command again ('tidemark state lock' shows who holds the lease now)"
        )
    }

    /// The error of a run whose work stopped moving under its lease.
    func stalledLease(idle: Duration, stall: Duration) -> StateStoreError {
        StateStoreError(
            .leaseLost, path: location,
            "nothing moved under this run's lease for \(idle.components.seconds) s (no request to FCM answered, no state written), more than the URL's stall=\(stall.components.seconds), so it is no longer renewed and lapses: another run can take the workspace. This run stops before its next request to FCM; what finished is journaled, and 'tidemark apply' resumes it"
        )
    }

    func release(_ id: String) async {
        held.withLock { if $0?.id == id { $0 = nil } }
        _ = try? await link.transaction { c in
            try await c.run(
                """
                UPDATE tidemark_leases SET expires_at = 0 WHERE workspace = \(self.workspace) AND lease_id = \(id)
                """)
        }
        // Between applies the store keeps one connection (`serve` keeps the store): the lease's own is
        // opened again by the next lease that asks the server.
        await leaseLink.close()
    }

    /// Fencing: a store holding a lease writes only while that lease is live and current; one holding
    /// none writes only while nobody else holds one.
    func checkLease(_ c: PostgresLink.Connection, held: (id: String, fence: Int64)?) async throws {
        let row = try await c.first(
            """
            SELECT lease_id, fence, expires_at > \(unescaped: Self.nowSQL), holder FROM tidemark_leases
            WHERE workspace = \(workspace) FOR SHARE
            """)
        guard let row else {
            if held != nil { throw fenced("its lease row is gone") }
            return
        }
        let (id, fence, live, holder) = try decode(row, (String, Int64, Bool, String).self, table: "tidemark_leases")
        if let held {
            guard id == held.id, fence == held.fence, live else {
                throw fenced(
                    live
                        ? "its lease was broken or taken over (fence \(held.fence), now \(fence))"
                        : "its lease expired without a heartbeat")
            }
        } else if live {
            let current = try? JSONDecoder.lockHolder.decode(LockHolder.self, from: Data(holder.utf8))
            throw StateStoreError(.locked, path: location, current?.description ?? "another run", holder: current)
        }
    }

    func fenced(_ why: String) -> StateStoreError { lostLease(why) }

    /// Whether `holder` ran in this machine's boot and PID namespace and its process is gone. A host
    /// name alone proves nothing (containers share them, with process ids of their own), so a holder
    /// that recorded no namespace, or another one, is left to its lease's expiry.
    static func isDeadLocalProcess(_ holder: LockHolder, namespace: String? = LockHolder.currentNamespace) -> Bool {
        guard let namespace, holder.namespace == namespace, holder.host == ProcessInfo.processInfo.hostName,
            holder.pid > 0, holder.instance != LockHolder.currentInstance
        else { return false }
        return kill(holder.pid, 0) != 0 && errno == ESRCH
    }
}

/// A held PostgreSQL lease. Its heartbeat (`keepAlive`, run beside the work by `withLock`) renews it
/// every third of its duration and keeps trying when the server cannot be reached; `ensureHeld`,
/// asked before every request to FCM, knows by the server's clock (with the fencing counter) whether
/// it is still this run's.
final class PostgresLease: StateLease {
    let id: String
    let activity: LeaseActivity?
    private let store: PostgresStateStore
    private let standing: LeaseStanding
    private let duration: Duration

    init(
        store: PostgresStateStore, id: String, fence: Int64, duration: Duration, confirmedAt: ContinuousClock.Instant,
        activity: LeaseActivity
    ) {
        self.id = id
        self.store = store
        self.activity = activity
        self.duration = duration
        standing = LeaseStanding(
            duration: duration, validUntil: confirmedAt + duration - LeaseStanding.margin(duration))
        self.fence = fence
    }

    /// Renews the lease until the calling task is cancelled, the lease is lost, or the work it covers
    /// stops moving for longer than the URL's stall limit: then it stops renewing, so the lease lapses
    /// and another run can take the workspace; this run stops at its next request.
    func keepAlive() async {
        let stall = store.url.stall
        var wait = duration / 3
        while !Task.isCancelled {
            try? await Task.sleep(for: wait)
            if Task.isCancelled { break }
            if let idle = activity?.idle(), idle > stall {
                let error = store.stalledLease(idle: idle, stall: stall)
                standing.lose(error)
                FileHandle.standardError.write(Data("tidemark: \(error.description)\n".utf8))
                return
            }
            let sent = ContinuousClock.now
            switch await store.renew(id, fence: fence) {
            case .held(let remaining):
                standing.confirmed(at: sent, remaining: remaining)
                wait = duration / 3
            case .lost(let why):
                standing.lose(store.lostLease(why))
                return
            case .unreachable:
                // A failed renewal is tried again soon; the lease stays valid until its expiry.
                wait = min(duration / 3, .seconds(2))
            }
        }
    }

    /// The fencing counter the lease was taken with.
    let fence: Int64

    func ensureHeld() async throws {
        let (store, id, fence) = (store, id, fence)
        try await standing.ensure(ask: { await store.checkHeld(id, fence: fence) }, lost: store.lostLease)
    }

    func release() async {
        await store.release(id)
    }

    /// Why the lease was lost, once it was.
    var lost: StateStoreError? { standing.lost }
}

/// What a lease holder knows of its lease: until when it is surely valid (a lower bound on its expiry
/// by the server's clock, measured on this process's monotonic clock from before the server was asked),
/// when the server was last asked, and whether it was lost.
final class LeaseStanding: Sendable {
    private struct Fields {
        var validUntil: ContinuousClock.Instant
        var checkedAt: ContinuousClock.Instant
        var lost: StateStoreError?
        /// A caller is asking the server now: the others go on while the lease is surely valid.
        var asking = false
    }

    private let fields: Mutex<Fields>
    let duration: Duration
    /// How stale a confirmation may be before a request asks the server again: a lease broken by
    /// `force-unlock` or taken over stops this run's requests within this time.
    let recheck: Duration

    init(duration: Duration, validUntil: ContinuousClock.Instant) {
        self.duration = duration
        recheck = min(.seconds(1), duration / 10)
        fields = Mutex(Fields(validUntil: validUntil, checkedAt: ContinuousClock.now, lost: nil))
    }

    /// Room left for clocks that run at slightly different rates.
    static func margin(_ duration: Duration) -> Duration { min(.seconds(5), duration / 10) }

    enum Next {
        case held
        case lost(StateStoreError)
        case confirm
    }

    /// What a request does now: go, stop, or ask the server first. One request at a time asks (at
    /// thousands of requests a second, one round trip a second, not one per request); the rest go on
    /// while the lease is surely valid, and only past that bound does each wait for an answer.
    func next(at now: ContinuousClock.Instant) -> Next {
        fields.withLock { f in
            if let lost = f.lost { return .lost(lost) }
            guard now < f.validUntil else { return .confirm }
            if now - f.checkedAt < recheck || f.asking { return .held }
            f.asking = true
            return .confirm
        }
    }

    var validUntil: ContinuousClock.Instant { fields.withLock { $0.validUntil } }

    /// Returns when a request may go (the lease is surely held), asking the server through `ask`
    /// when `next` says to; throws when the lease is lost (`lost` words why) or, past its bound, the
    /// server cannot be asked.
    func ensure(
        ask: () async -> PostgresStateStore.LeaseCheck, lost: (String) -> StateStoreError
    ) async throws {
        while true {
            switch next(at: ContinuousClock.now) {
            case .held: return
            case .lost(let error): throw error
            case .confirm:
                let sent = ContinuousClock.now
                switch await ask() {
                case .held(let remaining):
                    confirmed(at: sent, remaining: remaining)
                    // The answer vouches for the lease until `sent + remaining`, no longer. One that
                    // arrives after that (this process was paused, or the link stalled, while it
                    // travelled) proves nothing now: the server is asked again, and a lease taken over
                    // meanwhile is found lost before anything is sent.
                    if ContinuousClock.now < validUntil { return }
                case .lost(let why):
                    let error = lost(why)
                    lose(error)
                    throw error
                case .unreachable(let error):
                    checked(at: sent)
                    // Nobody can take the lease before it expires on the server, which is no sooner than this.
                    if ContinuousClock.now >= validUntil { throw error }
                    return
                }
            }
        }
    }

    var lost: StateStoreError? { fields.withLock { $0.lost } }

    func confirmed(at sent: ContinuousClock.Instant, remaining: Duration) {
        fields.withLock { f in
            f.validUntil = max(f.validUntil, sent + remaining - Self.margin(duration))
            f.checkedAt = max(f.checkedAt, sent)
            f.asking = false
        }
    }

    func checked(at sent: ContinuousClock.Instant) {
        fields.withLock { f in
            f.checkedAt = max(f.checkedAt, sent)
            f.asking = false
        }
    }

    func lose(_ error: StateStoreError) {
        fields.withLock { f in
            if f.lost == nil { f.lost = error }
            f.asking = false
        }
    }
}
