import Foundation
import GRDB
import GRDBSQLite
import Synchronization
import TidemarkCore

extension SQLiteStateStore {
    // MARK: - serve's records

    /// One table for every workspace of the file, made by the first record written.
    static let serveTable = """
        CREATE TABLE IF NOT EXISTS tidemark_serve (workspace TEXT PRIMARY KEY, owner TEXT,
            owner_expires INTEGER NOT NULL DEFAULT 0, owner_fence INTEGER NOT NULL DEFAULT 0,
            suspended INTEGER NOT NULL DEFAULT 0, suspended_by TEXT, reconcile_at INTEGER NOT NULL DEFAULT 0,
            reconcile_by TEXT, status BLOB, status_at INTEGER NOT NULL DEFAULT 0, replicas TEXT NOT NULL DEFAULT '')
        """

    /// Makes the table, or adds what a file written by an older tidemark lacks (the replicas' presences).
    static func makeServeTable(_ db: Database) throws {
        try db.execute(sql: serveTable)
        if try !db.columns(in: "tidemark_serve").contains(where: { $0.name == "replicas" }) {
            try db.execute(sql: "ALTER TABLE tidemark_serve ADD COLUMN replicas TEXT NOT NULL DEFAULT ''")
        }
    }

    static func serveRecord(_ row: Row) -> ServeRecord {
        var record = ServeRecord(workspace: row["workspace"])
        record.owner = row["owner"]
        record.ownerExpires = ServeRecord.date(millis: row["owner_expires"])
        record.ownerFence = row["owner_fence"]
        record.suspended = row["suspended"]
        record.suspendedBy = row["suspended_by"]
        record.reconcileRequestedAt = ServeRecord.date(millis: row["reconcile_at"])
        record.reconcileRequestedBy = row["reconcile_by"]
        record.status = row["status"]
        record.statusAt = ServeRecord.date(millis: row["status_at"])
        record.replicas = ServeRecord.replicas(text: row["replicas"] ?? "")
        return record
    }

    /// Reads this workspace's record, lets `change` edit it (with this machine's clock: SQLite state
    /// serves one replica on one machine), and writes it back, in one transaction.
    public func updateServeRecord<T: Sendable>(
        _ change: @Sendable @escaping (inout ServeRecord, Date) -> T
    ) async throws -> (ServeRecord, T) {
        guard let queue = try open(create: true) else {
            throw StateStoreError(.io, path: location, "cannot create the file")
        }
        let workspace = self.workspace
        return try await running {
            try await queue.write { db in
                try Self.makeServeTable(db)
                var record =
                    try Row.fetchOne(
                        db, sql: "SELECT * FROM tidemark_serve WHERE workspace = ?", arguments: [workspace]
                    )
                    .map(Self.serveRecord) ?? ServeRecord(workspace: workspace)
                let result = change(&record, Date())
                try db.execute(
                    sql: """
                        INSERT OR REPLACE INTO tidemark_serve (workspace, owner, owner_expires, owner_fence, suspended,
                            suspended_by, reconcile_at, reconcile_by, status, status_at, replicas)
                        VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                        """,
                    arguments: [
                        workspace, record.owner, ServeRecord.millis(record.ownerExpires), record.ownerFence,
                        record.suspended,
                        record.suspendedBy, ServeRecord.millis(record.reconcileRequestedAt),
                        record.reconcileRequestedBy,
                        record.status, ServeRecord.millis(record.statusAt), ServeRecord.replicasText(record.replicas),
                    ])
                return (record, result)
            }
        }
    }

    func readServeRecords(_ sql: String, _ arguments: StatementArguments = []) async throws -> [ServeRecord] {
        guard let queue = try open(create: false) else { return [] }
        return try await running {
            try await queue.read { db in
                guard try db.tableExists("tidemark_serve") else { return [] }
                return try Row.fetchAll(db, sql: sql, arguments: arguments).map(Self.serveRecord)
            }
        }
    }

    /// The workspaces of the file, from their tables' names: `meta` is `default`'s, `NAME:meta` another's
    /// (an upper-case letter written as '^' and the letter).
    public func workspaces() async throws -> [String] {
        guard let queue = try open(create: false) else { return [] }
        return try await running {
            try await queue.read { db in
                let names = try String.fetchAll(
                    db,
                    sql: "SELECT name FROM sqlite_master WHERE type = 'table' AND (name = 'meta' OR name LIKE '%:meta')"
                )
                return names.map { name -> String in
                    guard name != "meta" else { return "default" }
                    var workspace = ""
                    var upper = false
                    for character in name.dropLast(":meta".count) {
                        if character == "^" {
                            upper = true
                        } else {
                            workspace += upper ? character.uppercased() : String(character)
                            upper = false
                        }
                    }
                    return workspace
                }.sorted()
            }
        }
    }

    /// Drops this workspace's tables and its `serve` record, in one transaction.
    public func deleteWorkspace() async throws {
        guard let queue = try open(create: false) else { return }
        let (t, workspace) = (self.t, self.workspace)
        try await running {
            try await queue.write { db in
                for base in Self.tableNames where try db.tableExists(t.raw(base)) {
                    try db.execute(sql: "DROP TABLE \(t.quoted(base))")
                }
                if try db.tableExists("tidemark_serve") {
                    try db.execute(sql: "DELETE FROM tidemark_serve WHERE workspace = ?", arguments: [workspace])
                }
            }
        }
    }

    /// This workspace's record; an empty one when nothing was recorded.
    public func serveRecord() async throws -> ServeRecord {
        try await readServeRecords("SELECT * FROM tidemark_serve WHERE workspace = ?", [workspace]).first
            ?? ServeRecord(workspace: workspace)
    }

    /// Every workspace's record in the file, by name.
    public func serveRecords() async throws -> [ServeRecord] {
        try await readServeRecords("SELECT * FROM tidemark_serve ORDER BY workspace")
    }
}
