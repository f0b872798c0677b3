import Foundation
import Logging

/// `serve --log-format json`: one JSON object per line on stderr, for log collectors (Loki, Cloud
/// Logging, Elasticsearch).
///
/// Each line holds `time` (ISO 8601, UTC, milliseconds), `level`, `logger`, `message`, the logger's
/// metadata, and the `key=value` words that begin the message (`workspace`, `result`, `reason`,
/// `seconds`, `next_in`, `target`, `event`…) as fields of their own, so a collector filters on them
/// without parsing the text. Lines carry what the text lines carry: no token, key or password.
public struct JSONLogHandler: LogHandler {
    /// The logger's name.
    public let label: String
    /// The lowest level written (default info).
    public var logLevel: Logger.Level = .info
    /// Fields every line of this logger carries.
    public var metadata: Logger.Metadata = [:]
    private let write: @Sendable (String) -> Void

    /// A handler named `label` writing each line with `write` (default: stderr).
    public init(label: String, write: @escaping @Sendable (String) -> Void = JSONLogHandler.standardError) {
        self.label = label
        self.write = write
    }

    /// Writes one line to stderr in one call, so lines of concurrent tasks never interleave.
    public static let standardError: @Sendable (String) -> Void = { line in
        let data = Array((line + "\n").utf8)
        data.withUnsafeBytes { bytes in _ = Foundation.write(2, bytes.baseAddress, bytes.count) }
    }

    /// One field every line carries.
    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    /// Writes one event as one JSON line.
    public func log(event: LogEvent) {
        write(
            Self.line(
                level: event.level, label: label, message: "\(event.message)",
                metadata: metadata.merging(event.metadata ?? [:]) { $1 }))
    }

    /// The JSON line of one event.
    static func line(
        level: Logger.Level, label: String, message: String, metadata: Logger.Metadata, at date: Date = Date()
    )
        -> String
    {
        var fields: [String: String] = [:]
        for (key, value) in metadata { fields[key] = "\(value)" }
        for (key, value) in Self.fields(of: message) where fields[key] == nil { fields[key] = value }
        fields["time"] = Self.format(date)
        fields["level"] = level.rawValue
        fields["logger"] = label
        fields["message"] = message
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return (try? encoder.encode(fields)).map { String(decoding: $0, as: UTF8.self) } ?? #"{"message":"?"}"#
    }

    /// The `key=value` words of `message` before its first `: ` (the summary that follows is prose).
    static func fields(of message: String) -> [(String, String)] {
        let head = message.range(of: ": ").map { message[..<$0.lowerBound] } ?? Substring(message)
        return head.split(separator: " ").compactMap { word in
            guard let equals = word.firstIndex(of: "="), equals != word.startIndex else { return nil }
            let key = word[..<equals]
            guard key.allSatisfy({ $0 == "_" || ($0.isASCII && $0.isLowercase) }) else { return nil }
            return (String(key), String(word[word.index(after: equals)...]))
        }
    }

    private static func format(_ date: Date) -> String {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        return formatter.string(from: date)
    }
}
