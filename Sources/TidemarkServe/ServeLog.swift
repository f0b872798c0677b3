import Foundation

/// Where `serve`'s parts write their log lines, each at its level: what goes well is `info`, what a
/// person may have to look at (a retry, a lost connection, a rail's refusal, a claim not renewed) is
/// a `warning`, and what failed (a reconcile, a webhook given up, settings that do not load) an
/// `error`. `Serve` writes them through its `Logger`, in text or JSON, with the level as such.
public struct ServeLog: Sendable {
    /// How bad a line is.
    public enum Level: String, Sendable, Equatable {
        /// Things going as they should.
        case info
        /// Something a person may have to look at; serve goes on.
        case warning
        /// Something failed.
        case error
    }

    /// Writes one line at its level.
    public let write: @Sendable (Level, String) -> Void

    /// A log that writes each line through `write`.
    public init(write: @escaping @Sendable (Level, String) -> Void) { self.write = write }

    /// A log that hands each line to `lines`, whatever its level (for tests that read the lines).
    public init(lines: @escaping @Sendable (String) -> Void) { write = { _, line in lines(line) } }

    /// A log that writes nothing.
    public static let none = ServeLog(write: { _, _ in })

    /// Writes `line` at `info`.
    public func callAsFunction(_ line: String) { write(.info, line) }

    /// Writes `line` at `level`.
    public func callAsFunction(_ level: Level, _ line: String) { write(level, line) }

    /// Writes `line` as a warning.
    public func warning(_ line: String) { write(.warning, line) }

    /// Writes `line` as an error.
    public func error(_ line: String) { write(.error, line) }
}
