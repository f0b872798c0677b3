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
}
