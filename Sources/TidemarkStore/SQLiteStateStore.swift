import Foundation
import GRDB
import Synchronization
import TidemarkCore

/// tidemark's state in a local SQLite file (default `.tidemark/state.db`), private to its user.
///
/// Memberships are stored per topic as sorted arrays of token ids (blobs), so a state of five
/// million memberships loads in a fraction of a second. Every write is one transaction that also
/// bumps the serial; the apply journal lives in the same file, so a batch and its journal entry
/// commit together. Nothing touches the disk until the first `load` or `save`; the file is created
/// by the first `save`.
public final class SQLiteStateStore: StateStore {
    /// 'TDMK', set as SQLite's application_id so a foreign database is recognised at once.
    static let applicationID: Int32 = 0x5444_4D4B
    /// 2: groups carry audience, exported and exported_at (a file of format 1 is brought up to 2 by
    /// its first write; a tidemark that reads only 1 refuses it rather than lose audiences).
    static let formatVersion = 2

    public let path: String
    public let location: String
    private let opened = Mutex<DatabaseQueue?>(nil)

    /// A store for the file at `path`; `location` is how messages name it (default: the path).
    public init(path: String, location: String? = nil) {
        self.path = path
        self.location = location ?? path
    }

    /// Opens the file when it exists, refusing one that is not tidemark's or is damaged; nil when it
    /// does not exist and `create` is false. A new file gets `lineage`.
    private func queue(create: Bool, lineage: String = "", now: Int64 = 0) throws -> DatabaseQueue? {
        try opened.withLock { opened -> DatabaseQueue? in
            if let opened { return opened }
            let fm = FileManager.default
            let initialize: Bool
            if fm.fileExists(atPath: path) {
                switch (try? fm.attributesOfItem(atPath: path))?[.type] as? FileAttributeType {
                case .typeRegular?: break
                case .typeDirectory?:
                    throw StateStoreError(
                        .io, path: location,
                        "it is a directory; 'state' (or --state) must name a file, such as .tidemark/state.db")
                default:
                    throw StateStoreError(
                        .io, path: location,
                        "it is not a regular file (a FIFO, socket or device); 'state' must name a file, such as .tidemark/state.db"
                    )
                }
                try checkHeader()
                initialize = false
            } else {
                guard create else { return nil }
                let directory = (path as NSString).deletingLastPathComponent
                if !directory.isEmpty {
                    try fm.createDirectory(
                        atPath: directory, withIntermediateDirectories: true,
                        attributes: [.posixPermissions: 0o700])
                }
                guard fm.createFile(atPath: path, contents: nil, attributes: [.posixPermissions: 0o600]) else {
                    throw StateStoreError(.io, path: location, "cannot create the file")
                }
                initialize = true
            }
            var configuration = Configuration()
            configuration.busyMode = .timeout(5)
            configuration.prepareDatabase { db in
                try db.execute(sql: "PRAGMA synchronous = FULL")
            }
            let queue: DatabaseQueue
            do {
                queue = try DatabaseQueue(path: path, configuration: configuration)
                if initialize {
                    try queue.writeWithoutTransaction { db in try db.execute(sql: "PRAGMA journal_mode = WAL") }
                    try queue.write { db in try Self.createSchema(db, lineage: lineage, now: now) }
                    try Self.checkpoint(queue)
                } else {
                    try queue.read { db in try self.verify(db) }
                }
            } catch let error as StateStoreError {
                throw error
            } catch let error as DatabaseError {
                throw translate(error)
            }
            _ = chmod(path, 0o600)
            opened = queue
            return queue
        }
    }

    private func checkHeader() throws {
        guard let handle = FileHandle(forReadingAtPath: path) else {
            throw StateStoreError(.io, path: location, "cannot read the file; check its permissions")
        }
        defer { try? handle.close() }
        let header = (try? handle.read(upToCount: 16)) ?? Data()
        if header.isEmpty {
            throw StateStoreError(.damaged, path: location, "the file is empty")
        }
        guard header == Data("SQLite format 3\u{0}".utf8) else { throw StateStoreError(.notSQLite, path: location, "") }
    }

    func translate(_ error: DatabaseError) -> StateStoreError {
        switch error.resultCode {
        case .SQLITE_NOTADB: StateStoreError(.notSQLite, path: location, "")
        case .SQLITE_CORRUPT: StateStoreError(.damaged, path: location, error.message ?? "corrupt")
        default: StateStoreError(.io, path: location, error.message ?? "\(error)")
        }
    }

