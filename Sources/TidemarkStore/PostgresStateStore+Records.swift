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
    // MARK: - serve's records

    /// A row of `tidemark_serve` and the server's clock: workspace, owner, owner_expires, owner_fence,
    /// suspended, suspended_by, reconcile_at, reconcile_by, status, status_at, replicas, now.
    typealias ServeRow = (
        String, String?, Int64, Int64, Bool, String?, Int64, String?, ByteBuffer?, Int64, String, Int64
    )

    static let serveColumns =
        "workspace, owner, owner_expires, owner_fence, suspended, suspended_by, reconcile_at, reconcile_by, status, status_at, replicas"

    func serveRecord(_ row: PostgresRow) throws -> (ServeRecord, now: Date) {
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

    /// This workspace's record; an empty one when nothing was recorded. Creates nothing: a database
    /// without tidemark's tables (a wrong URL, `tidemark status` before any `serve`) holds no records.
    public func serveRecord() async throws -> ServeRecord {
        guard try await schemaToRead() else { return ServeRecord(workspace: workspace) }
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

    /// Every workspace's record in the database, by name (none in a database without tidemark's tables).
    public func serveRecords() async throws -> [ServeRecord] {
        guard try await schemaToRead() else { return [] }
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
}
