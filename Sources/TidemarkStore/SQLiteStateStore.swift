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
public final class SQLiteStateStore: ServeRecordKeeping, HistoryTrimming, WorkspaceKeeping {
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
    let opened = Mutex<DatabaseQueue?>(nil)
    /// The file this store has open (device and inode), counted in `openFiles`.
    let openedFile = Mutex<[UInt64]?>(nil)

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
    func queue(create: Bool) throws -> DatabaseQueue? {
        if let queue = opened.withLock({ $0 }) { return queue }
        // One opening at a time in this process: a store of another workspace of the same new file
        // (`serve` opens several at start) never reads it between its creation and its application id.
        return try Self.opening.withLock { _ in try openQueue(create: create) }
    }

    static let opening = Mutex(())

    func openQueue(create: Bool) throws -> DatabaseQueue? {
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
    static let openFiles = Mutex<[[UInt64]: Int]>([:])

    /// The file's device and inode, or nil when it cannot be stat'ed.
    static func fileID(_ path: String) -> [UInt64]? {
        var info = stat()
        guard stat(path, &info) == 0 else { return nil }
        return [UInt64(info.st_dev), UInt64(info.st_ino)]
    }

    /// Reads the file's first bytes, unless another store object of this process has the file open in
    /// SQLite: closing any descriptor of a file releases every POSIX lock this process holds on it,
    /// SQLite's included, so reading the header then let a second process write beside that store
    /// and damage the file ("database disk image is malformed"; a `serve` opens one store object per
    /// workspace and per reconcile). Such a file was read when that store opened it.
    func checkHeader() throws {
        if let id = Self.fileID(path), Self.openFiles.withLock({ $0[id, default: 0] > 0 }) { return }
        try readHeader()
    }

    /// Counts the opened file as open in this process, until `deinit`.
    func registerOpen() {
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
    func closeFile() {
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

    func readHeader() throws {
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
    func createSchema(_ db: Database, lineage: String, now: Int64) throws {
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
    func createLaterTables(_ db: Database) throws {
        try db.execute(
            sql: """
                CREATE TABLE IF NOT EXISTS \(t.apply_progress) (apply_id TEXT NOT NULL, idx INTEGER NOT NULL,
                    tokens_done INTEGER NOT NULL, ok INTEGER NOT NULL, failed INTEGER NOT NULL,
                    PRIMARY KEY (apply_id, idx)) WITHOUT ROWID;
                CREATE TABLE IF NOT EXISTS \(t.row_versions) (key TEXT PRIMARY KEY, serial INTEGER NOT NULL);
                """)
    }

    /// The file is tidemark's: its application id, and a `meta` table of some workspace.
    func verify(_ db: Database) throws {
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
    func hasWorkspace(_ db: Database) throws -> Bool { try db.tableExists(t.raw("meta")) }

    /// This workspace's tables are tidemark's, at a format this tidemark reads.
    func verifyWorkspace(_ db: Database) throws {
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

    func run<T>(_ body: () throws -> T) throws -> T {
        do {
            return try body()
        } catch let error as DatabaseError {
            throw translate(error)
        }
    }

    /// `run` for GRDB's async accesses: the database work runs on GRDB's queue, not on a thread of the
    /// cooperative pool, and a cancelled task's access is interrupted (its transaction rolls back).
    func running<T>(_ body: () async throws -> T) async throws -> T {
        do {
            return try await body()
        } catch let error as DatabaseError {
            throw translate(error)
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
    func open(create: Bool) throws -> DatabaseQueue? {
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
    func adoptLegacyFile(into queue: DatabaseQueue) throws {
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
}
