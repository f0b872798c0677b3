import TidemarkCore
import TidemarkStore

/// What `tidemark version` prints: the release, what it was built from, and the formats of state and
/// saved plans this tidemark reads and writes.
public struct VersionReport: Sendable, Encodable {
    /// One file or database format.
    public struct Format: Sendable, Encodable {
        /// `sqlite_state`, `postgres_schema`, `saved_plan`, `sealed_plan`.
        public var name: String
        /// The oldest version it reads (older PostgreSQL schemas and SQLite files are brought up to
        /// date by the first write).
        public var readsFrom: Int
        /// The version it writes; it refuses anything newer.
        public var writes: Int
    }

    /// The release, such as 0.1.0.
    public var version: String
    /// The git commit built ("-dirty" when the checkout had changes), or "unknown".
    public var commit: String
    /// The day it was built (UTC), YYYY-MM-DD.
    public var built: String
    /// The Swift version that built it.
    public var swift: String
    /// The formats it reads and writes.
    public var formats: [Format]

    /// The report of this tidemark, with what the build recorded.
    public init(commit: String, built: String, swift: String) {
        version = Runtime.version
        self.commit = commit
        self.built = built
        self.swift = swift
        formats = [
            Format(name: "sqlite_state", readsFrom: 1, writes: SQLiteStateStore.formatVersion),
            Format(name: "postgres_schema", readsFrom: 1, writes: PostgresStateStore.schemaVersion),
            Format(name: "saved_plan", readsFrom: 1, writes: Plan.currentFormatVersion),
            Format(name: "sealed_plan", readsFrom: 1, writes: SealedPlan.formatVersion),
        ]
    }

    /// "0.1.0 (commit 42e9528c433a, built 2026-11-26, Swift 6.3)": one line, the version first.
    public var line: String {
        let shown =
            commit == "unknown" ? commit : String(commit.prefix(12)) + (commit.hasSuffix("-dirty") ? "-dirty" : "")
        return "\(version) (commit \(shown), built \(built), Swift \(swift))"
    }

    /// The whole report for people, a line each.
    public var text: String {
        let described: [String: String] = [
            "sqlite_state": "SQLite state file",
            "postgres_schema": "PostgreSQL state schema",
            "saved_plan": "saved plan (plan --out)",
            "sealed_plan": "sealed plan (TIDEMARK_PLAN_KEY)",
        ]
        var lines = [
            "tidemark \(version)", "commit:  \(commit)", "built:   \(built)", "swift:   \(swift)",
            "formats (reads from version, writes version):",
        ]
        for format in formats {
            let what = described[format.name] ?? format.name
            let reads =
                format.readsFrom == format.writes ? "\(format.writes)" : "\(format.readsFrom)–\(format.writes)"
            lines.append("  \(what): reads \(reads), writes \(format.writes)")
        }
        return lines.joined(separator: "\n") + "\n"
    }
}
