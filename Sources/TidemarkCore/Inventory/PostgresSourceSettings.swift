import Foundation
import Yams

/// `postgres:` in an `inventory:` item: a query on the app's own token table, its URL read from the
/// environment variable `url_env` names (never written in tidemark.yaml).
public struct PostgresSourceSettings: SourceSettings, Equatable {
    /// The key that declares the kind.
    public static let key = "postgres"
    /// The keys of its mapping.
    static let keys = ["url_env", "query", "labels", "changes", "listen", "resync"]
    /// How often a source that follows its changes is read in full when `resync` is not said.
    public static let defaultResync: Int64 = 3600

    /// `changes: {query: …, cursor: COLUMN}`: the rows changed since a cursor value. Each row names a
    /// device (`device_id` or `id`) whose current rows are then read through the source's own query,
    /// so a row the query no longer returns (marked inactive, soft-deleted) is a device that left.
    public struct Changes: Sendable, Equatable {
        /// The query of changed rows (an inactive or soft-deleted row included), any order.
        public var query: String
        /// The column that grows with every change (an `updated_at`, a sequence).
        public var cursor: String

        /// Changes read by `query`, ordered by `cursor`.
        public init(query: String, cursor: String) {
            self.query = query
            self.cursor = cursor
        }
    }

    /// The environment variable that holds the database URL.
    public var urlEnv: String
    /// The query; its rows are devices.
    public var query: String
    /// The columns read as labels (nil: every column but the id and the token).
    public var labels: [String]?
    /// How to read the rows changed since the last read, if the source follows its changes.
    public var changes: Changes?
    /// The channel a `NOTIFY` names a changed device on (`tidemark inventory triggers` prints the
    /// triggers that send it), if the source listens.
    public var listen: String?
    /// Seconds between full reads that check what the changes built (`resync: 1h`); with `changes` or
    /// `listen` only.
    public var resync: Int64?

    /// Settings reading `query` from the database at `$urlEnv`.
    public init(urlEnv: String, query: String, labels: [String]? = nil) {
        self.urlEnv = urlEnv
        self.query = query
        self.labels = labels
    }

    /// Whether the source follows its changes (`changes`, `listen`) between full reads.
    public var followsChanges: Bool { changes != nil || listen != nil }

    /// `postgres`.
    public var key: String { Self.key }
    /// `postgres URL_ENV`.
    public var defaultName: String { "postgres \(urlEnv)" }
    /// `url_env`.
    public var environmentNames: [String] { [urlEnv] }
    /// Yes: `on_dead` may be a statement on the same database.
    public var runsSQL: Bool { true }

    static func decode(_ node: Node, _ doc: inout YAMLDocument) -> PostgresSourceSettings? {
        guard let fields = doc.mapping(node, "'postgres'", allowed: keys) else { return nil }
        var urlEnv: String?
        var query: String?
        var labels: [String]?
        var changes: Changes?
        var listen: String?
        var resync: Int64?
        var resyncNode: Node?
        for (field, _, value) in fields {
            switch field {
            case "url_env":
                urlEnv = doc.string(value, "'postgres.url_env'")
                if let env = urlEnv, env.contains("://") {
                    doc.error(
                        "'postgres.url_env' names an environment variable that holds the URL (such as APP_DATABASE_URL), not the URL itself; keep credentials out of tidemark.yaml.",
                        value)
                    urlEnv = nil
                }
            case "query": query = doc.string(value, "'postgres.query'")
            case "labels": labels = doc.strings(value, "'postgres.labels'")?.map(\.0)
            case "changes": changes = decodeChanges(value, &doc)
            case "listen":
                listen = doc.string(value, "'postgres.listen'")
                if let channel = listen, let problem = channelProblem(channel) {
                    doc.error("'postgres.listen' \(problem)", value)
                    listen = nil
                }
            default:
                let text = doc.string(value, "'postgres.resync'") ?? ""
                resyncNode = value
                if let seconds = Quantities.seconds(text) {
                    resync = seconds
                } else {
                    doc.error("'postgres.resync' must be a duration such as 1h or 30m, not '\(text)'.", value)
                }
            }
        }
        guard let urlEnv, let query else {
            if !doc.diagnostics.hasErrors {
                doc.error("'postgres' needs 'url_env' (the variable holding the URL) and 'query'.", node)
            }
            return nil
        }
        var settings = PostgresSourceSettings(urlEnv: urlEnv, query: query, labels: labels)
        settings.changes = changes
        settings.listen = listen
        if let resyncNode, resync != nil, changes == nil, listen == nil {
            doc.error(
                "'postgres.resync' is how often a source that follows its changes is read in full; add 'changes' or 'listen', or remove it (a source without them is read in full every time).",
                resyncNode)
        }
        settings.resync = resync ?? (settings.followsChanges ? defaultResync : nil)
        return settings
    }

    /// `changes: {query: …, cursor: COLUMN}`.
    private static func decodeChanges(_ node: Node, _ doc: inout YAMLDocument) -> Changes? {
        guard let fields = doc.mapping(node, "'postgres.changes'", allowed: ["query", "cursor"]) else { return nil }
        var query: String?
        var cursor: String?
        for (field, _, value) in fields {
            if field == "query" {
                query = doc.string(value, "'postgres.changes.query'")
            } else {
                cursor = doc.string(value, "'postgres.changes.cursor'")
                if let column = cursor, !isPlainName(column) {
                    doc.error(
                        "'postgres.changes.cursor' must name one column of the changes query (letters, digits and '_', such as updated_at), not '\(column)'.",
                        value)
                    cursor = nil
                }
            }
        }
        guard let query, let cursor else {
            if !doc.diagnostics.hasErrors {
                doc.error(
                    "'postgres.changes' needs 'query' (the changed rows, inactive ones included) and 'cursor' (the column that grows with every change, such as updated_at).",
                    node)
            }
            return nil
        }
        return Changes(query: query, cursor: cursor)
    }

    /// Why `channel` cannot be a `LISTEN` channel tidemark's triggers notify, or nil.
    public static func channelProblem(_ channel: String) -> String? {
        isPlainName(channel) && channel == channel.lowercased()
            ? nil
            : "must be a channel name of 1 to 63 lowercase letters, digits and '_', starting with a letter or '_', such as tidemark_devices, not '\(channel)'."
    }

    /// An unquoted SQL name: 1 to 63 ASCII letters, digits and `_`, not starting with a digit.
    public static func isPlainName(_ name: String) -> Bool {
        guard let first = name.first, !first.isNumber, name.utf8.count <= 63 else { return false }
        return name.allSatisfy { $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "_") }
    }
}
