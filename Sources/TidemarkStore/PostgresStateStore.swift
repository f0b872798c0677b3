import Foundation
import Logging
import NIOCore
import PostgresNIO
import Synchronization
import TidemarkCore

#if canImport(Glibc)
import Glibc
#endif

/// tidemark's state in PostgreSQL, shared by every runner: one workspace per project and
/// environment, each with its own lineage, serial, journal and lease.
///
/// Normalised like the SQLite store: a row per token, a row per topic and group (memberships as
/// sorted token-id blobs), journal rows; every save is one transaction that checks the lease's
/// fencing counter, writes only what its `StateWrite` names, and bumps the serial. Nothing uses
/// session state (no advisory locks, no `SET`), so it works through PgBouncer in transaction pooling.
public final class PostgresStateStore: ServeRecordKeeping, HistoryTrimming, WorkspaceKeeping, JointSaving,
    LeaseKeeping, QuotaSharing
{
    /// The schema this tidemark writes; a database at a newer version is refused.
    public static let schemaVersion = 7

    /// The server and database.
    public let url: PostgresURL
    /// The workspace (one state per workspace in the same database).
    public let workspace: String
    /// How messages name the store: the URL without its password, and the workspace.
    public let location: String
    /// How long a lease lives without a heartbeat.
    public let leaseDuration: Duration
    let link: PostgresLink
    /// The lease's own connection: a heartbeat or a lease check never waits behind a long save.
    let leaseLink: PostgresLink
    /// The lease this store object holds, checked by every save (fencing). A process uses one store
    /// object per workspace, so the lease its lock took covers all its writes.
    let held = Mutex<(id: String, fence: Int64)?>(nil)
    /// When the work under this store's lease last moved: every committed state transaction counts.
    let activity = LeaseActivity()

    /// A store of `workspace` at `url`; nothing is opened until the first call.
    public init(
        url: PostgresURL, workspace: String = "default", leaseDuration: Duration = .seconds(60),
        location: String? = nil
    ) {
        self.url = url
        self.workspace = workspace
        self.leaseDuration = leaseDuration
        let location = location ?? "\(url.display) (workspace \(workspace))"
        self.location = location
        link = PostgresLink(url: url, location: location, committed: { [activity] in activity.progressed() })
        leaseLink = PostgresLink(url: url, location: location)
    }

    /// Closes the connection (a CLI process may simply exit).
    public func close() async {
        await link.close()
        await leaseLink.close()
    }

    /// Runs one statement outside a transaction (tests and maintenance: CREATE DATABASE cannot run in one).
    func execute(_ sql: String) async throws { try await link.execute(sql) }

    // MARK: - Reading

    /// The workspace's lineage and serial alone (one row); nil when it has no state.
    public func revision() async throws -> StateRevision? {
        try await ensureSchema()
        return try await link.transaction(readOnly: true) { c -> StateRevision? in
            guard
                let row = try await c.first(
                    "SELECT lineage, serial FROM tidemark_workspaces WHERE name = \(self.workspace)")
            else { return nil }
            let (lineage, serial) = try self.decode(row, (String, Int64).self, table: "tidemark_workspaces")
            return StateRevision(lineage: lineage, serial: Int(serial))
        }
    }

    /// The workspace's state, read in one read-only transaction; nil when it has none.
    public func load() async throws -> State? {
        try await ensureSchema()
        // In `serve`'s whole reads, the tokens the last one kept are kept again rather than made anew.
        let reuse = StringReuse.current
        return try await link.transaction(readOnly: true) { c -> State? in
            guard
                let row = try await c.first(
                    """
                    SELECT lineage, serial, backend, project, inventory_rows FROM tidemark_workspaces
                    WHERE name = \(self.workspace)
                    """)
            else { return nil }
            let (lineage, serial, kind, project, inventoryRows) = try self.decode(
                row, (String, Int64, String?, String?, String).self, table: "tidemark_workspaces")
            var tokenList: [String] = []
            var seenAt: [Int64] = []
            var dead: [UInt32] = []
            var deviceIDs: [String] = []
            var leftAt: [Int64] = []
            let tokens = try await c.query(
                "SELECT id, token, seen_at, dead, device_id, left_at FROM tidemark_tokens WHERE workspace = \(self.workspace) ORDER BY id"
            )
            for try await row in tokens {
                let (id, token, seen, isDead, device, left) = try self.decode(
                    row, (Int64, String, Int64, Bool, String, Int64).self, table: "tidemark_tokens")
                deviceIDs.append(reuse?.deviceID(device, ofToken: Int(id)) ?? device)
                leftAt.append(left)
                guard Int(id) == tokenList.count else {
                    throw self.damaged("table 'tidemark_tokens': token ids are not dense at id \(id)")
                }
                tokenList.append(reuse?.token(token, id: Int(id)) ?? token)
                seenAt.append(seen)
                if isDead { dead.append(UInt32(id)) }
            }
            if let (id, problem) = TokenRegistry.firstMalformed(tokenList) {
                throw self.damaged(
                    "table 'tidemark_tokens': id \(id) is not a registration token (\(problem)); the row was edited or damaged, so nothing is planned from it. Restore the workspace from a backup ('tidemark state push' of a good copy), or start over with 'tidemark import'"
                )
            }
            let table: TokenRegistry
            do {
                table = try TokenRegistry(tokens: tokenList, seenAt: seenAt, deviceIDs: deviceIDs, leftAt: leftAt)
            } catch let error as TokenRegistry.RepeatedToken {
                throw self.damaged(
                    "table 'tidemark_tokens': id \(error.id) holds the same token\(error.earlier.map { " as id \($0)" } ?? "")"
                )
            }
            tokenList = []
            var topics: [String: TopicState] = [:]
            for try await row in try await c.query(
                "SELECT name, mode, protect, managed, observed, opted_out FROM tidemark_topics WHERE workspace = \(self.workspace)"
            ) {
                let (name, mode, protect, managed, observed, optedOut) = try self.decode(
                    row, (String, String, Bool, ByteBuffer, ByteBuffer, ByteBuffer).self, table: "tidemark_topics")
                guard let topicMode = TopicMode(rawValue: mode) else {
                    throw self.damaged("table 'tidemark_topics': topic '\(name)' has the unknown mode '\(mode)'")
                }
                topics[name] = TopicState(
                    mode: topicMode, protect: protect,
                    managed: try self.tokenSet(managed, count: table.count, table: "tidemark_topics"),
                    observed: try self.tokenSet(observed, count: table.count, table: "tidemark_topics"),
                    optedOut: try self.tokenSet(optedOut, count: table.count, table: "tidemark_topics"))
            }
            var groups: [String: GroupState] = [:]
            for try await row in try await c.query(
                """
                SELECT name, key, protect, members, audience, exported, exported_at FROM tidemark_groups
                WHERE workspace = \(self.workspace)
                """)
            {
                let (name, key, protect, members, audience, exported, exportedAt) = try self.decode(
                    row, (String, String?, Bool, ByteBuffer, Bool, ByteBuffer?, Int64).self, table: "tidemark_groups")
                groups[name] = GroupState(
                    key: key, protect: protect,
                    members: try self.tokenSet(members, count: table.count, table: "tidemark_groups"),
                    audience: audience,
                    exported: try exported.map { try self.tokenSet($0, count: table.count, table: "tidemark_groups") },
                    exportedAt: exportedAt)
            }
            var backend: BackendIdentity?
            if let kind, let project {
                guard let known = BackendKind(rawValue: kind) else {
                    throw self.damaged("table 'tidemark_workspaces': the backend '\(kind)' is not one tidemark knows")
                }
                backend = BackendIdentity(kind: known, project: project)
            }
            guard let rows = State.inventoryRows(from: inventoryRows) else {
                throw self.damaged("table 'tidemark_workspaces': the inventory counts are not what tidemark writes")
            }
            var versions: [String: Int] = [:]
            for try await row in try await c.query(
                "SELECT key, serial FROM tidemark_row_versions WHERE workspace = \(self.workspace)")
            {
                let (key, serial) = try self.decode(row, (String, Int64).self, table: "tidemark_row_versions")
                versions[key] = Int(serial)
            }
            return State(
                lineage: lineage, serial: Int(serial), tokens: table, dead: TokenSet(sorted: dead),
                topics: topics, groups: groups, backend: backend, versions: versions, inventoryRows: rows)
        }
    }

    // MARK: - Rows

    func decode<T>(_ row: PostgresRow, _ type: T.Type, table: String) throws -> T {
        do {
            return try Self.decodeRow(row, type)
        } catch let error as StateStoreError {
            throw error
        } catch {
            throw damaged("table '\(table)' has a row tidemark did not write (\(ErrorText.describe(error)))")
        }
    }

    static func decodeRow<T>(_ row: PostgresRow, _ type: T.Type) throws -> T {
        switch type {
        case is Int64.Type: return try row.decode(Int64.self) as! T
        case is Double.Type: return try row.decode(Double.self) as! T
        case is String.Type: return try row.decode(String.self) as! T
        case is Int32?.Type: return try row.decode(Int32?.self) as! T
        case is Int32.Type: return try row.decode(Int32.self) as! T
        case is (String, String, Bool).Type: return try row.decode((String, String, Bool).self) as! T
        case is (String, Int64, String?, String?).Type:
            return try row.decode((String, Int64, String?, String?).self) as! T
        case is (String, Int64, String?, String?, String).Type:
            return try row.decode((String, Int64, String?, String?, String).self) as! T
        case is (Int64, String, Int64, Bool).Type: return try row.decode((Int64, String, Int64, Bool).self) as! T
        case is (Int64, String, Int64, Bool, String, Int64).Type:
            return try row.decode((Int64, String, Int64, Bool, String, Int64).self) as! T
        case is (String, String, Bool, ByteBuffer, ByteBuffer, ByteBuffer).Type:
            return try row.decode((String, String, Bool, ByteBuffer, ByteBuffer, ByteBuffer).self) as! T
        case is (String, String?, Bool, ByteBuffer, Bool, ByteBuffer?, Int64).Type:
            return try row.decode((String, String?, Bool, ByteBuffer, Bool, ByteBuffer?, Int64).self) as! T
        case is (String, Int64).Type: return try row.decode((String, Int64).self) as! T
        case is (Int64, String).Type: return try row.decode((Int64, String).self) as! T
        case is (String, Int64, ByteBuffer).Type: return try row.decode((String, Int64, ByteBuffer).self) as! T
        case is (Int64, Int64, Int64, Int64).Type: return try row.decode((Int64, Int64, Int64, Int64).self) as! T
        case is (String, String, Int64, Int64, Int64).Type:
            return try row.decode((String, String, Int64, Int64, Int64).self) as! T
        case is (String, String, Bool, Int64).Type: return try row.decode((String, String, Bool, Int64).self) as! T
        case is (String, Int64, Bool, String).Type: return try row.decode((String, Int64, Bool, String).self) as! T
        case is (String, String).Type: return try row.decode((String, String).self) as! T
        case is ServeRow.Type:
            return try row.decode(ServeRow.self) as! T
        case is (String, String, Int64).Type: return try row.decode((String, String, Int64).self) as! T
        default: fatalError("no row decoder for \(T.self)")
        }
    }

    func damaged(_ detail: String) -> StateStoreError { StateStoreError(.damaged, path: location, detail) }

    static func bytes(_ set: TokenSet) -> ByteBuffer {
        var buffer = ByteBuffer()
        buffer.reserveCapacity(set.count * 4)
        for id in set.ids { buffer.writeInteger(id, endianness: .little) }
        return buffer
    }

    func tokenSet(_ buffer: ByteBuffer, count: Int, table: String) throws -> TokenSet {
        guard buffer.readableBytes % 4 == 0 else {
            throw damaged("table '\(table)': a membership list has a bad length")
        }
        var buffer = buffer
        var ids: [UInt32] = []
        ids.reserveCapacity(buffer.readableBytes / 4)
        while let id = buffer.readInteger(endianness: .little, as: UInt32.self) {
            if Int(id) >= count || (ids.last.map { id <= $0 } ?? false) {
                throw damaged("table '\(table)': a membership list refers to an unknown token")
            }
            ids.append(id)
        }
        return TokenSet(sorted: ids)
    }
}
