import Foundation
import GRDB
import GRDBSQLite
import Synchronization
import TidemarkCore

extension SQLiteStateStore {
    // MARK: - Reading

    /// The lineage and serial alone; nil when the file or its workspace has no state.
    public func revision() async throws -> StateRevision? {
        guard let queue = try open(create: false) else { return nil }
        return try await running {
            try await queue.read { db -> StateRevision? in
                guard try hasWorkspace(db) else { return nil }
                try verifyWorkspace(db)
                let lineage = try String.fetchOne(db, sql: "SELECT value FROM \(t.meta) WHERE key = 'lineage'") ?? ""
                return StateRevision(lineage: lineage, serial: try storedSerial(db, location: location))
            }
        }
    }

    /// The whole state.
    public func load() async throws -> State? {
        guard let queue = try open(create: false) else { return nil }
        // In `serve`'s whole reads, the tokens the last one kept are kept again rather than made anew.
        let reuse = StringReuse.current
        return try await running {
            try await queue.read { db -> State? in
                guard try hasWorkspace(db) else { return nil }
                try verifyWorkspace(db)
                let lineage = try String.fetchOne(db, sql: "SELECT value FROM \(t.meta) WHERE key = 'lineage'") ?? ""
                let serial = try storedSerial(db, location: location)
                let count = try Int.fetchOne(db, sql: "SELECT count(*) FROM \(t.tokens)") ?? 0
                // Files written before device ids were recorded have no device_id column: none is known.
                let devices = try hasDeviceColumn(db)
                let statement = try db.makeStatement(
                    sql:
                        "SELECT id, token, seen_at, dead\(devices ? ", device_id, left_at" : "") FROM \(t.tokens) ORDER BY id"
                )
                let read = try readTokens(statement, count: count, devices: devices, reuse: reuse)
                if let (id, problem) = TokenRegistry.firstMalformed(read.tokens) {
                    throw StateStoreError(
                        .damaged, path: location,
                        "table 'tokens': id \(id) is not a registration token (\(problem)); the file was edited or damaged, so nothing is planned from it. Restore it from a backup ('tidemark state push' of a good copy), or start over with 'tidemark import'"
                    )
                }
                let table: TokenRegistry
                do {
                    table = try TokenRegistry(
                        tokens: read.tokens, seenAt: read.seenAt, deviceIDs: read.deviceIDs, leftAt: read.leftAt)
                } catch let error as TokenRegistry.RepeatedToken {
                    let first = error.earlier.map { " as id \($0)" } ?? ""
                    throw StateStoreError(
                        .damaged, path: location, "table 'tokens': id \(error.id) holds the same token\(first)")
                }
                var topics: [String: TopicState] = [:]
                // Files written before opt-outs existed have no opted_out column: none is recorded.
                let optOuts = try hasOptOutColumn(db)
                let columns = "name, mode, protect, managed, observed" + (optOuts ? ", opted_out" : "")
                // A cursor, not fetchAll: one topic's blobs at a time, not every topic's at once.
                let topicRows = try Row.fetchCursor(db, sql: "SELECT \(columns) FROM \(t.topics)")
                while let row = try topicRows.next() {
                    let name: String = try cell(row, 0, in: "topics")
                    let mode: String = try cell(row, 1, in: "topics")
                    guard let topicMode = TopicMode(rawValue: mode) else {
                        throw StateStoreError(
                            .damaged, path: location, "table 'topics': topic '\(name)' has the unknown mode '\(mode)'")
                    }
                    topics[name] = TopicState(
                        mode: topicMode, protect: try cell(row, 2, in: "topics"),
                        managed: try decode(cell(row, 3, in: "topics"), count: table.count, in: "topics"),
                        observed: try decode(cell(row, 4, in: "topics"), count: table.count, in: "topics"),
                        optedOut: optOuts
                            ? try decode(cell(row, 5, in: "topics"), count: table.count, in: "topics") : TokenSet())
                }
                var groups: [String: GroupState] = [:]
                // Files written before audiences have no audience column: every row is a device group.
                let audiences = try hasAudienceColumn(db)
                let groupColumns =
                    "name, key, protect, members" + (audiences ? ", audience, exported, exported_at" : "")
                for row in try Row.fetchAll(db, sql: "SELECT \(groupColumns) FROM \(t.groups)") {
                    var group = GroupState(
                        key: try cell(row, 1, in: "groups"), protect: try cell(row, 2, in: "groups"),
                        members: try decode(cell(row, 3, in: "groups"), count: table.count, in: "groups"))
                    if audiences {
                        group.audience = try cell(row, 4, in: "groups")
                        let exported: Data? = try cell(row, 5, in: "groups")
                        group.exported = try exported.map { try decode($0, count: table.count, in: "groups") }
                        group.exportedAt = try cell(row, 6, in: "groups")
                    }
                    groups[try cell(row, 0, in: "groups")] = group
                }
                var backend: BackendIdentity?
                if let kind = try String.fetchOne(db, sql: "SELECT value FROM \(t.meta) WHERE key = 'backend'"),
                    let project = try String.fetchOne(db, sql: "SELECT value FROM \(t.meta) WHERE key = 'project'")
                {
                    guard let known = BackendKind(rawValue: kind) else {
                        throw StateStoreError(
                            .damaged, path: location, "its backend '\(kind)' is not one tidemark knows")
                    }
                    backend = BackendIdentity(kind: known, project: project)
                }
                var inventoryRows: [String: Int] = [:]
                if let rows = try String.fetchOne(db, sql: "SELECT value FROM \(t.meta) WHERE key = 'inventory_rows'") {
                    guard let parsed = State.inventoryRows(from: rows) else {
                        throw StateStoreError(
                            .damaged, path: location,
                            "its inventory counts ('inventory_rows' in the meta table) are not what tidemark writes")
                    }
                    inventoryRows = parsed
                }
                var versions: [String: Int] = [:]
                if try db.tableExists(t.raw("row_versions")) {
                    for row in try Row.fetchAll(db, sql: "SELECT key, serial FROM \(t.row_versions)") {
                        versions[try cell(row, 0, in: "row_versions")] = try cell(row, 1, in: "row_versions")
                    }
                }
                return State(
                    lineage: lineage, serial: serial, tokens: table, dead: TokenSet(sorted: read.dead),
                    topics: topics, groups: groups, backend: backend, versions: versions, inventoryRows: inventoryRows)
            }
        }
    }

