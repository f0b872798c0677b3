import Foundation
import GRDB
import GRDBSQLite
import Synchronization
import TidemarkCore

/// tidemark's state in a local SQLite file (default `.tidemark/state.db`), private to its user.
///
/// One file holds every workspace: `default` in the tables `meta`, `tokens`, `topics`, …, any other
/// in tables of its own named `"NAME:meta"`, `"NAME:tokens"`, …, each with its own lineage, serial
/// and journal (and its own lock file, so work on one never waits for another's lock).
///
/// Memberships are stored per topic as sorted arrays of token ids (blobs), so a state of five
/// million memberships loads in a fraction of a second. Every write is one transaction that also
/// bumps the serial; the apply journal lives in the same file, so a batch and its journal entry
/// commit together. Nothing touches the disk until the first `load` or `save`; the file is created
/// by the first `save`.
public final class SQLiteStateStore: ServeRecordKeeping {
    /// 'TDMK', set as SQLite's application_id so a foreign database is recognised at once.
    static let applicationID: Int32 = 0x5444_4D4B
    /// 2: groups carry audience, exported and exported_at (a file of format 1 is brought up to 2 by
    /// its first write; a tidemark that reads only 1 refuses it rather than lose audiences).
    package static let formatVersion = 2

    /// The database file.
    public let path: String
    /// How messages name the store.
    public let location: String
    /// The workspace this store reads and writes.
    public let workspace: String
    /// Where an older tidemark kept this workspace (a file of its own beside `path`): moved into
    /// `path` the first time the workspace is used.
    public let legacyPath: String?
    let t: Tables
    private let opened = Mutex<DatabaseQueue?>(nil)
    /// The file this store has open (device and inode), counted in `openFiles`.
    private let openedFile = Mutex<[UInt64]?>(nil)

    /// The names of one workspace's tables: `default` keeps the plain names every file had before
    /// workspaces shared it; another workspace prefixes them with its name.
    struct Tables: Sendable {
        let prefix: String

        /// SQLite's table names ignore case, workspace names do not: an upper-case letter is written as
        /// '^' and the letter in lower case ('^' is not allowed in a workspace name), so `Prod` and
        /// `prod` never share tables.
        init(workspace: String) {
            guard workspace != "default" else {
                prefix = ""
                return
            }
            prefix = workspace.map { $0.isUppercase ? "^" + $0.lowercased() : String($0) }.joined() + ":"
        }

        /// The table's name, as `sqlite_master` and PRAGMAs know it.
        func raw(_ base: String) -> String { prefix + base }
        /// The table's name for SQL text (quoted when prefixed; workspace names have no quotes).
        func quoted(_ base: String) -> String { prefix.isEmpty ? base : "\"\(prefix)\(base)\"" }

        var meta: String { quoted("meta") }
        var tokens: String { quoted("tokens") }
        var topics: String { quoted("topics") }
        var groups: String { quoted("groups") }
        var applies: String { quoted("applies") }
        var apply_operations: String { quoted("apply_operations") }
        var apply_progress: String { quoted("apply_progress") }
        var row_versions: String { quoted("row_versions") }
    }

    /// A store for `workspace` in the file at `path`; `location` is how messages name it (default: the
    /// path, with the workspace when it is not `default`).
    public init(path: String, location: String? = nil, workspace: String = "default", legacyPath: String? = nil) {
        self.path = path
        self.workspace = workspace
        self.location = location ?? (workspace == "default" ? path : "\(path) (workspace \(workspace))")
        self.legacyPath = legacyPath
        t = Tables(workspace: workspace)
    }

    /// Opens the file when it exists, refusing one that is not tidemark's or is damaged; nil when it
    /// does not exist and `create` is false. A new file has no workspace yet: a save makes its tables.
    private func queue(create: Bool) throws -> DatabaseQueue? {
        if let queue = opened.withLock({ $0 }) { return queue }
        // One opening at a time in this process: a store of another workspace of the same new file
        // (`serve` opens several at start) never reads it between its creation and its application id.
        return try Self.opening.withLock { _ in try openQueue(create: create) }
    }

    private static let opening = Mutex(())

