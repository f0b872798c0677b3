import Foundation
import Logging
import NIOCore
import PostgresNIO
import Synchronization
import TidemarkCore

#if canImport(Glibc)
import Glibc
#endif

/// tidemark's state in PostgreSQL, shared by every runner: one workspace per project and
/// environment, each with its own lineage, serial, journal and lease.
///
/// Normalised like the SQLite store: a row per token, a row per topic and group (memberships as
/// sorted token-id blobs), journal rows; every save is one transaction that checks the lease's
/// fencing counter, writes only what its `StateWrite` names, and bumps the serial. Nothing uses
/// session state (no advisory locks, no `SET`), so it works through PgBouncer in transaction pooling.
public final class PostgresStateStore: ServeRecordKeeping {
    /// The schema this tidemark writes; a database at a newer version is refused.
    public static let schemaVersion = 7

    /// The server and database.
    public let url: PostgresURL
    /// The workspace (one state per workspace in the same database).
    public let workspace: String
    /// How messages name the store: the URL without its password, and the workspace.
    public let location: String
    /// How long a lease lives without a heartbeat.
    public let leaseDuration: Duration
    private let link: PostgresLink
    /// The lease's own connection: a heartbeat or a lease check never waits behind a long save.
    private let leaseLink: PostgresLink
    /// The lease this store object holds, checked by every save (fencing). A process uses one store
    /// object per workspace, so the lease its lock took covers all its writes.
    private let held = Mutex<(id: String, fence: Int64)?>(nil)
    /// When the work under this store's lease last moved: every committed state transaction counts.
    private let activity = LeaseActivity()

    /// A store of `workspace` at `url`; nothing is opened until the first call.
    public init(
        url: PostgresURL, workspace: String = "default", leaseDuration: Duration = .seconds(60),
        location: String? = nil
    ) {
        self.url = url
        self.workspace = workspace
        self.leaseDuration = leaseDuration
        let location = location ?? "\(url.display) (workspace \(workspace))"
        self.location = location
        link = PostgresLink(url: url, location: location, committed: { [activity] in activity.progressed() })
        leaseLink = PostgresLink(url: url, location: location)
    }

    /// Closes the connection (a CLI process may simply exit).
    public func close() async {
        await link.close()
        await leaseLink.close()
    }

    /// Runs one statement outside a transaction (tests and maintenance: CREATE DATABASE cannot run in one).
    func execute(_ sql: String) async throws { try await link.execute(sql) }

    // MARK: - Reading

    /// The workspace's lineage and serial alone (one row); nil when it has no state.
    public func revision() async throws -> StateRevision? {
        try await ensureSchema()
        return try await link.transaction(readOnly: true) { c -> StateRevision? in
            guard
                let row = try await c.first(
                    "SELECT lineage, serial FROM tidemark_workspaces WHERE name = \(self.workspace)")
            else { return nil }
            let (lineage, serial) = try self.decode(row, (String, Int64).self, table: "tidemark_workspaces")
            return StateRevision(lineage: lineage, serial: Int(serial))
        }
    }

    /// The workspace's state, read in one read-only transaction; nil when it has none.
    public func load() async throws -> State? {
        try await ensureSchema()
        // In `serve`'s whole reads, the tokens the last one kept are kept again rather than made anew.
        let reuse = StringReuse.current
        return try await link.transaction(readOnly: true) { c -> State? in
            guard
                let row = try await c.first(
                    """
                    SELECT lineage, serial, backend, project, inventory_rows FROM tidemark_workspaces
                    WHERE name = \(self.workspace)
                    """)
            else { return nil }
            let (lineage, serial, kind, project, inventoryRows) = try self.decode(
                row, (String, Int64, String?, String?, String).self, table: "tidemark_workspaces")
            var tokenList: [String] = []
            var seenAt: [Int64] = []
            var dead: [UInt32] = []
            var deviceIDs: [String] = []
            var leftAt: [Int64] = []
            let tokens = try await c.query(
                "SELECT id, token, seen_at, dead, device_id, left_at FROM tidemark_tokens WHERE workspace = \(self.workspace) ORDER BY id"
            )
            for try await row in tokens {
                let (id, token, seen, isDead, device, left) = try self.decode(
                    row, (Int64, String, Int64, Bool, String, Int64).self, table: "tidemark_tokens")
                deviceIDs.append(reuse?.deviceID(device, ofToken: Int(id)) ?? device)
                leftAt.append(left)
                guard Int(id) == tokenList.count else {
                    throw self.damaged("table 'tidemark_tokens': token ids are not dense at id \(id)")
                }
                tokenList.append(reuse?.token(token, id: Int(id)) ?? token)
                seenAt.append(seen)
                if isDead { dead.append(UInt32(id)) }
            }
            if let (id, problem) = TokenRegistry.firstMalformed(tokenList) {
                throw self.damaged(
                    "table 'tidemark_tokens': id \(id) is not a registration token (\(problem)); the row was edited or damaged, so nothing is planned from it. Restore the workspace from a backup ('tidemark state push' of a good copy), or start over with 'tidemark import'"
                )
            }
            let table: TokenRegistry
            do {
                table = try TokenRegistry(tokens: tokenList, seenAt: seenAt, deviceIDs: deviceIDs, leftAt: leftAt)
            } catch let error as TokenRegistry.RepeatedToken {
                throw self.damaged(
                    "table 'tidemark_tokens': id \(error.id) holds the same token\(error.earlier.map { " as id \($0)" } ?? "")"
                )
            }
            tokenList = []
            var topics: [String: TopicState] = [:]
            for try await row in try await c.query(
                "SELECT name, mode, protect, managed, observed, opted_out FROM tidemark_topics WHERE workspace = \(self.workspace)"
            ) {
                let (name, mode, protect, managed, observed, optedOut) = try self.decode(
                    row, (String, String, Bool, ByteBuffer, ByteBuffer, ByteBuffer).self, table: "tidemark_topics")
                guard let topicMode = TopicMode(rawValue: mode) else {
                    throw self.damaged("table 'tidemark_topics': topic '\(name)' has the unknown mode '\(mode)'")
                }
                topics[name] = TopicState(
                    mode: topicMode, protect: protect,
                    managed: try self.tokenSet(managed, count: table.count, table: "tidemark_topics"),
                    observed: try self.tokenSet(observed, count: table.count, table: "tidemark_topics"),
                    optedOut: try self.tokenSet(optedOut, count: table.count, table: "tidemark_topics"))
            }
            var groups: [String: GroupState] = [:]
            for try await row in try await c.query(
                """
                SELECT name, key, protect, members, audience, exported, exported_at FROM tidemark_groups
                WHERE workspace = \(self.workspace)
                """)
            {
                let (name, key, protect, members, audience, exported, exportedAt) = try self.decode(
                    row, (String, String?, Bool, ByteBuffer, Bool, ByteBuffer?, Int64).self, table: "tidemark_groups")
                groups[name] = GroupState(
                    key: key, protect: protect,
                    members: try self.tokenSet(members, count: table.count, table: "tidemark_groups"),
                    audience: audience,
                    exported: try exported.map { try self.tokenSet($0, count: table.count, table: "tidemark_groups") },
                    exportedAt: exportedAt)
            }
            var backend: BackendIdentity?
            if let kind, let project {
                guard let known = BackendKind(rawValue: kind) else {
                    throw self.damaged("table 'tidemark_workspaces': the backend '\(kind)' is not one tidemark knows")
                }
                backend = BackendIdentity(kind: known, project: project)
            }
            guard let rows = State.inventoryRows(from: inventoryRows) else {
                throw self.damaged("table 'tidemark_workspaces': the inventory counts are not what tidemark writes")
            }
            var versions: [String: Int] = [:]
            for try await row in try await c.query(
                "SELECT key, serial FROM tidemark_row_versions WHERE workspace = \(self.workspace)")
            {
                let (key, serial) = try self.decode(row, (String, Int64).self, table: "tidemark_row_versions")
                versions[key] = Int(serial)
            }
            return State(
                lineage: lineage, serial: Int(serial), tokens: table, dead: TokenSet(sorted: dead),
                topics: topics, groups: groups, backend: backend, versions: versions, inventoryRows: rows)
        }
    }