    private static func createSchema(_ db: Database, lineage: String, now: Int64) throws {
        try db.execute(
            sql: """
                PRAGMA application_id = \(applicationID);
                CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
                CREATE TABLE tokens (id INTEGER PRIMARY KEY, token TEXT NOT NULL, seen_at INTEGER NOT NULL DEFAULT 0,
                    dead INTEGER NOT NULL DEFAULT 0, device_id TEXT NOT NULL DEFAULT '',
                    left_at INTEGER NOT NULL DEFAULT 0);
                CREATE TABLE topics (name TEXT PRIMARY KEY, mode TEXT NOT NULL, protect INTEGER NOT NULL,
                    managed BLOB NOT NULL, observed BLOB NOT NULL, opted_out BLOB NOT NULL DEFAULT x'');
                CREATE TABLE groups (name TEXT PRIMARY KEY, key TEXT, protect INTEGER NOT NULL, members BLOB NOT NULL,
                    audience INTEGER NOT NULL DEFAULT 0, exported BLOB, exported_at INTEGER NOT NULL DEFAULT 0);
                CREATE TABLE applies (id TEXT PRIMARY KEY, started_at INTEGER NOT NULL, finished_at INTEGER,
                    status TEXT NOT NULL, manifests_digest TEXT NOT NULL, operations_digest TEXT NOT NULL,
                    operation_count INTEGER NOT NULL, plan BLOB NOT NULL);
                CREATE TABLE apply_operations (apply_id TEXT NOT NULL, idx INTEGER NOT NULL, finished_at INTEGER NOT NULL,
                    ok INTEGER NOT NULL, failed INTEGER NOT NULL, PRIMARY KEY (apply_id, idx)) WITHOUT ROWID;
                """)
        for (key, value) in [
            ("format", "tidemark-state"), ("format_version", String(formatVersion)),
            ("lineage", lineage), ("serial", "0"), ("created_at", String(now)),
        ] {
            try db.execute(sql: "INSERT INTO meta (key, value) VALUES (?, ?)", arguments: [key, value])
        }
    }

    private func verify(_ db: Database) throws {
        let id = try Int32.fetchOne(db, sql: "PRAGMA application_id") ?? 0
        guard id == Self.applicationID else {
            throw StateStoreError(.foreign, path: location, "its application id is \(id), not tidemark's")
        }
        guard try db.tableExists("meta"),
            try String.fetchOne(db, sql: "SELECT value FROM meta WHERE key = 'format'") == "tidemark-state"
        else {
            throw StateStoreError(.damaged, path: location, "its 'meta' table is missing")
        }
        let version =
            Int(try String.fetchOne(db, sql: "SELECT value FROM meta WHERE key = 'format_version'") ?? "") ?? 0
        if version > Self.formatVersion {
            throw StateStoreError(
                .newerFormat, path: location, "format version \(version); this tidemark reads \(Self.formatVersion)")
        }
        for table in ["tokens", "topics", "groups", "applies", "apply_operations"] where try !db.tableExists(table) {
            throw StateStoreError(.damaged, path: location, "table '\(table)' is missing")
        }
    }

    /// device_id and left_at came together, after format 1 was first written.
    static func hasDeviceColumn(_ db: Database) throws -> Bool {
        try db.columns(in: "tokens").contains { $0.name == "device_id" }
    }

    static func hasOptOutColumn(_ db: Database) throws -> Bool {
        try db.columns(in: "topics").contains { $0.name == "opted_out" }
    }

    /// audience, exported and exported_at came together, with audiences and `groups export`.
    static func hasAudienceColumn(_ db: Database) throws -> Bool {
        try db.columns(in: "groups").contains { $0.name == "audience" }
    }

    private func run<T>(_ body: () throws -> T) throws -> T {
        do {
            return try body()
        } catch let error as DatabaseError {
            throw translate(error)
        }
    }

    // MARK: - Reading