    private func openQueue(create: Bool) throws -> DatabaseQueue? {
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
            // Workspaces share the file: another's write transaction (short, but a large first save
            // takes seconds) is waited for.
            configuration.busyMode = .timeout(60)
            configuration.prepareDatabase { db in
                try db.execute(sql: "PRAGMA synchronous = FULL")
            }
            let queue: DatabaseQueue
            do {
                queue = try DatabaseQueue(path: path, configuration: configuration)
                if initialize {
                    // A workspace's tables are made by its first save.
                    try queue.writeWithoutTransaction { db in
                        try db.execute(sql: "PRAGMA journal_mode = WAL")
                        try db.execute(sql: "PRAGMA application_id = \(Self.applicationID)")
                    }
                    try queue.writeWithoutTransaction { db in try Self.checkpoint(db) }
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
            registerOpen()
            return queue
        }
    }

    /// The files (device and inode) that store objects of this process have open in SQLite now, with
    /// how many have.
    private static let openFiles = Mutex<[[UInt64]: Int]>([:])

    /// The file's device and inode, or nil when it cannot be stat'ed.
    private static func fileID(_ path: String) -> [UInt64]? {
        var info = stat()
        guard stat(path, &info) == 0 else { return nil }
        return [UInt64(info.st_dev), UInt64(info.st_ino)]
    }

    /// Reads the file's first bytes, unless another store object of this process has the file open in
    /// SQLite: closing any descriptor of a file releases every POSIX lock this process holds on it,
    /// SQLite's included, so reading the header then let a second process write beside that store
    /// and damage the file ("database disk image is malformed"; a `serve` opens one store object per
    /// workspace and per reconcile). Such a file was read when that store opened it.
    private func checkHeader() throws {
        if let id = Self.fileID(path), Self.openFiles.withLock({ $0[id, default: 0] > 0 }) { return }
        try readHeader()
    }

    /// Counts the opened file as open in this process, until `deinit`.
    private func registerOpen() {
        guard let id = Self.fileID(path) else { return }
        Self.openFiles.withLock { $0[id, default: 0] += 1 }
        openedFile.withLock { $0 = id }
    }

    /// Closes the file (SQLite's connection); the next load or save opens it again.
    public func close() async {
        Self.opening.withLock { _ in closeFile() }
    }

    deinit { closeFile() }

    /// Closes the connection, then stops counting the file as open: its locks are no longer held when
    /// it stops counting.
    private func closeFile() {
        try? opened.withLock { queue in
            defer { queue = nil }
            return queue
        }?.close()
        guard
            let id = openedFile.withLock({ file in
                defer { file = nil }
                return file
            })
        else { return }
        Self.openFiles.withLock { files in
            files[id, default: 1] -= 1
            if files[id] == 0 { files[id] = nil }
        }
    }

    private func readHeader() throws {
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

    /// This workspace's tables, in the open transaction.
    private func createSchema(_ db: Database, lineage: String, now: Int64) throws {
        try db.execute(
            sql: """
                CREATE TABLE \(t.meta) (key TEXT PRIMARY KEY, value TEXT NOT NULL);
                CREATE TABLE \(t.tokens) (id INTEGER PRIMARY KEY, token TEXT NOT NULL, seen_at INTEGER NOT NULL DEFAULT 0,
                    dead INTEGER NOT NULL DEFAULT 0, device_id TEXT NOT NULL DEFAULT '',
                    left_at INTEGER NOT NULL DEFAULT 0);
                CREATE TABLE \(t.topics) (name TEXT PRIMARY KEY, mode TEXT NOT NULL, protect INTEGER NOT NULL,
                    managed BLOB NOT NULL, observed BLOB NOT NULL, opted_out BLOB NOT NULL DEFAULT x'');
                CREATE TABLE \(t.groups) (name TEXT PRIMARY KEY, key TEXT, protect INTEGER NOT NULL, members BLOB NOT NULL,
                    audience INTEGER NOT NULL DEFAULT 0, exported BLOB, exported_at INTEGER NOT NULL DEFAULT 0);
                CREATE TABLE \(t.applies) (id TEXT PRIMARY KEY, started_at INTEGER NOT NULL, finished_at INTEGER,
                    status TEXT NOT NULL, manifests_digest TEXT NOT NULL, operations_digest TEXT NOT NULL,
                    operation_count INTEGER NOT NULL, plan BLOB NOT NULL);
                CREATE TABLE \(t.apply_operations) (apply_id TEXT NOT NULL, idx INTEGER NOT NULL, finished_at INTEGER NOT NULL,
                    ok INTEGER NOT NULL, failed INTEGER NOT NULL, PRIMARY KEY (apply_id, idx)) WITHOUT ROWID;
                """)
        for (key, value) in [
            ("format", "tidemark-state"), ("format_version", String(Self.formatVersion)),
            ("lineage", lineage), ("serial", "0"), ("created_at", String(now)),
        ] {
            try db.execute(sql: "INSERT INTO \(t.meta) (key, value) VALUES (?, ?)", arguments: [key, value])
        }
    }

    /// Tables added after format 1 was first written (a file without them is read as having no
    /// progress within operations and no row versions): every write makes them when missing.
    private func createLaterTables(_ db: Database) throws {
        try db.execute(
            sql: """
                CREATE TABLE IF NOT EXISTS \(t.apply_progress) (apply_id TEXT NOT NULL, idx INTEGER NOT NULL,
                    tokens_done INTEGER NOT NULL, ok INTEGER NOT NULL, failed INTEGER NOT NULL,
                    PRIMARY KEY (apply_id, idx)) WITHOUT ROWID;
                CREATE TABLE IF NOT EXISTS \(t.row_versions) (key TEXT PRIMARY KEY, serial INTEGER NOT NULL);
                """)
    }

    /// The file is tidemark's: its application id, and a `meta` table of some workspace.
    private func verify(_ db: Database) throws {
        let id = try Int32.fetchOne(db, sql: "PRAGMA application_id") ?? 0
        guard id == Self.applicationID else {
            throw StateStoreError(.foreign, path: location, "its application id is \(id), not tidemark's")
        }
        let metas = try String.fetchAll(
            db, sql: "SELECT name FROM sqlite_master WHERE type = 'table' AND (name = 'meta' OR name LIKE '%:meta')")
        // A file with no table at all was created by a first save that never committed: empty.
        // `tidemark_serve` (serve's records) may come before any state.
        let tables =
            try Int.fetchOne(
                db, sql: "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name != 'tidemark_serve'") ?? 0
        guard !metas.isEmpty || tables == 0 else {
            throw StateStoreError(.damaged, path: location, "its 'meta' table is missing")
        }
        if try hasWorkspace(db) { try verifyWorkspace(db) }
    }

    /// Whether this workspace has tables in the file.
    private func hasWorkspace(_ db: Database) throws -> Bool { try db.tableExists(t.raw("meta")) }

    /// This workspace's tables are tidemark's, at a format this tidemark reads.
    private func verifyWorkspace(_ db: Database) throws {
        guard try String.fetchOne(db, sql: "SELECT value FROM \(t.meta) WHERE key = 'format'") == "tidemark-state"
        else {
            throw StateStoreError(.damaged, path: location, "its 'meta' table is missing")
        }
        let version =
            Int(try String.fetchOne(db, sql: "SELECT value FROM \(t.meta) WHERE key = 'format_version'") ?? "") ?? 0
        if version > Self.formatVersion {
            throw StateStoreError(
                .newerFormat, path: location, "format version \(version); this tidemark reads \(Self.formatVersion)")
        }
        for table in ["tokens", "topics", "groups", "applies", "apply_operations"]
        where try !db.tableExists(t.raw(table)) {
            throw StateStoreError(.damaged, path: location, "table '\(table)' is missing")
        }
    }

    /// device_id and left_at came together, after format 1 was first written.
    func hasDeviceColumn(_ db: Database) throws -> Bool {
        try db.columns(in: t.raw("tokens")).contains { $0.name == "device_id" }
    }

    func hasOptOutColumn(_ db: Database) throws -> Bool {
        try db.columns(in: t.raw("topics")).contains { $0.name == "opted_out" }
    }

    /// audience, exported and exported_at came together, with audiences and `groups export`.
    func hasAudienceColumn(_ db: Database) throws -> Bool {
        try db.columns(in: t.raw("groups")).contains { $0.name == "audience" }
    }

    private func run<T>(_ body: () throws -> T) throws -> T {
        do {
            return try body()
        } catch let error as DatabaseError {
            throw translate(error)
        }
    }

    /// `run` for GRDB's async accesses: the database work runs on GRDB's queue, not on a thread of the
    /// cooperative pool, and a cancelled task's access is interrupted (its transaction rolls back).
    private func running<T>(_ body: () async throws -> T) async throws -> T {
        do {
            return try await body()
        } catch let error as DatabaseError {
            throw translate(error)
        }
    }

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
    private func readTokens(
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
    func storedSerial(_ db: Database, location: String) throws -> Int {
        let text = try String.fetchOne(db, sql: "SELECT value FROM \(t.meta) WHERE key = 'serial'")
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

    // MARK: - Journal

    /// The tokens of `ids` (sorted) in the token table: looked up one by one, or read in one pass
    /// when they are many.
    private func tokens(_ db: Database, _ ids: [UInt32]) throws -> [UInt32: String] {
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

    // MARK: - Lock

    /// Each workspace has its own lock file (`state.db.lock`, `state.db.prod.lock`): no global lock.
    var lockBase: String { workspace == "default" ? path : path + "." + workspace }

    /// Takes the workspace's lock file (`flock`); it ends with the process.
    public func lock(_ holder: LockHolder) async throws -> any StateLease {
        try StateLock.acquire(statePath: lockBase, location: location, holder: holder)
    }

    /// Who holds the lock, as its lock file says, while a process holds it.
    public func lockHolder() async throws -> LockHolder? {
        try StateLock.holder(statePath: lockBase, location: location)
    }

    // MARK: - A workspace an older tidemark kept in a file of its own

    /// The open file, after moving in this workspace's own file from an older tidemark, if any.
    private func open(create: Bool) throws -> DatabaseQueue? {
        let pending = legacyPath.map { FileManager.default.fileExists(atPath: $0) } ?? false
        guard let queue = try queue(create: create || pending) else { return nil }
        if pending { try adoptLegacyFile(into: queue) }
        return queue
    }

    /// Every table of one workspace (and of an older file of one workspace), in the order they are copied.
    static let tableNames = [
        "meta", "tokens", "topics", "groups", "applies", "apply_operations", "apply_progress", "row_versions",
    ]

    /// Copies the older file's state and journal into this workspace's tables in one transaction
    /// (unless the workspace has tables already), then renames the older file `….moved`, so that
    /// it is read once. The older file is checked as any state file is (tidemark's, not newer).
    private func adoptLegacyFile(into queue: DatabaseQueue) throws {
        guard let legacyPath else { return }
        let legacy = SQLiteStateStore(path: legacyPath, location: legacyPath)
        if let old = try legacy.queue(create: false) {
            let hasState = try legacy.run { try old.read { db in try legacy.hasWorkspace(db) } }
            try old.close()
            guard hasState else { return }
        }
        try run {
            try queue.writeWithoutTransaction { db in
                try db.execute(sql: "ATTACH DATABASE ? AS legacy", arguments: [legacyPath])
                defer { try? db.execute(sql: "DETACH DATABASE legacy") }
                try db.inTransaction {
                    // Another run moved it in first.
                    guard try !hasWorkspace(db) else { return .commit }
                    try createSchema(db, lineage: "", now: 0)
                    try createLaterTables(db)
                    try db.execute(sql: "DELETE FROM \(t.meta)")
                    for base in Self.tableNames {
                        let old = try String.fetchAll(
                            db, sql: "SELECT name FROM pragma_table_info(?, 'legacy')", arguments: [base])
                        guard !old.isEmpty else { continue }
                        let ours = Set(try db.columns(in: t.raw(base)).map(\.name))
                        let columns = old.filter { ours.contains($0) }.map { "\"\($0)\"" }.joined(separator: ", ")
                        try db.execute(
                            sql: "INSERT INTO \(t.quoted(base)) (\(columns)) SELECT \(columns) FROM legacy.\"\(base)\"")
                    }
                    // Every column is there now, whatever format the older file had.
                    try db.execute(
                        sql: "UPDATE \(t.meta) SET value = ? WHERE key = 'format_version'",
                        arguments: [String(Self.formatVersion)])
                    return .commit
                }
            }
        }
        _ = try? queue.writeWithoutTransaction { db in try Self.checkpoint(db) }
        let fm = FileManager.default
        for suffix in ["", "-wal", "-shm"] where fm.fileExists(atPath: legacyPath + suffix) {
            try? fm.removeItem(atPath: legacyPath + ".moved" + suffix)
            try? fm.moveItem(atPath: legacyPath + suffix, toPath: legacyPath + ".moved" + suffix)
        }
    }

    // MARK: - serve's records

    /// One table for every workspace of the file, made by the first record written.
    private static let serveTable = """
        CREATE TABLE IF NOT EXISTS tidemark_serve (workspace TEXT PRIMARY KEY, owner TEXT,
            owner_expires INTEGER NOT NULL DEFAULT 0, owner_fence INTEGER NOT NULL DEFAULT 0,
            suspended INTEGER NOT NULL DEFAULT 0, suspended_by TEXT, reconcile_at INTEGER NOT NULL DEFAULT 0,
            reconcile_by TEXT, status BLOB, status_at INTEGER NOT NULL DEFAULT 0, replicas TEXT NOT NULL DEFAULT '')
        """

    /// Makes the table, or adds what a file written by an older tidemark lacks (the replicas' presences).
    private static func makeServeTable(_ db: Database) throws {
        try db.execute(sql: serveTable)
        if try !db.columns(in: "tidemark_serve").contains(where: { $0.name == "replicas" }) {
            try db.execute(sql: "ALTER TABLE tidemark_serve ADD COLUMN replicas TEXT NOT NULL DEFAULT ''")
        }
    }

    private static func serveRecord(_ row: Row) -> ServeRecord {
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

    private func readServeRecords(_ sql: String, _ arguments: StatementArguments = []) async throws -> [ServeRecord] {
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
