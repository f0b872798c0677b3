import Foundation
import GRDB

/// One change the engine made, written through to its store.
public enum EngineChange: Sendable {
    case registration(String, FCMEngine.Registration)
    case clearTopics(String)
    case subscribe(String, String, Date)
    case unsubscribe(String, String)
    case group(project: String, name: String, members: [String], keys: [String])
    case deleteGroup(project: String, name: String)
}

/// Everything an engine holds, as loaded from its store.
public struct EngineSnapshot: Sendable {
    /// A device group as stored.
    public struct StoredGroup: Sendable {
        /// The project it belongs to.
        public var project: String
        /// Its `notification_key_name`.
        public var name: String
        /// Its members' tokens.
        public var members: [String]
        /// Every key that names it, the first made first.
        public var keys: [String]
    }

    /// Every app instance, by token.
    public var registrations: [String: FCMEngine.Registration] = [:]
    /// Every device group.
    public var groups: [StoredGroup] = []

    /// Nothing.
    public init() {}
}

/// Where an engine keeps its world between runs.
public protocol EngineStore: Sendable {
    func load() throws -> EngineSnapshot
    /// Writes the changes of one call atomically.
    func persist(_ changes: [EngineChange]) throws
    /// Deletes everything.
    func reset() throws
}

/// The engine's world in a SQLite file (the embedded backend's `.tidemark/embedded.db`, the emulator's `--data`).
public final class SQLiteEngineStore: EngineStore {
    private let queue: DatabaseQueue

    /// The engine's file at `path`, created with its tables when new.
    public init(path: String) throws {
        var configuration = Configuration()
        configuration.busyMode = .timeout(10)
        let created = !FileManager.default.fileExists(atPath: path)
        if created {
            FileManager.default.createFile(atPath: path, contents: nil, attributes: [.posixPermissions: 0o600])
        }
        // WAL with synchronous=NORMAL: a commit survives the process being killed (what an
        // interrupted apply needs) without an fsync per call, so the emulator keeps up with load.
        configuration.prepareDatabase { db in
            try db.execute(sql: "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL")
        }
        queue = try DatabaseQueue(path: path, configuration: configuration)
        try queue.write { db in
            try db.execute(
                sql: """
                    CREATE TABLE IF NOT EXISTS registrations (
                        token TEXT PRIMARY KEY, project TEXT NOT NULL, platform TEXT NOT NULL, app TEXT NOT NULL,
                        registered_at REAL NOT NULL, unregistered INTEGER NOT NULL DEFAULT 0);
                    CREATE TABLE IF NOT EXISTS subscriptions (
                        token TEXT NOT NULL, topic TEXT NOT NULL, created_at REAL NOT NULL,
                        PRIMARY KEY (token, topic)) WITHOUT ROWID;
                    CREATE TABLE IF NOT EXISTS groups (
                        project TEXT NOT NULL, name TEXT NOT NULL, members TEXT NOT NULL, keys TEXT NOT NULL,
                        PRIMARY KEY (project, name));
                    """)
        }
    }

    /// Everything in the file.
    public func load() throws -> EngineSnapshot {
        try queue.read { db in
            var snapshot = EngineSnapshot()
            let registrations = try Row.fetchCursor(
                db, sql: "SELECT token, project, platform, app, registered_at, unregistered FROM registrations")
            while let row = try registrations.next() {
                let token: String = row[0]
                snapshot.registrations[token] = FCMEngine.Registration(
                    project: row[1], platform: row[2], app: row[3],
                    registeredAt: Date(timeIntervalSince1970: row[4]), topics: [:], unregistered: row[5] as Bool)
            }
            let subscriptions = try Row.fetchCursor(db, sql: "SELECT token, topic, created_at FROM subscriptions")
            while let row = try subscriptions.next() {
                let token: String = row[0]
                snapshot.registrations[token]?.topics[row[1]] = Date(timeIntervalSince1970: row[2])
            }
            let groups = try Row.fetchCursor(db, sql: "SELECT project, name, members, keys FROM groups")
            while let row = try groups.next() {
                let members: String = row[2]
                let keys: String = row[3]
                snapshot.groups.append(
                    EngineSnapshot.StoredGroup(
                        project: row[0], name: row[1],
                        members: members.split(separator: "\n").map(String.init),
                        keys: keys.split(separator: "\n").map(String.init)))
            }
            return snapshot
        }
    }

    /// Deletes every registration, subscription and group.
    public func reset() throws {
        try queue.write { db in
            try db.execute(sql: "DELETE FROM subscriptions; DELETE FROM registrations; DELETE FROM groups")
        }
    }

    /// Writes one call's changes in one transaction.
    public func persist(_ changes: [EngineChange]) throws {
        guard !changes.isEmpty else { return }
        try queue.write { db in
            for change in changes {
                switch change {
                case let .registration(token, r):
                    try db.cachedStatement(
                        sql: """
                            INSERT INTO registrations (token, project, platform, app, registered_at, unregistered)
                            VALUES (?, ?, ?, ?, ?, ?)
                            ON CONFLICT(token) DO UPDATE SET project = excluded.project, platform = excluded.platform,
                                app = excluded.app, registered_at = excluded.registered_at, unregistered = excluded.unregistered
                            """
                    ).execute(arguments: [
                        token, r.project, r.platform, r.app,
                        r.registeredAt.timeIntervalSince1970, r.unregistered,
                    ])
                case let .clearTopics(token):
                    try db.cachedStatement(sql: "DELETE FROM subscriptions WHERE token = ?")
                        .execute(arguments: [token])
                case let .subscribe(token, topic, at):
                    try db.cachedStatement(
                        sql: "INSERT OR REPLACE INTO subscriptions (token, topic, created_at) VALUES (?, ?, ?)"
                    ).execute(arguments: [token, topic, at.timeIntervalSince1970])
                case let .unsubscribe(token, topic):
                    try db.cachedStatement(sql: "DELETE FROM subscriptions WHERE token = ? AND topic = ?")
                        .execute(arguments: [token, topic])
                case let .group(project, name, members, keys):
                    try db.cachedStatement(
                        sql: "INSERT OR REPLACE INTO groups (project, name, members, keys) VALUES (?, ?, ?, ?)"
                    ).execute(arguments: [project, name, members.joined(separator: "\n"), keys.joined(separator: "\n")])
                case let .deleteGroup(project, name):
                    try db.cachedStatement(sql: "DELETE FROM groups WHERE project = ? AND name = ?")
                        .execute(arguments: [project, name])
                }
            }
        }
    }
}
