import Foundation
import Yams

/// `postgres:` in an `inventory:` item: a query on the app's own token table, its URL read from the
/// environment variable `url_env` names (never written in tidemark.yaml).
public struct PostgresSourceSettings: SourceSettings, Equatable {
    /// The key that declares the kind.
    public static let key = "postgres"
    /// The keys of its mapping.
    static let keys = ["url_env", "query", "labels"]

    /// The environment variable that holds the database URL.
    public var urlEnv: String
    /// The query; its rows are devices.
    public var query: String
    /// The columns read as labels (nil: every column but the id and the token).
    public var labels: [String]?

    /// Settings reading `query` from the database at `$urlEnv`.
    public init(urlEnv: String, query: String, labels: [String]? = nil) {
        self.urlEnv = urlEnv
        self.query = query
        self.labels = labels
    }

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
            default: labels = doc.strings(value, "'postgres.labels'")?.map(\.0)
            }
        }
        guard let urlEnv, let query else {
            if !doc.diagnostics.hasErrors {
                doc.error("'postgres' needs 'url_env' (the variable holding the URL) and 'query'.", node)
            }
            return nil
        }
        return PostgresSourceSettings(urlEnv: urlEnv, query: query, labels: labels)
    }
}
