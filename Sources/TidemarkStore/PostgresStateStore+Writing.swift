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
    func write(
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
    func writeTokens(_ c: PostgresLink.Connection, _ state: State, _ write: StateWrite) async throws {
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
}