    /// The rows of `tokens` (`statement` selects id, token, seen_at, dead and, with `devices`,
    /// device_id and left_at, ordered by id), read through SQLite's own column calls: at a million rows
    /// GRDB's generic row decoding was a third of loading state. Ids must run 0, 1, 2, …; a cell of
    /// another type than tidemark writes there is damage, as `cell` reports it.
    func readTokens(
        _ statement: Statement, count: Int, devices: Bool, reuse: StringReuse?
    ) throws -> (
        tokens: [String], seenAt: [Int64], dead: [UInt32], deviceIDs: [String], leftAt: [Int64]
    ) {
        var tokens: [String] = []
        var seenAt: [Int64] = []
        var dead: [UInt32] = []
        var deviceIDs: [String] = []
        var leftAt: [Int64] = []
        tokens.reserveCapacity(count)
        seenAt.reserveCapacity(count)
        if devices {
            deviceIDs.reserveCapacity(count)
            leftAt.reserveCapacity(count)
        }
        let handle = statement.sqliteStatement
        let names = ["id", "token", "seen_at", "dead", "device_id", "left_at"]
        func damaged(_ column: Int32) -> StateStoreError {
            StateStoreError(
                .damaged, path: location,
                "table 'tokens' has a row whose \(names[Int(column)]) is not what tidemark writes there")
        }
        func integer(_ column: Int32) throws -> Int64 {
            guard sqlite3_column_type(handle, column) == SQLITE_INTEGER else { throw damaged(column) }
            return sqlite3_column_int64(handle, column)
        }
        func text(_ column: Int32) throws -> String {
            guard sqlite3_column_type(handle, column) == SQLITE_TEXT, let bytes = sqlite3_column_text(handle, column)
            else { throw damaged(column) }
            return String(
                decoding: UnsafeBufferPointer(start: bytes, count: Int(sqlite3_column_bytes(handle, column))),
                as: UTF8.self)
        }
        while true {
            let code = sqlite3_step(handle)
            if code == SQLITE_DONE { break }
            guard code == SQLITE_ROW else {
                throw DatabaseError(
                    resultCode: ResultCode(rawValue: code),
                    message: String(cString: sqlite3_errmsg(sqlite3_db_handle(handle))))
            }
            let id = try integer(0)
            guard id == Int64(tokens.count) else {
                throw StateStoreError(.damaged, path: location, "table 'tokens': token ids are not dense at id \(id)")
            }
            let token = try text(1)
            tokens.append(reuse?.token(token, id: Int(id)) ?? token)
            seenAt.append(try integer(2))
            if try integer(3) != 0 { dead.append(UInt32(id)) }
            if devices {
                let device = try text(4)
                deviceIDs.append(reuse?.deviceID(device, ofToken: Int(id)) ?? device)
                leftAt.append(try integer(5))
            }
        }
        return (tokens, seenAt, dead, deviceIDs, leftAt)
    }

    /// A column of a row, or a `damaged` error naming the table and column when it holds something
    /// tidemark never writes there (text where a number belongs, a NULL).
    func cell<T: DatabaseValueConvertible>(_ row: Row, _ index: Int, in table: String) throws -> T {
        do {
            return try row.decode(T.self, atIndex: index)
        } catch {
            let column = index < row.columnNames.count ? Array(row.columnNames)[index] : "column \(index + 1)"
            throw StateStoreError(
                .damaged, path: location, "table '\(table)' has a row whose \(column) is not what tidemark writes there"
            )
        }
    }

    /// The serial in `meta`: a whole number, or the file is damaged.
    func storedSerial(_ db: Database, location: String) throws -> Int {
        let text = try String.fetchOne(db, sql: "SELECT value FROM \(t.meta) WHERE key = 'serial'")
        guard let text, let serial = Int(text), serial >= 0 else {
            throw StateStoreError(
                .damaged, path: location,
                "table 'meta': the serial is \(text.map { "'\($0.prefix(40))'" } ?? "missing"), not a whole number")
        }
        return serial
    }

    func decode(_ data: Data, count: Int, in table: String) throws -> TokenSet {
        guard data.count % 4 == 0 else {
            throw StateStoreError(.damaged, path: location, "table '\(table)': a membership list has a bad length")
        }
        var ids = [UInt32](repeating: 0, count: data.count / 4)
        _ = ids.withUnsafeMutableBytes { data.copyBytes(to: $0) }
        for i in ids.indices {
            ids[i] = UInt32(littleEndian: ids[i])
            if Int(ids[i]) >= count || (i > 0 && ids[i] <= ids[i - 1]) {
                throw StateStoreError(
                    .damaged, path: location, "table '\(table)': a membership list refers to an unknown token")
            }
        }
        return TokenSet(sorted: ids)
    }

    func encode(_ set: TokenSet) -> Data {
        var ids = set.ids.map { $0.littleEndian }
        return ids.withUnsafeMutableBytes { Data($0) }
    }
}