    /// The whole state.
    public func load() async throws -> State? {
        guard let queue = try queue(create: false) else { return nil }
        return try run {
            try queue.read { db in
                let lineage = try String.fetchOne(db, sql: "SELECT value FROM meta WHERE key = 'lineage'") ?? ""
                let serial = try Self.serial(db, location: location)
                var table = TokenTable()
                let count = try Int.fetchOne(db, sql: "SELECT count(*) FROM tokens") ?? 0
                table.reserveCapacity(count)
                var seenAt: [Int64] = []
                seenAt.reserveCapacity(count)
                var dead: [UInt32] = []
                // Files written before device ids were recorded have no device_id column: none is known.
                let devices = try Self.hasDeviceColumn(db)
                var deviceIDs: [String] = []
                var leftAt: [Int64] = []
                if devices {
                    deviceIDs.reserveCapacity(count)
                    leftAt.reserveCapacity(count)
                }
                let statement = try db.makeStatement(
                    sql:
                        "SELECT id, token, seen_at, dead\(devices ? ", device_id, left_at" : "") FROM tokens ORDER BY id"
                )
                let rows = try Row.fetchCursor(statement)
                while let row = try rows.next() {
                    let id: Int64 = try cell(row, 0, in: "tokens")
                    let token: String = try cell(row, 1, in: "tokens")
                    guard Int(id) == table.count, table.intern(token) == UInt32(id) else {
                        throw StateStoreError(
                            .damaged, path: location, "table 'tokens': token ids are not dense at id \(id)")
                    }
                    seenAt.append(try cell(row, 2, in: "tokens"))
                    if try (cell(row, 3, in: "tokens") as Int64) != 0 { dead.append(UInt32(id)) }
                    if devices {
                        deviceIDs.append(try cell(row, 4, in: "tokens"))
                        leftAt.append(try cell(row, 5, in: "tokens"))
                    }
                }
                var topics: [String: TopicState] = [:]
                // Files written before opt-outs existed have no opted_out column: none is recorded.
                let optOuts = try Self.hasOptOutColumn(db)
                let columns = "name, mode, protect, managed, observed" + (optOuts ? ", opted_out" : "")
                // A cursor, not fetchAll: one topic's blobs at a time, not every topic's at once.
                let topicRows = try Row.fetchCursor(db, sql: "SELECT \(columns) FROM topics")
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
                let audiences = try Self.hasAudienceColumn(db)
                let groupColumns =
                    "name, key, protect, members" + (audiences ? ", audience, exported, exported_at" : "")
                for row in try Row.fetchAll(db, sql: "SELECT \(groupColumns) FROM groups") {
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
                var state = State(
                    lineage: lineage, serial: serial, tokens: table, seenAt: seenAt, dead: TokenSet(sorted: dead),
                    topics: topics, groups: groups)
                state.deviceIDs = deviceIDs
                state.leftAt = leftAt
                state.growToTable()
                if let kind = try String.fetchOne(db, sql: "SELECT value FROM meta WHERE key = 'backend'"),
                    let project = try String.fetchOne(db, sql: "SELECT value FROM meta WHERE key = 'project'")
                {
                    guard let backend = BackendKind(rawValue: kind) else {
                        throw StateStoreError(
                            .damaged, path: location, "its backend '\(kind)' is not one tidemark knows")
                    }
                    state.backend = BackendIdentity(kind: backend, project: project)
                }
                if try db.tableExists("row_versions") {
                    for row in try Row.fetchAll(db, sql: "SELECT key, serial FROM row_versions") {
                        state.versions[try cell(row, 0, in: "row_versions")] = try cell(row, 1, in: "row_versions")
                    }
                }
                return state
            }
        }
    }

    /// A column of a row, or a `damaged` error naming the table and column when it holds something
    /// tidemark never writes there (text where a number belongs, a NULL).
    private func cell<T: DatabaseValueConvertible>(_ row: Row, _ index: Int, in table: String) throws -> T {
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
    static func serial(_ db: Database, location: String) throws -> Int {
        let text = try String.fetchOne(db, sql: "SELECT value FROM meta WHERE key = 'serial'")
        guard let text, let serial = Int(text), serial >= 0 else {
            throw StateStoreError(
                .damaged, path: location,
                "table 'meta': the serial is \(text.map { "'\($0.prefix(40))'" } ?? "missing"), not a whole number")
        }
        return serial
    }

    private func decode(_ data: Data, count: Int, in table: String) throws -> TokenSet {
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

    private func encode(_ set: TokenSet) -> Data {
        var ids = set.ids.map { $0.littleEndian }
        return ids.withUnsafeMutableBytes { Data($0) }
    }

    // MARK: - Writing

    /// Writes the parts of `state` named by `write`, and returns the new serial (also set in `state`).
    @discardableResult
    public func save(_ state: inout State, _ write: StateWrite, at now: Int64) async throws -> Int {
        state.growToTable()
        let snapshot = state
        let queue = try queue(create: true, lineage: state.lineage, now: now)!
        let serial = try run {
            try queue.write { db -> Int in
                if try !Self.hasOptOutColumn(db) {
                    // Added after format 1 was first written; older tidemarks read the other columns as before.
                    try db.execute(sql: "ALTER TABLE topics ADD COLUMN opted_out BLOB NOT NULL DEFAULT x''")
                }
                if try !Self.hasDeviceColumn(db) {
                    try db.execute(sql: "ALTER TABLE tokens ADD COLUMN device_id TEXT NOT NULL DEFAULT ''")
                    try db.execute(sql: "ALTER TABLE tokens ADD COLUMN left_at INTEGER NOT NULL DEFAULT 0")
                }
                if try !Self.hasAudienceColumn(db) {
                    try db.execute(sql: "ALTER TABLE groups ADD COLUMN audience INTEGER NOT NULL DEFAULT 0")
                    try db.execute(sql: "ALTER TABLE groups ADD COLUMN exported BLOB")
                    try db.execute(sql: "ALTER TABLE groups ADD COLUMN exported_at INTEGER NOT NULL DEFAULT 0")
                    try db.execute(
                        sql: "UPDATE meta SET value = ? WHERE key = 'format_version'",
                        arguments: [String(Self.formatVersion)])
                }
                func device(_ id: Int) -> String { id < snapshot.deviceIDs.count ? snapshot.deviceIDs[id] : "" }
                func left(_ id: Int) -> Int64 { id < snapshot.leftAt.count ? snapshot.leftAt[id] : 0 }
                // A rebuilt token table replaces the stored one, in the same transaction as every set.
                if write.compact { try db.execute(sql: "DELETE FROM tokens") }
                let stored = try Int.fetchOne(db, sql: "SELECT count(*) FROM tokens") ?? 0
                if stored < snapshot.tokens.count {
                    let insert = try db.makeStatement(
                        sql:
                            "INSERT INTO tokens (id, token, seen_at, dead, device_id, left_at) VALUES (?, ?, ?, ?, ?, ?)"
                    )
                    for id in stored..<snapshot.tokens.count {
                        try insert.execute(arguments: [
                            id, snapshot.tokens[UInt32(id)], snapshot.seenAt[id],
                            snapshot.dead.contains(UInt32(id)) ? 1 : 0, device(id), left(id),
                        ])
                    }
                }
                let update = try db.makeStatement(
                    sql: "UPDATE tokens SET seen_at = ?, dead = ?, device_id = ?, left_at = ? WHERE id = ?")
                let touched: [UInt32] =
                    write.allTokens ? Array(0..<UInt32(min(stored, snapshot.tokens.count))) : write.tokens
                for id in touched where Int(id) < stored {
                    try update.execute(arguments: [
                        snapshot.seenAt[Int(id)], snapshot.dead.contains(id) ? 1 : 0, device(Int(id)), left(Int(id)),
                        id,
                    ])
                }
                for name in Set(write.topics) {
                    if let topic = snapshot.topics[name] {
                        try db.execute(
                            sql: """
                                INSERT OR REPLACE INTO topics (name, mode, protect, managed, observed, opted_out)
                                VALUES (?, ?, ?, ?, ?, ?)
                                """,
                            arguments: [
                                name, topic.mode.rawValue, topic.protect, encode(topic.managed), encode(topic.observed),
                                encode(topic.optedOut),
                            ])
                    } else {
                        try db.execute(sql: "DELETE FROM topics WHERE name = ?", arguments: [name])
                    }
                }
                for name in Set(write.groups) {
                    if let group = snapshot.groups[name] {
                        try db.execute(
                            sql: """
                                INSERT OR REPLACE INTO groups (name, key, protect, members, audience, exported, exported_at)
                                VALUES (?, ?, ?, ?, ?, ?, ?)
                                """,
                            arguments: [
                                name, group.key, group.protect, encode(group.members), group.audience,
                                group.exported.map(encode), group.exportedAt,
                            ])
                    } else {
                        try db.execute(sql: "DELETE FROM groups WHERE name = ?", arguments: [name])
                    }
                }
                if let (id, plan) = write.beginApply {
                    let data = try Plan.encoder(pretty: false).encode(plan)
                    try db.execute(
                        sql: """
                            INSERT INTO applies (id, started_at, status, manifests_digest, operations_digest, operation_count, plan)
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
                            INSERT OR REPLACE INTO apply_operations (apply_id, idx, finished_at, ok, failed) VALUES (?, ?, ?, ?, ?)
                            """, arguments: [entry.applyID, entry.index, now, entry.ok, entry.failed])
                    if try db.tableExists("apply_progress") {
                        try db.execute(
                            sql: "DELETE FROM apply_progress WHERE apply_id = ? AND idx = ?",
                            arguments: [entry.applyID, entry.index])
                    }
                }
                for progress in write.operationProgress {
                    // Added after format 1 was first written; older tidemarks ignore it and re-send the
                    // whole operation, as they always did.
                    try db.execute(
                        sql: """
                            CREATE TABLE IF NOT EXISTS apply_progress (apply_id TEXT NOT NULL, idx INTEGER NOT NULL,
                                tokens_done INTEGER NOT NULL, ok INTEGER NOT NULL, failed INTEGER NOT NULL,
                                PRIMARY KEY (apply_id, idx)) WITHOUT ROWID
                            """)
                    try db.execute(
                        sql: """
                            INSERT OR REPLACE INTO apply_progress (apply_id, idx, tokens_done, ok, failed) VALUES (?, ?, ?, ?, ?)
                            """,
                        arguments: [
                            progress.applyID, progress.index, progress.tokensDone, progress.ok, progress.failed,
                        ])
                }
                if let (id, status) = write.finishApply {
                    try db.execute(
                        sql: "UPDATE applies SET status = ?, finished_at = ? WHERE id = ?",
                        arguments: [status.rawValue, now, id])
                }
                if try !db.tableExists("row_versions") {
                    try db.execute(sql: "CREATE TABLE row_versions (key TEXT PRIMARY KEY, serial INTEGER NOT NULL)")
                }
                let next = write.restore ? snapshot.serial : try Self.serial(db, location: location) + 1
                let versions =
                    write.restore ? snapshot.versions : Dictionary(write.versionKeys.map { ($0, next) }) { a, _ in a }
                for (key, serial) in versions {
                    try db.execute(
                        sql: "INSERT OR REPLACE INTO row_versions (key, serial) VALUES (?, ?)",
                        arguments: [key, serial])
                }
                if let backend = snapshot.backend {
                    for (key, value) in [("backend", backend.kind.rawValue), ("project", backend.project)] {
                        try db.execute(
                            sql: "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", arguments: [key, value])
                    }
                }
                try db.execute(sql: "UPDATE meta SET value = ? WHERE key = 'serial'", arguments: [String(next)])
                return next
            }
        }
        // The commit is in the write-ahead log; copying it into the file at once keeps the file
        // self-contained between commits, so a file copied alone after a kill (as CI jobs upload it)
        // holds every committed batch. A checkpoint that cannot finish now (a reader) is done later.
        try? Self.checkpoint(queue)
        state.serial = serial
        if !write.restore { for key in write.versionKeys { state.versions[key] = serial } }
        return serial
    }

    /// Copies the write-ahead log into the database file and empties it.
    static func checkpoint(_ queue: DatabaseQueue) throws {
        try queue.writeWithoutTransaction { db in _ = try Row.fetchOne(db, sql: "PRAGMA wal_checkpoint(TRUNCATE)") }
    }

    // MARK: - Journal

    public func unfinishedApply() async throws -> UnfinishedApply? {
        guard let queue = try queue(create: false) else { return nil }
        return try run {
            try queue.read { db in
                guard
                    let row = try Row.fetchOne(
                        db,
                        sql: """
                            SELECT id, started_at, plan FROM applies WHERE status = 'running' ORDER BY started_at DESC LIMIT 1
                            """)
                else { return nil }
                let id: String = try cell(row, 0, in: "applies")
                let plan: Plan
                do {
                    plan = try Plan.decoder().decode(Plan.self, from: cell(row, 2, in: "applies") as Data)
                } catch {
                    throw StateStoreError(.damaged, path: location, "the journal's plan of apply \(id) cannot be read")
                }
                let done = try Row.fetchAll(
                    db, sql: "SELECT idx FROM apply_operations WHERE apply_id = ?", arguments: [id]
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
                if try db.tableExists("apply_progress") {
                    for row in try Row.fetchAll(
                        db, sql: "SELECT idx, tokens_done, ok, failed FROM apply_progress WHERE apply_id = ?",
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

    public func applies(limit: Int) async throws -> [ApplyRecord] {
        guard let queue = try queue(create: false) else { return [] }
        return try run {
            try queue.read { db in
                try Row.fetchAll(
                    db,
                    sql: """
                        SELECT a.id, a.status, a.started_at, a.operation_count,
                            (SELECT count(*) FROM apply_operations o WHERE o.apply_id = a.id)
                        FROM applies a ORDER BY a.started_at DESC LIMIT ?
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

    // MARK: - Lock

    public func lock(_ holder: LockHolder) async throws -> any StateLease {
        try StateLock.acquire(statePath: path, location: location, holder: holder)
    }

    public func lockHolder() async throws -> LockHolder? {
        try StateLock.holder(statePath: path, location: location)
    }
}