    // MARK: - Writing

    @discardableResult
    /// Writes what `write` names in one transaction, checked against this store's lease (fencing); returns the new serial.
    public func save(_ state: inout State, _ write: StateWrite, at now: Int64) async throws -> Int {
        let snapshot = state
        let fence = held.withLock { $0 }
        try await ensureSchema()
        let serial = try await link.transaction { c in
            try await self.write(c, snapshot, write, at: now, fence: fence)
        }
        state.saved(serial: serial, versionKeys: write.versionKeys, restored: write.restore)
        return serial
    }

    /// Writes `write` of `state` here and `otherWrite` of `otherState` into `other`, in one
    /// transaction, when `other` is another workspace of this database (each checked against its own
    /// lease); throws `.unsupported` for any other store. `tidemark state mv` within one database.
    public func saveTogether(
        _ state: inout State, _ write: StateWrite, with other: any StateStore, _ otherState: inout State,
        _ otherWrite: StateWrite, at now: Int64
    ) async throws -> (Int, Int) {
        guard let other = other as? PostgresStateStore, other.url.display == url.display,
            other.workspace != workspace
        else {
            throw StateStoreError(.unsupported, path: location, "writes with another store only within one database")
        }
        let (mine, theirs) = (state, otherState)
        let (fence, otherFence) = (held.withLock { $0 }, other.held.withLock { $0 })
        try await ensureSchema()
        let serials = try await link.transaction { c in
            // Workspace rows in name order, as every writer takes them: two such writes never deadlock.
            if self.workspace < other.workspace {
                let a = try await self.write(c, mine, write, at: now, fence: fence)
                return (a, try await other.write(c, theirs, otherWrite, at: now, fence: otherFence))
            }
            let b = try await other.write(c, theirs, otherWrite, at: now, fence: otherFence)
            return (try await self.write(c, mine, write, at: now, fence: fence), b)
        }
        state.saved(serial: serials.0, versionKeys: write.versionKeys, restored: write.restore)
        otherState.saved(serial: serials.1, versionKeys: otherWrite.versionKeys, restored: otherWrite.restore)
        return serials
    }

