import Foundation
import TidemarkCore

/// How `serve` follows a PostgreSQL source's changes (`changes: {query, cursor}`, `listen:`): the
/// feed the `postgres` registry entry offers.
public struct PostgresChangeFeed: ChangeFeed {
    /// The source's name in tidemark.yaml.
    public let source: String
    private let settings: PostgresSourceSettings
    private let url: String?
    /// The source as configured (its labels and exclusions): what a batch reads its devices with.
    private let configured: PostgresInventorySource

    /// The feed of `configured` (named `source`) with `settings`, its database at `url`; nil when the
    /// settings follow no changes.
    public init?(source: String, settings: PostgresSourceSettings, url: String?, configured: PostgresInventorySource) {
        guard settings.followsChanges else { return nil }
        self.source = source
        self.settings = settings
        self.url = url
        self.configured = configured
    }

    /// The source as the changes and the notifications are read: its URL and query.
    private var bare: PostgresInventorySource {
        PostgresInventorySource(name: source, url: url, urlEnv: settings.urlEnv, query: settings.query)
    }

    /// `resync`, or an hour.
    public var resync: Duration { .seconds(settings.resync ?? PostgresSourceSettings.defaultResync) }
    /// `'postgres.changes' and` the URL's variable.
    public var settingsHint: String { "'postgres.changes' and \(settings.urlEnv)" }
    /// The name, the settings and the URL.
    public var identity: String { "postgres \(source)\n\(settings)\n\(url ?? "")" }
    /// `changes.cursor`, quoted.
    public var cursorName: String? { settings.changes.map { "'\($0.cursor)'" } }
    /// `LISTEN` and the channel.
    public var listenName: String? { settings.listen.map { "LISTEN '\($0)'" } }

    /// A reader that keeps one connection: a poll is one query.
    public func cursor() -> (any ChangeCursor)? {
        settings.changes.map { PostgresChangeCursor(reader: PostgresChangeReader(bare), changes: $0) }
    }

    /// `LISTEN` on the channel, on a connection of its own.
    public func listen(
        connected: @escaping @Sendable () -> Void, each: @escaping @Sendable (String) -> Bool
    ) async throws {
        guard let channel = settings.listen else { return }
        try await bare.listen(on: channel) { notifications in
            connected()
            for try await notification in notifications {
                if !each(notification.payload) { return }
            }
        }
    }

    /// The devices through the source's own query, as a whole read sees them.
    public func readDevices(_ ids: [String], into builder: inout InventoryBuilder) async throws {
        _ = try await configured.load(devices: ids, into: &builder)
    }
}

/// The rows past a PostgreSQL source's cursor, read on one kept connection.
struct PostgresChangeCursor: ChangeCursor {
    let reader: PostgresChangeReader
    let changes: PostgresSourceSettings.Changes

    func current() async throws -> String? { try await reader.currentCursor(changes) }

    func changed(after cursor: String?, limit: Int) async throws -> (ids: [String], cursor: String?) {
        try await reader.changedDevices(changes, after: cursor, limit: limit)
    }

    func wentBack(from cursor: String) async throws -> Bool {
        try await reader.cursorWentBack(changes, from: cursor)
    }

    func close() async { await reader.close() }
}
