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
    // MARK: - Schema

    static let nowSQL = "(extract(epoch from clock_timestamp()) * 1000)::bigint"

    /// Creates the schema on first use and applies versioned migrations, in a transaction of its own
    /// under a transaction-scoped advisory lock (so two runners never migrate at once, and PgBouncer's
    /// transaction pooling is no obstacle); a newer database is refused.
    func ensureSchema() async throws {
        if await link.migrated { return }
        // Usually the schema is current: a plain read says so without the migration lock, which every
        // runner would otherwise queue on (and behind any one of them that stalls).
        if try await currentSchema() != Self.schemaVersion {
            try await link.transaction { c in try await self.migrate(c) }
        }
        await link.setMigrated()
    }

    /// For a read that must create nothing: false when the database has no tidemark schema at all;
    /// otherwise the schema is brought up to date (it is tidemark's) and true.
    func schemaToRead() async throws -> Bool {
        if await link.migrated { return true }
        guard try await currentSchema() != nil else { return false }
        try await ensureSchema()
        return true
    }

    /// The schema version the database is at, or nil when it has none yet (or it cannot be read that way).
    func currentSchema() async throws -> Int? {
        let version: Int32?? = try await link.transaction(readOnly: true) { c in
            guard
                try await c.first(
                    "SELECT 1 FROM pg_catalog.pg_tables WHERE tablename = 'tidemark_schema' AND schemaname = current_schema()"
                ) != nil
            else { return .none }
            guard let row = try await c.first("SELECT max(version) FROM tidemark_schema") else { return .none }
            return .some(try self.decode(row, Int32?.self, table: "tidemark_schema"))
        }
        guard let version, let version else { return nil }
        let current = Int(version)
        guard current <= Self.schemaVersion else {
            throw StateStoreError(
                .newerFormat, path: location, "schema version \(current); this tidemark writes \(Self.schemaVersion)")
        }
        return current
    }

    func migrate(_ c: PostgresLink.Connection) async throws {
        try await c.run("SELECT pg_advisory_xact_lock(\(Int64(0x7469_6465_6d61_726b)))")
        try await c.run("CREATE TABLE IF NOT EXISTS tidemark_schema (version INTEGER NOT NULL)")
        var version = 0
        if let row = try await c.first("SELECT max(version) FROM tidemark_schema") {
            version = Int(try decode(row, Int32?.self, table: "tidemark_schema") ?? 0)
        }
        guard version <= Self.schemaVersion else {
            throw StateStoreError(
                .newerFormat, path: location, "schema version \(version); this tidemark writes \(Self.schemaVersion)")
        }
        for (index, migration) in Self.migrations.enumerated() where index + 1 > version {
            for statement in migration { try await c.run(PostgresQuery(unsafeSQL: statement)) }
            try await c.run("INSERT INTO tidemark_schema (version) VALUES (\(Int32(index + 1)))")
        }
    }

    // MARK: - Quota

    /// Takes `permits` from the shared bucket `key` (one per FCM project), refilled at `rate` a second
    /// up to `capacity`, going into debt if need be; returns the seconds the caller must wait. One
    /// transaction on the server's clock, so every runner draws from the same bucket.
    func reserveQuota(key: String, permits: Double, rate: Double, capacity: Double) async throws -> Double {
        try await ensureSchema()
        return try await link.transaction { c in
            try await c.run(
                """
                INSERT INTO tidemark_quota (key, level, last_ms) VALUES (\(key), \(capacity), \(unescaped: Self.nowSQL))
                ON CONFLICT (key) DO NOTHING
                """)
            let row = try await c.first(
                """
                UPDATE tidemark_quota SET
                    level = least(\(capacity), level + greatest(0, \(unescaped: Self.nowSQL) - last_ms) * \(rate) / 1000.0)
                        - \(permits),
                    last_ms = greatest(last_ms, \(unescaped: Self.nowSQL))
                WHERE key = \(key) RETURNING level
                """)
            guard let row else { throw self.damaged("table 'tidemark_quota': the bucket row vanished") }
            let level = try self.decode(row, Double.self, table: "tidemark_quota")
            return level < 0 ? -level / rate : 0
        }
    }

    /// Migration N brings the schema from version N-1 to N. Never edit one that has shipped.
    static let migrations: [[String]] = [
        [
            """
            CREATE TABLE tidemark_workspaces (name TEXT PRIMARY KEY, lineage TEXT NOT NULL, serial BIGINT NOT NULL,
                created_at BIGINT NOT NULL, backend TEXT, project TEXT)
            """,
            """
            CREATE TABLE tidemark_tokens (workspace TEXT NOT NULL, id BIGINT NOT NULL, token TEXT NOT NULL,
                seen_at BIGINT NOT NULL DEFAULT 0, dead BOOLEAN NOT NULL DEFAULT false, PRIMARY KEY (workspace, id))
            """,
            """
            CREATE TABLE tidemark_topics (workspace TEXT NOT NULL, name TEXT NOT NULL, mode TEXT NOT NULL,
                protect BOOLEAN NOT NULL, managed BYTEA NOT NULL, observed BYTEA NOT NULL, opted_out BYTEA NOT NULL,
                PRIMARY KEY (workspace, name))
            """,
            """
            CREATE TABLE tidemark_groups (workspace TEXT NOT NULL, name TEXT NOT NULL, key TEXT, protect BOOLEAN NOT NULL,
                members BYTEA NOT NULL, PRIMARY KEY (workspace, name))
            """,
            """
            CREATE TABLE tidemark_row_versions (workspace TEXT NOT NULL, key TEXT NOT NULL, serial BIGINT NOT NULL,
                PRIMARY KEY (workspace, key))
            """,
            """
            CREATE TABLE tidemark_applies (workspace TEXT NOT NULL, id TEXT NOT NULL, started_at BIGINT NOT NULL,
                finished_at BIGINT, status TEXT NOT NULL, manifests_digest TEXT NOT NULL, operations_digest TEXT NOT NULL,
                operation_count BIGINT NOT NULL, plan BYTEA NOT NULL, PRIMARY KEY (workspace, id))
            """,
            """
            CREATE TABLE tidemark_apply_operations (workspace TEXT NOT NULL, apply_id TEXT NOT NULL, idx BIGINT NOT NULL,
                finished_at BIGINT NOT NULL, ok BIGINT NOT NULL, failed BIGINT NOT NULL,
                PRIMARY KEY (workspace, apply_id, idx))
            """,
            """
            CREATE TABLE tidemark_apply_progress (workspace TEXT NOT NULL, apply_id TEXT NOT NULL, idx BIGINT NOT NULL,
                tokens_done BIGINT NOT NULL, ok BIGINT NOT NULL, failed BIGINT NOT NULL,
                PRIMARY KEY (workspace, apply_id, idx))
            """,
            """
            CREATE TABLE tidemark_leases (workspace TEXT PRIMARY KEY, lease_id TEXT NOT NULL, holder TEXT NOT NULL,
                operation TEXT, fence BIGINT NOT NULL, started_at BIGINT NOT NULL, heartbeat_at BIGINT NOT NULL,
                expires_at BIGINT NOT NULL)
            """,
            """
            CREATE TABLE tidemark_lease_breaks (workspace TEXT NOT NULL, lease_id TEXT NOT NULL, holder TEXT NOT NULL,
                broken_by TEXT NOT NULL, reason TEXT NOT NULL, broken_at BIGINT NOT NULL)
            """,
        ],
        [
            // 2: one rate-limit bucket per FCM project, shared by every runner and workspace.
            """
            CREATE TABLE tidemark_quota (key TEXT PRIMARY KEY, level DOUBLE PRECISION NOT NULL, last_ms BIGINT NOT NULL)
            """
        ],
        [
            // 3: the inventory's device id of each token, so a rotated token is recognised.
            "ALTER TABLE tidemark_tokens ADD COLUMN device_id TEXT NOT NULL DEFAULT ''",
            "ALTER TABLE tidemark_tokens ADD COLUMN left_at BIGINT NOT NULL DEFAULT 0",
        ],
        [
            // 4: audiences (named sets with no FCM group) and what `groups export` read from FCM.
            "ALTER TABLE tidemark_groups ADD COLUMN audience BOOLEAN NOT NULL DEFAULT false",
            "ALTER TABLE tidemark_groups ADD COLUMN exported BYTEA",
            "ALTER TABLE tidemark_groups ADD COLUMN exported_at BIGINT NOT NULL DEFAULT 0",
        ],
        [
            // 5: the devices each inventory source read at the last apply (the shrink guard's baseline).
            "ALTER TABLE tidemark_workspaces ADD COLUMN inventory_rows TEXT NOT NULL DEFAULT ''"
        ],
        [
            // 6: what `tidemark serve` keeps per workspace: its owner, people's requests, its status.
            """
            CREATE TABLE tidemark_serve (workspace TEXT PRIMARY KEY, owner TEXT, owner_expires BIGINT NOT NULL DEFAULT 0,
                owner_fence BIGINT NOT NULL DEFAULT 0, suspended BOOLEAN NOT NULL DEFAULT false, suspended_by TEXT,
                reconcile_at BIGINT NOT NULL DEFAULT 0, reconcile_by TEXT, status BYTEA, status_at BIGINT NOT NULL DEFAULT 0)
            """
        ],
        [
            // 7: the replicas that run each workspace and when their presence ends, to spread workspaces.
            "ALTER TABLE tidemark_serve ADD COLUMN replicas TEXT NOT NULL DEFAULT ''"
        ],
    ]
}

/// FCM's per-project quota as one bucket in PostgreSQL, shared by every runner and workspace that
/// applies to the project (on a connection of its own, so a long state write never delays it).
public final class PostgresQuotaLedger: QuotaLedger {
    /// The bucket's key: the FCM project.
    public let key: String
    private let store: PostgresStateStore

    /// `key` names the FCM project, such as `fcm:my-project`.
    public init(url: PostgresURL, key: String) {
        self.key = key
        store = PostgresStateStore(
            url: url, workspace: "quota",
            location: "\(url.display) (its FCM quota ledger, shared by every run applying to this FCM project)")
    }

    /// Takes `permits` from the shared bucket; returns how long to wait first, in seconds.
    public func reserve(_ permits: Double, rate: Double, capacity: Double) async throws -> Double {
        try await store.reserveQuota(key: key, permits: permits, rate: rate, capacity: capacity)
    }

    /// Closes the ledger's connection.
    public func close() async { await store.close() }
}