    /// The statements of one save of this workspace, inside the transaction `c`; returns the new serial.
    private func write(
        _ c: PostgresLink.Connection, _ snapshot: State, _ write: StateWrite, at now: Int64,
        fence: (id: String, fence: Int64)?
    ) async throws -> Int {
        try await self.checkLease(c, held: fence)
        let workspace = self.workspace
        var current = try await c.first(
            "SELECT serial FROM tidemark_workspaces WHERE name = \(workspace) FOR UPDATE")
        if current == nil {
            try await c.run(
                """
                INSERT INTO tidemark_workspaces (name, lineage, serial, created_at) VALUES (\(workspace), \(snapshot.lineage), 0, \(now))
                ON CONFLICT (name) DO NOTHING
                """)
            current = try await c.first(
                "SELECT serial FROM tidemark_workspaces WHERE name = \(workspace) FOR UPDATE")
        }
        guard let current else { throw self.damaged("table 'tidemark_workspaces': the workspace row vanished") }
        let next =
            write.restore
            ? snapshot.serial : Int(try self.decode(current, Int64.self, table: "tidemark_workspaces")) + 1
        try await self.writeTokens(c, snapshot, write)
        for name in Set(write.topics) {
            if let topic = snapshot.topics[name] {
                try await c.run(
                    """
                    INSERT INTO tidemark_topics (workspace, name, mode, protect, managed, observed, opted_out)
                    VALUES (\(workspace), \(name), \(topic.mode.rawValue), \(topic.protect), \(Self.bytes(topic.managed)),
                        \(Self.bytes(topic.observed)), \(Self.bytes(topic.optedOut)))
                    ON CONFLICT (workspace, name) DO UPDATE SET mode = EXCLUDED.mode, protect = EXCLUDED.protect,
                        managed = EXCLUDED.managed, observed = EXCLUDED.observed, opted_out = EXCLUDED.opted_out
                    """)
            } else {
                try await c.run("DELETE FROM tidemark_topics WHERE workspace = \(workspace) AND name = \(name)")
            }
        }
        for name in Set(write.groups) {
            if let group = snapshot.groups[name] {
                try await c.run(
                    """
                    INSERT INTO tidemark_groups (workspace, name, key, protect, members, audience, exported, exported_at)
                    VALUES (\(workspace), \(name), \(group.key), \(group.protect), \(Self.bytes(group.members)),
                        \(group.audience), \(group.exported.map(Self.bytes)), \(group.exportedAt))
                    ON CONFLICT (workspace, name) DO UPDATE SET key = EXCLUDED.key, protect = EXCLUDED.protect,
                        members = EXCLUDED.members, audience = EXCLUDED.audience, exported = EXCLUDED.exported,
                        exported_at = EXCLUDED.exported_at
                    """)
            } else {
                try await c.run("DELETE FROM tidemark_groups WHERE workspace = \(workspace) AND name = \(name)")
            }
        }
        if let (id, plan) = write.beginApply {
            var buffer = ByteBuffer()
            // Tokens as ids of the table written above, in this transaction (see JournalPlan).
            buffer.writeBytes(
                try JournalPlan.encode(plan, tokens: snapshot.tokens.table)
                    ?? Plan.encoder(pretty: false).encode(plan))
            try await c.run(
                """
                INSERT INTO tidemark_applies (workspace, id, started_at, status, manifests_digest, operations_digest,
                    operation_count, plan)
                VALUES (\(workspace), \(id), \(now), \(ApplyStatus.running.rawValue), \(plan.manifestsDigest),
                    \(plan.operationsDigest), \(plan.operations.count), \(buffer))
                """)
        }
        for entry in write.finishedOperations {
            try await c.run(
                """
                INSERT INTO tidemark_apply_operations (workspace, apply_id, idx, finished_at, ok, failed)
                VALUES (\(workspace), \(entry.applyID), \(entry.index), \(now), \(entry.ok), \(entry.failed))
                ON CONFLICT (workspace, apply_id, idx) DO UPDATE SET finished_at = EXCLUDED.finished_at,
                    ok = EXCLUDED.ok, failed = EXCLUDED.failed
                """)
            try await c.run(
                """
                DELETE FROM tidemark_apply_progress WHERE workspace = \(workspace) AND apply_id = \(entry.applyID)
                    AND idx = \(entry.index)
                """)
        }
        for progress in write.operationProgress {
            try await c.run(
                """
                INSERT INTO tidemark_apply_progress (workspace, apply_id, idx, tokens_done, ok, failed)
                VALUES (\(workspace), \(progress.applyID), \(progress.index), \(progress.tokensDone), \(progress.ok),
                    \(progress.failed))
                ON CONFLICT (workspace, apply_id, idx) DO UPDATE SET tokens_done = EXCLUDED.tokens_done,
                    ok = EXCLUDED.ok, failed = EXCLUDED.failed
                """)
        }
        if let (id, status) = write.finishApply {
            try await c.run(
                """
                UPDATE tidemark_applies SET status = \(status.rawValue), finished_at = \(now)
                WHERE workspace = \(workspace) AND id = \(id)
                """)
        }
        let versions =
            write.restore ? snapshot.versions : Dictionary(write.versionKeys.map { ($0, next) }) { a, _ in a }
        for (key, serial) in versions {
            try await c.run(
                """
                INSERT INTO tidemark_row_versions (workspace, key, serial) VALUES (\(workspace), \(key), \(serial))
                ON CONFLICT (workspace, key) DO UPDATE SET serial = EXCLUDED.serial
                """)
        }
        if let backend = snapshot.backend {
            try await c.run(
                """
                UPDATE tidemark_workspaces SET backend = \(backend.kind.rawValue), project = \(backend.project)
                WHERE name = \(workspace)
                """)
        }
        try await c.run(
            """
            UPDATE tidemark_workspaces SET serial = \(next), inventory_rows = \(snapshot.inventoryRowsText)
            WHERE name = \(workspace)
            """)
        return next
    }

    /// New tokens in batches (one statement per 20,000, arrays bound as parameters), then the last-seen
    /// time and liveness of those the write names.
    private func writeTokens(_ c: PostgresLink.Connection, _ state: State, _ write: StateWrite) async throws {
        // A rebuilt token table replaces the stored one, in the same transaction as every set.
        if write.compact { try await c.run("DELETE FROM tidemark_tokens WHERE workspace = \(workspace)") }
        let row = try await c.first(
            "SELECT coalesce(max(id) + 1, 0) FROM tidemark_tokens WHERE workspace = \(workspace)")
        let stored = Int(try row.map { try decode($0, Int64.self, table: "tidemark_tokens") } ?? 0)
        let batch = 20_000
        var start = stored
        while start < state.tokens.count {
            let end = min(state.tokens.count, start + batch)
            let ids = (start..<end).map { Int64($0) }
            let tokens = (start..<end).map { state.tokens[UInt32($0)] }
            let seen = Array(state.seenAt[start..<end])
            let dead = (start..<end).map { state.dead.contains(UInt32($0)) }
            let devices = Array(state.deviceIDs[start..<end])
            let left = Array(state.leftAt[start..<end])
            try await c.run(
                """
                INSERT INTO tidemark_tokens (workspace, id, token, seen_at, dead, device_id, left_at)
                SELECT \(workspace), * FROM unnest(\(ids)::bigint[], \(tokens)::text[], \(seen)::bigint[], \(dead)::boolean[],
                    \(devices)::text[], \(left)::bigint[])
                """)
            start = end
        }
        let touched: [UInt32] =
            write.allTokens
            ? Array(0..<UInt32(min(stored, state.tokens.count))) : write.tokens.filter { Int($0) < stored }
        var offset = 0
        while offset < touched.count {
            let slice = touched[offset..<min(touched.count, offset + batch)]
            let ids = slice.map { Int64($0) }
            let (seenAt, deviceIDs, leftAt) = (state.seenAt, state.deviceIDs, state.leftAt)
            let seen = slice.map { seenAt[Int($0)] }
            let dead = slice.map { state.dead.contains($0) }
            let devices = slice.map { deviceIDs[Int($0)] }
            let left = slice.map { leftAt[Int($0)] }
            try await c.run(
                """
                UPDATE tidemark_tokens AS t SET seen_at = u.seen_at, dead = u.dead, device_id = u.device_id,
                    left_at = u.left_at
                FROM unnest(\(ids)::bigint[], \(seen)::bigint[], \(dead)::boolean[], \(devices)::text[], \(left)::bigint[])
                    AS u(id, seen_at, dead, device_id, left_at)
                WHERE t.workspace = \(workspace) AND t.id = u.id
                """)
            offset += batch
        }
    }

