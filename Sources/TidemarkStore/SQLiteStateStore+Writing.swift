import Foundation
import GRDB
import GRDBSQLite
import Synchronization
import TidemarkCore

extension SQLiteStateStore {
    // MARK: - Writing

    /// Writes the parts of `state` named by `write`, and returns the new serial (also set in `state`).
    @discardableResult
    public func save(_ state: inout State, _ write: StateWrite, at now: Int64) async throws -> Int {
        let snapshot = state
        let queue = try open(create: true)!
        let serial = try await running {
            try await queue.write { db -> Int in
                if try !hasWorkspace(db) { try createSchema(db, lineage: snapshot.lineage, now: now) }
                try createLaterTables(db)
                if try !hasOptOutColumn(db) {
                    // Added after format 1 was first written; older tidemarks read the other columns as before.
                    try db.execute(sql: "ALTER TABLE \(t.topics) ADD COLUMN opted_out BLOB NOT NULL DEFAULT x''")
                }
                if try !hasDeviceColumn(db) {
                    try db.execute(sql: "ALTER TABLE \(t.tokens) ADD COLUMN device_id TEXT NOT NULL DEFAULT ''")
                    try db.execute(sql: "ALTER TABLE \(t.tokens) ADD COLUMN left_at INTEGER NOT NULL DEFAULT 0")
                }
                if try !hasAudienceColumn(db) {
                    try db.execute(sql: "ALTER TABLE \(t.groups) ADD COLUMN audience INTEGER NOT NULL DEFAULT 0")
                    try db.execute(sql: "ALTER TABLE \(t.groups) ADD COLUMN exported BLOB")
                    try db.execute(sql: "ALTER TABLE \(t.groups) ADD COLUMN exported_at INTEGER NOT NULL DEFAULT 0")
                    try db.execute(
                        sql: "UPDATE \(t.meta) SET value = ? WHERE key = 'format_version'",
                        arguments: [String(Self.formatVersion)])
                }
                let (seenAt, deviceIDs, leftAt) = (snapshot.seenAt, snapshot.deviceIDs, snapshot.leftAt)
                // A rebuilt token table replaces the stored one, in the same transaction as every set.
                if write.compact { try db.execute(sql: "DELETE FROM \(t.tokens)") }
                // Ids are dense (load refuses a gap), so the next id is the row count; max(id) is one
                // b-tree descent where count(*) reads all million rows, on every save of an apply.
                let stored = try Int.fetchOne(db, sql: "SELECT coalesce(max(id) + 1, 0) FROM \(t.tokens)") ?? 0
                if stored < snapshot.tokens.count {
                    let insert = try db.makeStatement(
                        sql:
                            "INSERT INTO \(t.tokens) (id, token, seen_at, dead, device_id, left_at) VALUES (?, ?, ?, ?, ?, ?)"
                    )
                    for id in stored..<snapshot.tokens.count {
                        try insert.execute(arguments: [
                            id, snapshot.tokens[UInt32(id)], seenAt[id],
                            snapshot.dead.contains(UInt32(id)) ? 1 : 0, deviceIDs[id], leftAt[id],
                        ])
                    }
                }
                let update = try db.makeStatement(
                    sql: "UPDATE \(t.tokens) SET seen_at = ?, dead = ?, device_id = ?, left_at = ? WHERE id = ?")
                let touched: [UInt32] =
                    write.allTokens ? Array(0..<UInt32(min(stored, snapshot.tokens.count))) : write.tokens
                for id in touched where Int(id) < stored {
                    try update.execute(arguments: [
                        seenAt[Int(id)], snapshot.dead.contains(id) ? 1 : 0, deviceIDs[Int(id)], leftAt[Int(id)],
                        id,
                    ])
                }
                for name in Set(write.topics) {
                    if let topic = snapshot.topics[name] {
                        try db.execute(
                            sql: """
                                INSERT OR REPLACE INTO \(t.topics) (name, mode, protect, managed, observed, opted_out)
                                VALUES (?, ?, ?, ?, ?, ?)
                                """,
                            arguments: [
                                name, topic.mode.rawValue, topic.protect, encode(topic.managed), encode(topic.observed),
                                encode(topic.optedOut),
                            ])
                    } else {
                        try db.execute(sql: "DELETE FROM \(t.topics) WHERE name = ?", arguments: [name])
                    }
                }
                for name in Set(write.groups) {
                    if let group = snapshot.groups[name] {
                        try db.execute(
                            sql: """
                                INSERT OR REPLACE INTO \(t.groups) (name, key, protect, members, audience, exported, exported_at)
                                VALUES (?, ?, ?, ?, ?, ?, ?)
                                """,
                            arguments: [
                                name, group.key, group.protect, encode(group.members), group.audience,
                                group.exported.map(encode), group.exportedAt,
                            ])
                    } else {
                        try db.execute(sql: "DELETE FROM \(t.groups) WHERE name = ?", arguments: [name])
                    }
                }
                PhaseTrace.mark("save: tokens, topics and groups written")
                if let (id, plan) = write.beginApply {
                    // Tokens as ids of the table written above, in this transaction (see JournalPlan).
                    let data =
                        try JournalPlan.encode(plan, tokens: snapshot.tokens.table)
                        ?? Plan.encoder(pretty: false).encode(plan)
                    PhaseTrace.mark("save: plan encoded (\(data.count) bytes)")
                    try db.execute(
                        sql: """
                            INSERT INTO \(t.applies) (id, started_at, status, manifests_digest, operations_digest, operation_count, plan)
                            VALUES (?, ?, ?, ?, ?, ?, ?)
                            """,
                        arguments: [
                            id, now, ApplyStatus.running.rawValue, plan.manifestsDigest, plan.operationsDigest,
                            plan.operations.count, data,
                        ])
                }
                for entry in write.finishedOperations {
                    try db.execute(
                        sql: """
                            INSERT OR REPLACE INTO \(t.apply_operations) (apply_id, idx, finished_at, ok, failed) VALUES (?, ?, ?, ?, ?)
                            """, arguments: [entry.applyID, entry.index, now, entry.ok, entry.failed])
                    if try db.tableExists(t.raw("apply_progress")) {
                        try db.execute(
                            sql: "DELETE FROM \(t.apply_progress) WHERE apply_id = ? AND idx = ?",
                            arguments: [entry.applyID, entry.index])
                    }
                }
                for progress in write.operationProgress {
                    try db.execute(
                        sql: """
                            INSERT OR REPLACE INTO \(t.apply_progress) (apply_id, idx, tokens_done, ok, failed) VALUES (?, ?, ?, ?, ?)
                            """,
                        arguments: [
                            progress.applyID, progress.index, progress.tokensDone, progress.ok, progress.failed,
                        ])
                }
                if let (id, status) = write.finishApply {
                    try db.execute(
                        sql: "UPDATE \(t.applies) SET status = ?, finished_at = ? WHERE id = ?",
                        arguments: [status.rawValue, now, id])
                }
                let next = write.restore ? snapshot.serial : try storedSerial(db, location: location) + 1
                let versions =
                    write.restore ? snapshot.versions : Dictionary(write.versionKeys.map { ($0, next) }) { a, _ in a }
                for (key, serial) in versions {
                    try db.execute(
                        sql: "INSERT OR REPLACE INTO \(t.row_versions) (key, serial) VALUES (?, ?)",
                        arguments: [key, serial])
                }
                if let backend = snapshot.backend {
                    for (key, value) in [("backend", backend.kind.rawValue), ("project", backend.project)] {
                        try db.execute(
                            sql: "INSERT OR REPLACE INTO \(t.meta) (key, value) VALUES (?, ?)", arguments: [key, value])
                    }
                }
                try db.execute(
                    sql: "INSERT OR REPLACE INTO \(t.meta) (key, value) VALUES ('inventory_rows', ?)",
                    arguments: [snapshot.inventoryRowsText])
                try db.execute(sql: "UPDATE \(t.meta) SET value = ? WHERE key = 'serial'", arguments: [String(next)])
                return next
            }
        }
        // The commit is in the write-ahead log; copying it into the file at once keeps the file
        // self-contained between commits, so a file copied alone after a kill (as CI jobs upload it)
        // holds every committed batch. A checkpoint that cannot finish now (a reader) is done later.
        PhaseTrace.mark("save: committed")
        _ = try? await queue.writeWithoutTransaction { db in try Self.checkpoint(db) }
        PhaseTrace.mark("save: checkpointed")
        state.saved(serial: serial, versionKeys: write.versionKeys, restored: write.restore)
        return serial
    }

    /// Copies the write-ahead log into the database file and empties it.
    static func checkpoint(_ db: Database) throws {
        _ = try Row.fetchOne(db, sql: "PRAGMA wal_checkpoint(TRUNCATE)")
    }
}
