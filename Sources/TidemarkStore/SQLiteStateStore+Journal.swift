import Foundation
import GRDB
import GRDBSQLite
import Synchronization
import TidemarkCore

extension SQLiteStateStore {
    // MARK: - Journal

    /// The tokens of `ids` (sorted) in the token table: looked up one by one, or read in one pass
    /// when they are many.
    func tokens(_ db: Database, _ ids: [UInt32]) throws -> [UInt32: String] {
        var found: [UInt32: String] = [:]
        found.reserveCapacity(ids.count)
        if ids.count > 100_000 {
            let wanted = Set(ids)
            let rows = try Row.fetchCursor(db, sql: "SELECT id, token FROM \(t.tokens)")
            while let row = try rows.next() {
                let id: Int64 = try cell(row, 0, in: "tokens")
                guard id >= 0, id <= Int64(UInt32.max), wanted.contains(UInt32(id)) else { continue }
                found[UInt32(id)] = try cell(row, 1, in: "tokens") as String
            }
            return found
        }
        let select = try db.makeStatement(sql: "SELECT token FROM \(t.tokens) WHERE id = ?")
        for id in ids {
            if let token = try String.fetchOne(select, arguments: [Int64(id)]) { found[id] = token }
        }
        return found
    }

    /// The workspace's apply that never finished, with its journal, if any.
    public func unfinishedApply() async throws -> UnfinishedApply? {
        guard let queue = try open(create: false) else { return nil }
        return try await running {
            try await queue.read { db in
                guard try hasWorkspace(db) else { return nil }
                guard
                    let row = try Row.fetchOne(
                        db,
                        sql: """
                            SELECT id, started_at, plan FROM \(t.applies) WHERE status = 'running' ORDER BY started_at DESC LIMIT 1
                            """)
                else { return nil }
                let id: String = try cell(row, 0, in: "applies")
                let plan: Plan
                do {
                    plan = try JournalPlan.decode(cell(row, 2, in: "applies") as Data) { ids in
                        try tokens(db, ids)
                    }
                } catch let damaged as JournalPlan.Damaged {
                    throw StateStoreError(
                        .damaged, path: location, "the journal's plan of apply \(id) cannot be read: \(damaged)")
                } catch {
                    throw StateStoreError(.damaged, path: location, "the journal's plan of apply \(id) cannot be read")
                }
                let done = try Row.fetchAll(
                    db, sql: "SELECT idx FROM \(t.apply_operations) WHERE apply_id = ?", arguments: [id]
                ).map { row -> Int in
                    let index: Int = try cell(row, 0, in: "apply_operations")
                    guard plan.operations.indices.contains(index) else {
                        throw StateStoreError(
                            .damaged, path: location,
                            "table 'apply_operations': apply \(id) records operation \(index), which its plan does not have"
                        )
                    }
                    return index
                }
                var progress: [Int: OperationProgress] = [:]
                if try db.tableExists(t.raw("apply_progress")) {
                    for row in try Row.fetchAll(
                        db, sql: "SELECT idx, tokens_done, ok, failed FROM \(t.apply_progress) WHERE apply_id = ?",
                        arguments: [id])
                    {
                        let index: Int = try cell(row, 0, in: "apply_progress")
                        let tokens: Int = try cell(row, 1, in: "apply_progress")
                        guard plan.operations.indices.contains(index),
                            (0...plan.operations[index].tokens.count).contains(tokens)
                        else {
                            throw StateStoreError(
                                .damaged, path: location,
                                "the journal of apply \(id) records progress that its plan does not have (table apply_progress, operation \(index))"
                            )
                        }
                        progress[index] = OperationProgress(
                            applyID: id, index: index, tokensDone: tokens, ok: try cell(row, 2, in: "apply_progress"),
                            failed: try cell(row, 3, in: "apply_progress"))
                    }
                }
                return UnfinishedApply(
                    id: id,
                    startedAt: Date(timeIntervalSince1970: TimeInterval(try cell(row, 1, in: "applies") as Int64)),
                    plan: plan, done: Set(done), progress: progress)
            }
        }
    }

    /// The workspace's latest applies, newest first.
    public func applies(limit: Int) async throws -> [ApplyRecord] {
        guard let queue = try open(create: false) else { return [] }
        return try await running {
            try await queue.read { db in
                guard try hasWorkspace(db) else { return [] }
                return try Row.fetchAll(
                    db,
                    sql: """
                        SELECT a.id, a.status, a.started_at, a.operation_count,
                            (SELECT count(*) FROM \(t.apply_operations) o WHERE o.apply_id = a.id)
                        FROM \(t.applies) a ORDER BY a.started_at DESC LIMIT ?
                        """, arguments: [limit]
                ).map { row in
                    let id: String = try cell(row, 0, in: "applies")
                    guard let status = ApplyStatus(rawValue: try cell(row, 1, in: "applies")) else {
                        throw StateStoreError(
                            .damaged, path: location, "table 'applies': apply \(id) has an unknown status")
                    }
                    return ApplyRecord(
                        id: id, status: status, startedAt: try cell(row, 2, in: "applies"),
                        operations: try cell(row, 3, in: "applies"), done: try cell(row, 4, in: "applies"))
                }
            }
        }
    }

    /// Deletes the applies beyond the newest `keep` with their journal rows, in one transaction; a
    /// running apply stays. Returns how many went.
    public func trimHistory(keep: Int) async throws -> Int {
        guard let queue = try open(create: false) else { return 0 }
        let t = self.t
        return try await running {
            try await queue.write { db in
                guard try hasWorkspace(db), try db.tableExists(t.raw("applies")) else { return 0 }
                let old = """
                    SELECT id FROM \(t.applies) WHERE status != 'running'
                    AND id NOT IN (SELECT id FROM \(t.applies) ORDER BY started_at DESC, id DESC LIMIT ?)
                    """
                try db.execute(sql: "DELETE FROM \(t.apply_operations) WHERE apply_id IN (\(old))", arguments: [keep])
                if try db.tableExists(t.raw("apply_progress")) {
                    try db.execute(sql: "DELETE FROM \(t.apply_progress) WHERE apply_id IN (\(old))", arguments: [keep])
                }
                try db.execute(sql: "DELETE FROM \(t.applies) WHERE id IN (\(old))", arguments: [keep])
                return db.changesCount
            }
        }
    }
}