    // MARK: - Journal

    /// The workspace's apply that never finished, with its journal, if any.
    public func unfinishedApply() async throws -> UnfinishedApply? {
        try await ensureSchema()
        return try await link.transaction(readOnly: true) { c in
            let workspace = self.workspace
            guard
                let row = try await c.first(
                    """
                    SELECT id, started_at, plan FROM tidemark_applies WHERE workspace = \(workspace) AND status = 'running'
                    ORDER BY started_at DESC LIMIT 1
                    """)
            else { return nil }
            let (id, startedAt, data) = try self.decode(
                row, (String, Int64, ByteBuffer).self, table: "tidemark_applies")
            let plan: Plan
            do {
                let parsed = try JournalPlan.parse(Data(data.readableBytesView))
                var tokens: [UInt32: String] = [:]
                if !parsed.wanted.isEmpty {
                    let ids = parsed.wanted.map { Int64($0) }
                    for try await row in try await c.query(
                        "SELECT id, token FROM tidemark_tokens WHERE workspace = \(workspace) AND id = ANY(\(ids))")
                    {
                        let (id, token) = try self.decode(row, (Int64, String).self, table: "tidemark_tokens")
                        if let key = UInt32(exactly: id) { tokens[key] = token }
                    }
                }
                plan = try JournalPlan.resolve(parsed, tokens: tokens)
            } catch let damaged as JournalPlan.Damaged {
                throw self.damaged(
                    "table 'tidemark_applies': the journal's plan of apply \(id) cannot be read: \(damaged)")
            } catch let error as StateStoreError {
                throw error
            } catch is DecodingError {
                throw self.damaged("table 'tidemark_applies': the journal's plan of apply \(id) cannot be read")
            }
            var done: Set<Int> = []
            for try await row in try await c.query(
                "SELECT idx FROM tidemark_apply_operations WHERE workspace = \(workspace) AND apply_id = \(id)")
            {
                let index = Int(try self.decode(row, Int64.self, table: "tidemark_apply_operations"))
                guard plan.operations.indices.contains(index) else {
                    throw self.damaged(
                        "table 'tidemark_apply_operations': apply \(id) records operation \(index), which its plan does not have"
                    )
                }
                done.insert(index)
            }
            var progress: [Int: OperationProgress] = [:]
            for try await row in try await c.query(
                """
                SELECT idx, tokens_done, ok, failed FROM tidemark_apply_progress
                WHERE workspace = \(workspace) AND apply_id = \(id)
                """)
            {
                let (index, tokens, ok, failed) = try self.decode(
                    row, (Int64, Int64, Int64, Int64).self, table: "tidemark_apply_progress")
                guard plan.operations.indices.contains(Int(index)),
                    (0...plan.operations[Int(index)].tokens.count).contains(Int(tokens))
                else {
                    throw self.damaged(
                        "table 'tidemark_apply_progress': apply \(id) records progress its plan does not have (operation \(index))"
                    )
                }
                progress[Int(index)] = OperationProgress(
                    applyID: id, index: Int(index), tokensDone: Int(tokens), ok: Int(ok), failed: Int(failed))
            }
            return UnfinishedApply(
                id: id, startedAt: Date(timeIntervalSince1970: TimeInterval(startedAt)), plan: plan, done: done,
                progress: progress)
        }
    }

    /// The workspace's latest applies, newest first.
    public func applies(limit: Int) async throws -> [ApplyRecord] {
        try await ensureSchema()
        return try await link.transaction(readOnly: true) { c in
            var records: [ApplyRecord] = []
            for try await row in try await c.query(
                """
                SELECT a.id, a.status, a.started_at, a.operation_count,
                    (SELECT count(*) FROM tidemark_apply_operations o WHERE o.workspace = a.workspace AND o.apply_id = a.id)
                FROM tidemark_applies a WHERE a.workspace = \(self.workspace)
                ORDER BY a.started_at DESC, a.id DESC LIMIT \(limit)
                """)
            {
                let (id, status, started, operations, done) = try self.decode(
                    row, (String, String, Int64, Int64, Int64).self, table: "tidemark_applies")
                guard let parsed = ApplyStatus(rawValue: status) else {
                    throw self.damaged("table 'tidemark_applies': apply \(id) has an unknown status")
                }
                records.append(
                    ApplyRecord(
                        id: id, status: parsed, startedAt: started, operations: Int(operations), done: Int(done)))
            }
            return records
        }
    }

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

    /// A lease with a heartbeat: it expires unless renewed, and `forceUnlock` breaks it.
    public var lockKind: StateLockKind { .lease }

    /// One bucket in this database for every run applying to the FCM project `key` names.
    public func quotaLedger(key: String) -> (any QuotaLedger)? { PostgresQuotaLedger(url: url, key: key) }

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

