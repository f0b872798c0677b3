import Foundation
import Logging
import NIOCore
import PostgresNIO
import TidemarkCore

/// Reads a PostgreSQL source's changes (`changes: {query, cursor}`) on one connection it keeps, made
/// again after a failure, so that following the changes every second costs a query, not a connection.
/// Every statement runs in a read-only session.
public actor PostgresChangeReader {
    private let source: PostgresInventorySource
    private var connection: (PostgresConnection, PostgresURL)?

    /// A reader of `source`'s database; it connects at its first read.
    public init(_ source: PostgresInventorySource) { self.source = source }

    /// Closes the connection (a later read opens another).
    public func close() async {
        if let (connection, _) = connection { try? await connection.close() }
        connection = nil
    }

    /// `body` on this reader, closed after it.
    func once<T: Sendable>(_ body: @Sendable (isolated PostgresChangeReader) async throws -> T) async throws -> T {
        do {
            let result = try await body(self)
            await close()
            return result
        } catch {
            await close()
            throw error
        }
    }

    /// The largest value of `changes.cursor` the changes query returns now, as PostgreSQL writes it
    /// (nil when it returns no row): where following the changes starts after a whole read.
    public func currentCursor(_ changes: PostgresSourceSettings.Changes) async throws -> String? {
        let sql =
            "SELECT max(tidemark_changes.\(changes.cursor))::text FROM (\(PostgresInventorySource.trimmed(changes.query))) tidemark_changes"
        let rows = try await run(sql, binds: PostgresBindings(), what: "the changes query")
        return try rows.first.flatMap { row in try row.first.flatMap { try PostgresInventorySource.text($0) } }
    }

    /// The devices whose rows changed after `cursor` (nil: from the start), in the cursor's order, at
    /// most `limit` rows, and the cursor after the last of them (`cursor` again when none changed).
    public func changedDevices(
        _ changes: PostgresSourceSettings.Changes, after cursor: String?, limit: Int
    ) async throws -> (ids: [String], cursor: String?) {
        var binds = PostgresBindings()
        var filter = ""
        if let cursor {
            // Untyped, so the server reads it as the cursor column's own type.
            binds.append(UntypedText(cursor))
            filter = "WHERE tidemark_changes.\(changes.cursor) > $1"
        }
        let sql = """
            SELECT tidemark_changes.*, tidemark_changes.\(changes.cursor)::text AS tidemark_cursor \
            FROM (\(PostgresInventorySource.trimmed(changes.query))) tidemark_changes \(filter) \
            ORDER BY tidemark_changes.\(changes.cursor) LIMIT \(limit)
            """
        var ids: [String] = []
        var last = cursor
        for row in try await run(sql, binds: binds, what: "the changes query") {
            var id: String?
            var value: String?
            for cell in row {
                switch cell.columnName {
                case "device_id": id = try PostgresInventorySource.text(cell)
                case "id" where id == nil: id = try PostgresInventorySource.text(cell)
                case "tidemark_cursor": value = try PostgresInventorySource.text(cell)
                default: break
                }
            }
            guard let id, !id.isEmpty else {
                throw InventorySourceError(
                    "the changes query returns a row without a 'device_id' (or 'id'); return the changed device's id (select device_id, \(changes.cursor) …). Fix 'postgres.changes.query' in tidemark.yaml."
                )
            }
            guard let value else {
                throw InventorySourceError(
                    "the changes query returns a row whose cursor column '\(changes.cursor)' is null; every changed row needs one. Fix 'postgres.changes' in tidemark.yaml."
                )
            }
            ids.append(id)
            last = value
        }
        return (ids, last)
    }

    /// Whether the changes query's cursor now stops before `cursor` (a restored table, a reset sequence,
    /// an emptied table): changes at or below `cursor` would never be read, so a whole read is due.
    public func cursorWentBack(_ changes: PostgresSourceSettings.Changes, from cursor: String) async throws -> Bool {
        var binds = PostgresBindings()
        binds.append(UntypedText(cursor))
        let sql = """
            SELECT coalesce(max(tidemark_changes.\(changes.cursor)) < $1, true) \
            FROM (\(PostgresInventorySource.trimmed(changes.query))) tidemark_changes
            """
        let rows = try await run(sql, binds: binds, what: "the changes query")
        return try rows.first.flatMap { row in try row.first.flatMap { try PostgresInventorySource.text($0) } }
            == "true"
    }

    /// Runs one statement on the kept connection and returns its rows; a failure closes it.
    private func run(_ sql: String, binds: PostgresBindings, what: String) async throws -> [PostgresRow] {
        let (connection, parsed) = try await connected()
        do {
            return try await PostgresURL.bounded(connection, parsed.timeout) {
                try await connection.query(
                    PostgresQuery(unsafeSQL: sql, binds: binds), logger: PostgresInventorySource.logger
                )
                .collect()
            }
        } catch {
            await close()
            if let known = error as? InventorySourceError { throw known }
            throw InventorySourceError(
                "\(what) failed on \(parsed.display): \(PostgresURL.explain(error))", kind: PostgresURL.kind(of: error))
        }
    }

    private func connected() async throws -> (PostgresConnection, PostgresURL) {
        if let connection { return connection }
        let made = try await PostgresURL.connect(
            source.url, urlEnv: source.urlEnv, what: nil, id: 3, logger: PostgresInventorySource.logger)
        do {
            // Read-only: even a changes query with a side effect cannot write.
            try await PostgresURL.bounded(made.0, made.1.timeout) {
                try await made.0.query(
                    "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY", logger: PostgresInventorySource.logger
                ).collect()
            }
        } catch {
            try? await made.0.close()
            throw InventorySourceError(
                "the changes query failed on \(made.1.display): \(PostgresURL.explain(error))",
                kind: PostgresURL.kind(of: error))
        }
        connection = made
        return made
    }
}