    private func recordBreak(
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

    private func askLease(
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
    private func checkLease(_ c: PostgresLink.Connection, held: (id: String, fence: Int64)?) async throws {
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

    private func fenced(_ why: String) -> StateStoreError { lostLease(why) }

    /// Whether `holder` ran in this machine's boot and PID namespace and its process is gone. A host
    /// name alone proves nothing (containers share them, with process ids of their own), so a holder
    /// that recorded no namespace, or another one, is left to its lease's expiry.
    static func isDeadLocalProcess(_ holder: LockHolder, namespace: String? = LockHolder.currentNamespace) -> Bool {
        guard let namespace, holder.namespace == namespace, holder.host == ProcessInfo.processInfo.hostName,
            holder.pid > 0, holder.instance != LockHolder.currentInstance
        else { return false }
        return kill(holder.pid, 0) != 0 && errno == ESRCH
    }

    // MARK: - serve's records

    /// A row of `tidemark_serve` and the server's clock: workspace, owner, owner_expires, owner_fence,
    /// suspended, suspended_by, reconcile_at, reconcile_by, status, status_at, replicas, now.
    typealias ServeRow = (
        String, String?, Int64, Int64, Bool, String?, Int64, String?, ByteBuffer?, Int64, String, Int64
    )

    private static let serveColumns =
        "workspace, owner, owner_expires, owner_fence, suspended, suspended_by, reconcile_at, reconcile_by, status, status_at, replicas"

    private func serveRecord(_ row: PostgresRow) throws -> (ServeRecord, now: Date) {
        let (
            workspace, owner, expires, fence, suspended, suspendedBy, reconcileAt, reconcileBy, status, statusAt,
            replicas, now
        ) =
            try decode(row, ServeRow.self, table: "tidemark_serve")
        var record = ServeRecord(workspace: workspace)
        record.owner = owner
        record.ownerExpires = ServeRecord.date(millis: expires)
        record.ownerFence = fence
        record.suspended = suspended
        record.suspendedBy = suspendedBy
        record.reconcileRequestedAt = ServeRecord.date(millis: reconcileAt)
        record.reconcileRequestedBy = reconcileBy
        record.status = status.map { Data($0.readableBytesView) }
        record.statusAt = ServeRecord.date(millis: statusAt)
        record.replicas = ServeRecord.replicas(text: replicas)
        return (record, ServeRecord.date(millis: now) ?? Date())
    }

    /// Deletes the applies beyond the newest `keep` with their journal rows, in one transaction; a
    /// running apply stays. Returns how many went.
    public func trimHistory(keep: Int) async throws -> Int {
        try await ensureSchema()
        return try await link.transaction { c in
            let gone = try await c.query(
                """
                DELETE FROM tidemark_applies WHERE workspace = \(self.workspace) AND status <> 'running'
                AND id NOT IN (SELECT id FROM tidemark_applies WHERE workspace = \(self.workspace)
                    ORDER BY started_at DESC, id DESC LIMIT \(Int64(keep)))
                RETURNING id
                """
            ).collect()
            let ids = try gone.map { try self.decode($0, String.self, table: "tidemark_applies") }
            guard !ids.isEmpty else { return 0 }
            try await c.run(
                "DELETE FROM tidemark_apply_operations WHERE workspace = \(self.workspace) AND apply_id = ANY(\(ids))")
            try await c.run(
                "DELETE FROM tidemark_apply_progress WHERE workspace = \(self.workspace) AND apply_id = ANY(\(ids))")
            return ids.count
        }
    }

    /// Reads this workspace's record for update, lets `change` edit it (with the server's clock), and
    /// writes it back, in one transaction.
    public func updateServeRecord<T: Sendable>(
        _ change: @Sendable @escaping (inout ServeRecord, Date) -> T
    ) async throws -> (ServeRecord, T) {
        try await ensureSchema()
        return try await link.transaction { c in
            try await c.run(
                "INSERT INTO tidemark_serve (workspace) VALUES (\(self.workspace)) ON CONFLICT (workspace) DO NOTHING")
            guard
                let row = try await c.first(
                    """
                    SELECT \(unescaped: Self.serveColumns), \(unescaped: Self.nowSQL) FROM tidemark_serve
                    WHERE workspace = \(self.workspace) FOR UPDATE
                    """)
            else { throw self.damaged("table 'tidemark_serve': the workspace's row vanished") }
            var (record, now) = try self.serveRecord(row)
            let result = change(&record, now)
            let status = record.status.map { ByteBuffer(bytes: $0) }
            try await c.run(
                """
                UPDATE tidemark_serve SET owner = \(record.owner), owner_expires = \(ServeRecord.millis(record.ownerExpires)),
                    owner_fence = \(record.ownerFence), suspended = \(record.suspended), suspended_by = \(record.suspendedBy),
                    reconcile_at = \(ServeRecord.millis(record.reconcileRequestedAt)), reconcile_by = \(record.reconcileRequestedBy),
                    status = \(status), status_at = \(ServeRecord.millis(record.statusAt)),
                    replicas = \(ServeRecord.replicasText(record.replicas))
                WHERE workspace = \(self.workspace)
                """)
            return (record, result)
        }
    }

    /// The workspaces of the database, by name.
    public func workspaces() async throws -> [String] {
        try await ensureSchema()
        return try await link.transaction(readOnly: true) { c in
            var names: [String] = []
            for try await row in try await c.query("SELECT name FROM tidemark_workspaces ORDER BY name") {
                names.append(try self.decode(row, String.self, table: "tidemark_workspaces"))
            }
            return names
        }
    }

    /// Deletes this workspace's rows from every table, in one transaction checked against this store's
    /// lease (fencing); the lease row goes last, with the transaction.
    public func deleteWorkspace() async throws {
        let fence = held.withLock { $0 }
        try await ensureSchema()
        try await link.transaction { c in
            try await self.checkLease(c, held: fence)
            for table in [
                "tidemark_tokens", "tidemark_topics", "tidemark_groups", "tidemark_row_versions", "tidemark_applies",
                "tidemark_apply_operations", "tidemark_apply_progress", "tidemark_serve", "tidemark_lease_breaks",
                "tidemark_leases",
            ] {
                try await c.run("DELETE FROM \(unescaped: table) WHERE workspace = \(self.workspace)")
            }
            try await c.run("DELETE FROM tidemark_workspaces WHERE name = \(self.workspace)")
        }
    }

    /// This workspace's record; an empty one when nothing was recorded.
    public func serveRecord() async throws -> ServeRecord {
        try await ensureSchema()
        return try await link.transaction(readOnly: true) { c in
            guard
                let row = try await c.first(
                    """
                    SELECT \(unescaped: Self.serveColumns), \(unescaped: Self.nowSQL) FROM tidemark_serve
                    WHERE workspace = \(self.workspace)
                    """)
            else { return ServeRecord(workspace: self.workspace) }
            return try self.serveRecord(row).0
        }
    }

    /// Every workspace's record in the database, by name.
    public func serveRecords() async throws -> [ServeRecord] {
        try await ensureSchema()
        return try await link.transaction(readOnly: true) { c in
            var records: [ServeRecord] = []
            for try await row in try await c.query(
                "SELECT \(unescaped: Self.serveColumns), \(unescaped: Self.nowSQL) FROM tidemark_serve ORDER BY workspace"
            ) {
                records.append(try self.serveRecord(row).0)
            }
            return records
        }
    }

    // MARK: - Schema

    static let nowSQL = "(extract(epoch from clock_timestamp()) * 1000)::bigint"

    /// Creates the schema on first use and applies versioned migrations, in a transaction of its own
    /// under a transaction-scoped advisory lock (so two runners never migrate at once, and PgBouncer's
    /// transaction pooling is no obstacle); a newer database is refused.
    private func ensureSchema() async throws {
        if await link.migrated { return }
        // Usually the schema is current: a plain read says so without the migration lock, which every
        // runner would otherwise queue on (and behind any one of them that stalls).
        if try await currentSchema() != Self.schemaVersion {
            try await link.transaction { c in try await self.migrate(c) }
        }
        await link.setMigrated()
    }

    /// The schema version the database is at, or nil when it has none yet (or it cannot be read that way).
    private func currentSchema() async throws -> Int? {
        let version: Int32?? = try await link.transaction(readOnly: true) { c in
            guard
                try await c.first(
                    "SELECT 1 FROM pg_catalog.pg_tables WHERE tablename = 'tidemark_schema' AND schemaname = current_schema()"
                ) != nil
            else { return .none }
            guard let row = try await c.first("SELECT max(version) FROM tidemark_schema") else { return .none }
            return .some(try self.decode(row, Int32?.self, table: "tidemark_schema"))
        }
        guard let version, let version else { return nil }
        let current = Int(version)
        guard current <= Self.schemaVersion else {
            throw StateStoreError(
                .newerFormat, path: location, "schema version \(current); this tidemark writes \(Self.schemaVersion)")
        }
        return current
    }

    private func migrate(_ c: PostgresLink.Connection) async throws {
        try await c.run("SELECT pg_advisory_xact_lock(\(Int64(0x7469_6465_6d61_726b)))")
        try await c.run("CREATE TABLE IF NOT EXISTS tidemark_schema (version INTEGER NOT NULL)")
        var version = 0
        if let row = try await c.first("SELECT max(version) FROM tidemark_schema") {
            version = Int(try decode(row, Int32?.self, table: "tidemark_schema") ?? 0)
        }
        guard version <= Self.schemaVersion else {
            throw StateStoreError(
                .newerFormat, path: location, "schema version \(version); this tidemark writes \(Self.schemaVersion)")
        }
        for (index, migration) in Self.migrations.enumerated() where index + 1 > version {
            for statement in migration { try await c.run(PostgresQuery(unsafeSQL: statement)) }
            try await c.run("INSERT INTO tidemark_schema (version) VALUES (\(Int32(index + 1)))")
        }
    }

    // MARK: - Quota

    /// Takes `permits` from the shared bucket `key` (one per FCM project), refilled at `rate` a second
    /// up to `capacity`, going into debt if need be; returns the seconds the caller must wait. One
    /// transaction on the server's clock, so every runner draws from the same bucket.
    func reserveQuota(key: String, permits: Double, rate: Double, capacity: Double) async throws -> Double {
        try await ensureSchema()
        return try await link.transaction { c in
            try await c.run(
                """
                INSERT INTO tidemark_quota (key, level, last_ms) VALUES (\(key), \(capacity), \(unescaped: Self.nowSQL))
                ON CONFLICT (key) DO NOTHING
                """)
            let row = try await c.first(
                """
                UPDATE tidemark_quota SET
                    level = least(\(capacity), level + greatest(0, \(unescaped: Self.nowSQL) - last_ms) * \(rate) / 1000.0)
                        - \(permits),
                    last_ms = greatest(last_ms, \(unescaped: Self.nowSQL))
                WHERE key = \(key) RETURNING level
                """)
            guard let row else { throw self.damaged("table 'tidemark_quota': the bucket row vanished") }
            let level = try self.decode(row, Double.self, table: "tidemark_quota")
            return level < 0 ? -level / rate : 0
        }
    }

    /// Migration N brings the schema from version N-1 to N. Never edit one that has shipped.
    static let migrations: [[String]] = [
        [
            """
            CREATE TABLE tidemark_workspaces (name TEXT PRIMARY KEY, lineage TEXT NOT NULL, serial BIGINT NOT NULL,
                created_at BIGINT NOT NULL, backend TEXT, project TEXT)
            """,
            """
            CREATE TABLE tidemark_tokens (workspace TEXT NOT NULL, id BIGINT NOT NULL, token TEXT NOT NULL,
                seen_at BIGINT NOT NULL DEFAULT 0, dead BOOLEAN NOT NULL DEFAULT false, PRIMARY KEY (workspace, id))
            """,
            """
            CREATE TABLE tidemark_topics (workspace TEXT NOT NULL, name TEXT NOT NULL, mode TEXT NOT NULL,
                protect BOOLEAN NOT NULL, managed BYTEA NOT NULL, observed BYTEA NOT NULL, opted_out BYTEA NOT NULL,
                PRIMARY KEY (workspace, name))
            """,
            """
            CREATE TABLE tidemark_groups (workspace TEXT NOT NULL, name TEXT NOT NULL, key TEXT, protect BOOLEAN NOT NULL,
                members BYTEA NOT NULL, PRIMARY KEY (workspace, name))
            """,
            """
            CREATE TABLE tidemark_row_versions (workspace TEXT NOT NULL, key TEXT NOT NULL, serial BIGINT NOT NULL,
                PRIMARY KEY (workspace, key))
            """,
            """
            CREATE TABLE tidemark_applies (workspace TEXT NOT NULL, id TEXT NOT NULL, started_at BIGINT NOT NULL,
                finished_at BIGINT, status TEXT NOT NULL, manifests_digest TEXT NOT NULL, operations_digest TEXT NOT NULL,
                operation_count BIGINT NOT NULL, plan BYTEA NOT NULL, PRIMARY KEY (workspace, id))
            """,
            """
            CREATE TABLE tidemark_apply_operations (workspace TEXT NOT NULL, apply_id TEXT NOT NULL, idx BIGINT NOT NULL,
                finished_at BIGINT NOT NULL, ok BIGINT NOT NULL, failed BIGINT NOT NULL,
                PRIMARY KEY (workspace, apply_id, idx))
            """,
            """
            CREATE TABLE tidemark_apply_progress (workspace TEXT NOT NULL, apply_id TEXT NOT NULL, idx BIGINT NOT NULL,
                tokens_done BIGINT NOT NULL, ok BIGINT NOT NULL, failed BIGINT NOT NULL,
                PRIMARY KEY (workspace, apply_id, idx))
            """,
            """
            CREATE TABLE tidemark_leases (workspace TEXT PRIMARY KEY, lease_id TEXT NOT NULL, holder TEXT NOT NULL,
                operation TEXT, fence BIGINT NOT NULL, started_at BIGINT NOT NULL, heartbeat_at BIGINT NOT NULL,
                expires_at BIGINT NOT NULL)
            """,
            """
            CREATE TABLE tidemark_lease_breaks (workspace TEXT NOT NULL, lease_id TEXT NOT NULL, holder TEXT NOT NULL,
                broken_by TEXT NOT NULL, reason TEXT NOT NULL, broken_at BIGINT NOT NULL)
            """,
        ],
        [
            // 2: one rate-limit bucket per FCM project, shared by every runner and workspace.
            """
            CREATE TABLE tidemark_quota (key TEXT PRIMARY KEY, level DOUBLE PRECISION NOT NULL, last_ms BIGINT NOT NULL)
            """
        ],
        [
            // 3: the inventory's device id of each token, so a rotated token is recognised.
            "ALTER TABLE tidemark_tokens ADD COLUMN device_id TEXT NOT NULL DEFAULT ''",
            "ALTER TABLE tidemark_tokens ADD COLUMN left_at BIGINT NOT NULL DEFAULT 0",
        ],
        [
            // 4: audiences (named sets with no FCM group) and what `groups export` read from FCM.
            "ALTER TABLE tidemark_groups ADD COLUMN audience BOOLEAN NOT NULL DEFAULT false",
            "ALTER TABLE tidemark_groups ADD COLUMN exported BYTEA",
            "ALTER TABLE tidemark_groups ADD COLUMN exported_at BIGINT NOT NULL DEFAULT 0",
        ],
        [
            // 5: the devices each inventory source read at the last apply (the shrink guard's baseline).
            "ALTER TABLE tidemark_workspaces ADD COLUMN inventory_rows TEXT NOT NULL DEFAULT ''"
        ],
        [
            // 6: what `tidemark serve` keeps per workspace: its owner, people's requests, its status.
            """
            CREATE TABLE tidemark_serve (workspace TEXT PRIMARY KEY, owner TEXT, owner_expires BIGINT NOT NULL DEFAULT 0,
                owner_fence BIGINT NOT NULL DEFAULT 0, suspended BOOLEAN NOT NULL DEFAULT false, suspended_by TEXT,
                reconcile_at BIGINT NOT NULL DEFAULT 0, reconcile_by TEXT, status BYTEA, status_at BIGINT NOT NULL DEFAULT 0)
            """
        ],
        [
            // 7: the replicas that run each workspace and when their presence ends, to spread workspaces.
            "ALTER TABLE tidemark_serve ADD COLUMN replicas TEXT NOT NULL DEFAULT ''"
        ],
    ]

    // MARK: - Rows

    private func decode<T>(_ row: PostgresRow, _ type: T.Type, table: String) throws -> T {
        do {
            return try Self.decodeRow(row, type)
        } catch let error as StateStoreError {
            throw error
        } catch {
            throw damaged("table '\(table)' has a row tidemark did not write (\(ErrorText.describe(error)))")
        }
    }

    private static func decodeRow<T>(_ row: PostgresRow, _ type: T.Type) throws -> T {
        switch type {
        case is Int64.Type: return try row.decode(Int64.self) as! T
        case is Double.Type: return try row.decode(Double.self) as! T
        case is String.Type: return try row.decode(String.self) as! T
        case is Int32?.Type: return try row.decode(Int32?.self) as! T
        case is Int32.Type: return try row.decode(Int32.self) as! T
        case is (String, String, Bool).Type: return try row.decode((String, String, Bool).self) as! T
        case is (String, Int64, String?, String?).Type:
            return try row.decode((String, Int64, String?, String?).self) as! T
        case is (String, Int64, String?, String?, String).Type:
            return try row.decode((String, Int64, String?, String?, String).self) as! T
        case is (Int64, String, Int64, Bool).Type: return try row.decode((Int64, String, Int64, Bool).self) as! T
        case is (Int64, String, Int64, Bool, String, Int64).Type:
            return try row.decode((Int64, String, Int64, Bool, String, Int64).self) as! T
        case is (String, String, Bool, ByteBuffer, ByteBuffer, ByteBuffer).Type:
            return try row.decode((String, String, Bool, ByteBuffer, ByteBuffer, ByteBuffer).self) as! T
        case is (String, String?, Bool, ByteBuffer, Bool, ByteBuffer?, Int64).Type:
            return try row.decode((String, String?, Bool, ByteBuffer, Bool, ByteBuffer?, Int64).self) as! T
        case is (String, Int64).Type: return try row.decode((String, Int64).self) as! T
        case is (Int64, String).Type: return try row.decode((Int64, String).self) as! T
        case is (String, Int64, ByteBuffer).Type: return try row.decode((String, Int64, ByteBuffer).self) as! T
        case is (Int64, Int64, Int64, Int64).Type: return try row.decode((Int64, Int64, Int64, Int64).self) as! T
        case is (String, String, Int64, Int64, Int64).Type:
            return try row.decode((String, String, Int64, Int64, Int64).self) as! T
        case is (String, String, Bool, Int64).Type: return try row.decode((String, String, Bool, Int64).self) as! T
        case is (String, Int64, Bool, String).Type: return try row.decode((String, Int64, Bool, String).self) as! T
        case is (String, String).Type: return try row.decode((String, String).self) as! T
        case is ServeRow.Type:
            return try row.decode(ServeRow.self) as! T
        case is (String, String, Int64).Type: return try row.decode((String, String, Int64).self) as! T
        default: fatalError("no row decoder for \(T.self)")
        }
    }

    private func damaged(_ detail: String) -> StateStoreError { StateStoreError(.damaged, path: location, detail) }

    static func bytes(_ set: TokenSet) -> ByteBuffer {
        var buffer = ByteBuffer()
        buffer.reserveCapacity(set.count * 4)
        for id in set.ids { buffer.writeInteger(id, endianness: .little) }
        return buffer
    }

    private func tokenSet(_ buffer: ByteBuffer, count: Int, table: String) throws -> TokenSet {
        guard buffer.readableBytes % 4 == 0 else {
            throw damaged("table '\(table)': a membership list has a bad length")
        }
        var buffer = buffer
        var ids: [UInt32] = []
        ids.reserveCapacity(buffer.readableBytes / 4)
        while let id = buffer.readInteger(endianness: .little, as: UInt32.self) {
            if Int(id) >= count || (ids.last.map { id <= $0 } ?? false) {
                throw damaged("table '\(table)': a membership list refers to an unknown token")
            }
            ids.append(id)
        }
        return TokenSet(sorted: ids)
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

/// One connection, used by one transaction at a time, opened on first use.
actor PostgresLink {
    let url: PostgresURL
    let location: String
    private var connection: PostgresConnection?
    private(set) var migrated = false
    private var busy = false
    private var waiting: [CheckedContinuation<Void, Never>] = []
    private static let logger = Logger(label: "tidemark.state.postgres")

    /// Called after each committed transaction (the work under a lease moved).
    private let committed: @Sendable () -> Void

    init(url: PostgresURL, location: String, committed: @escaping @Sendable () -> Void = {}) {
        self.url = url
        self.location = location
        self.committed = committed
    }

    deinit {
        // A connection must be closed before it is released; the completion keeps it until then.
        if let connection, !connection.isClosed {
            connection.close().whenComplete { _ in _ = connection }
        }
    }

    func setMigrated() { migrated = true }

    /// The queries of one transaction.
    struct Connection: Sendable {
        let base: PostgresConnection

        @discardableResult
        func query(_ query: PostgresQuery) async throws -> PostgresRowSequence {
            try await base.query(query, logger: PostgresLink.logger)
        }

        func run(_ query: PostgresQuery) async throws {
            try await base.query(query, logger: PostgresLink.logger).collect()
        }

        func first(_ query: PostgresQuery) async throws -> PostgresRow? {
            try await base.query(query, logger: PostgresLink.logger).collect().first
        }
    }

    /// Runs `body` in a transaction on the link's connection; one transaction at a time. The whole
    /// transaction has `url.timeout`: past it the connection is dropped (which fails the query it
    /// waits on, however the server or the network went away) and the error names the server.
    func transaction<T: Sendable>(
        readOnly: Bool = false, _ body: @Sendable @escaping (Connection) async throws -> T
    ) async throws -> T {
        while busy { await withCheckedContinuation { waiting.append($0) } }
        busy = true
        defer {
            busy = false
            if !waiting.isEmpty { waiting.removeFirst().resume() }
        }
        let base = try await open()
        let limit = url.timeout
        // A run paused inside a transaction (SIGSTOP, a frozen VM) must not hold its row locks, and with
        // them every other runner, for ever: the server ends a session idle in a transaction this long.
        let idle = max(1, limit.components.seconds / 3) * 1000
        // Bounded as every query tidemark sends: past the limit the connection is closed and the run goes
        // on without waiting for the statement (on a dropped connection it can wait in the driver for ever).
        do {
            let result = try await PostgresURL.bounded(base, limit) {
                try await Self.run(base, readOnly: readOnly, idleMillis: idle, body)
            }
            committed()
            return result
        } catch let late as PostgresURL.NoAnswer {
            connection = nil
            throw StateStoreError(.io, path: location, "PostgreSQL: \(late.words)")
        } catch let ended as PostgresURL.ConnectionEnded {
            connection = nil
            throw StateStoreError(.io, path: location, "PostgreSQL: \(ended.words)")
        } catch {
            if base.isClosed { connection = nil }
            if let known = error as? StateStoreError { throw known }
            throw describe(error)
        }
    }

    /// BEGIN, `body`, COMMIT; ROLLBACK when `body` fails.
    private static func run<T: Sendable>(
        _ base: PostgresConnection, readOnly: Bool, idleMillis: Int64, _ body: @Sendable (Connection) async throws -> T
    ) async throws -> T {
        let c = Connection(base: base)
        try await c.run(readOnly ? "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY" : "BEGIN")
        try await c.run(
            PostgresQuery(unsafeSQL: "SET LOCAL idle_in_transaction_session_timeout = \(idleMillis)"))
        do {
            let result = try await body(c)
            try await c.run("COMMIT")
            return result
        } catch {
            _ = try? await c.run("ROLLBACK")
            throw error
        }
    }

    func execute(_ sql: String) async throws {
        let c = Connection(base: try await open())
        do {
            try await c.run(PostgresQuery(unsafeSQL: sql))
        } catch {
            throw describe(error)
        }
    }

    /// The open connection, or a new one. Opening (TCP, TLS, start-up and authentication) is bounded
    /// by `connect_timeout`: a server that accepts and never answers fails the command, it does not hang it.
    private func open() async throws -> PostgresConnection {
        if let connection, !connection.isClosed { return connection }
        let configuration = try url.configuration()
        let limit = url.connectTimeout
        let opened: PostgresConnection?
        do {
            opened = try await TimeLimit.race(limit) {
                try await PostgresConnector.connect(self.url, configuration: configuration, id: 1, logger: Self.logger)
            } late: { connection in
                try? await connection.close()
            }
        } catch {
            throw describe(error)
        }
        guard let opened else {
            throw StateStoreError(
                .io, path: location,
                "the server accepted no PostgreSQL session within \(limit.components.seconds) s (connect_timeout); check the host and port, and that a PostgreSQL server (not another service) listens there"
            )
        }
        connection = opened
        return opened
    }

    func close() async {
        try? await connection?.close()
        connection = nil
    }

    /// A PostgreSQL error as one line naming the store: the server's message, or why it cannot be reached.
    func describe(_ error: any Error) -> StateStoreError {
        if let error = error as? StateStoreError { return error }
        return StateStoreError(.io, path: location, PostgresURL.explain(error))
    }
}

/// FCM's per-project quota as one bucket in PostgreSQL, shared by every runner and workspace that
/// applies to the project (on a connection of its own, so a long state write never delays it).
public final class PostgresQuotaLedger: QuotaLedger {
    /// The bucket's key: the FCM project.
    public let key: String
    private let store: PostgresStateStore

    /// `key` names the FCM project, such as `fcm:my-project`.
    public init(url: PostgresURL, key: String) {
        self.key = key
        store = PostgresStateStore(
            url: url, workspace: "quota",
            location: "\(url.display) (its FCM quota ledger, shared by every run applying to this FCM project)")
    }

    /// Takes `permits` from the shared bucket; returns how long to wait first, in seconds.
    public func reserve(_ permits: Double, rate: Double, capacity: Double) async throws -> Double {
        try await store.reserveQuota(key: key, permits: permits, rate: rate, capacity: capacity)
    }

    /// Closes the ledger's connection.
    public func close() async { await store.close() }
}
