import Foundation
import Yams

/// What a source kind registered from outside reads its settings with (`SourceKind.typed`): the
/// mapping under the kind's key in an `inventory:` item, each value read as the type the kind needs.
/// Every mistake becomes an error diagnostic naming tidemark.yaml, the line and column of the value
/// and the setting (`'redis.batch' must be a whole number from 1 to 1000, not 'many'`), as the
/// built-in kinds' mistakes do; a key the kind does not allow is reported with the nearest allowed
/// one before the kind's decoder runs.
public struct SourceSettingsReader {
    /// The kind's key (`redis`).
    public let kind: String
    private let node: Node
    private var fields: [String: Node] = [:]
    /// How many diagnostics the document held before these settings were read.
    private let start: Int
    fileprivate var doc: YAMLDocument

    fileprivate init?(kind: String, allowed: [String], node: Node, doc: inout YAMLDocument) {
        self.kind = kind
        self.node = node
        start = doc.diagnostics.count
        guard let pairs = doc.mapping(node, "'\(kind)'", allowed: allowed) else { return nil }
        for (key, _, value) in pairs { fields[key] = value }
        self.doc = doc
    }

    /// Whether the mapping sets `key`.
    public func has(_ key: String) -> Bool { fields[key] != nil }

    /// The keys the mapping sets, sorted.
    public var keys: [String] { fields.keys.sorted() }

    /// `'kind.key'`, as messages name a setting.
    private func name(_ key: String) -> String { "'\(kind).\(key)'" }

    /// The non-empty string at `key`; nil when it is not set (`required`: with an error) or not a string.
    public mutating func string(_ key: String, required: Bool = false) -> String? {
        guard let value = value(key, required: required) else { return nil }
        return doc.string(value, name(key))
    }

    /// The whole number at `key`, within `range`; nil when it is not set (`required`: with an error)
    /// or not such a number.
    public mutating func integer(_ key: String, in range: ClosedRange<Int>, required: Bool = false) -> Int? {
        guard let value = value(key, required: required), let text = doc.string(value, name(key)) else { return nil }
        guard let number = Int(text), range.contains(number) else {
            doc.error(
                "\(name(key)) must be a whole number from \(range.lowerBound) to \(range.upperBound), not '\(text.escapedOnOneLine)'.",
                value)
            return nil
        }
        return number
    }

    /// The duration at `key` (such as `30s`, `5m`, `12h`, `7d` or `2w`); nil when it is not set
    /// (`required`: with an error) or not a duration.
    public mutating func duration(_ key: String, required: Bool = false) -> Duration? {
        guard let value = value(key, required: required) else { return nil }
        return doc.duration(value, name(key), example: "30s or 5m").map { .seconds($0.seconds) }
    }

    /// true or false at `key`; nil when it is not set (`required`: with an error) or not a boolean.
    public mutating func bool(_ key: String, required: Bool = false) -> Bool? {
        guard let value = value(key, required: required) else { return nil }
        return doc.bool(value, name(key))
    }

    /// A string or a list of strings at `key`; nil when it is not set (`required`: with an error) or
    /// not strings.
    public mutating func strings(_ key: String, required: Bool = false) -> [String]? {
        guard let value = value(key, required: required) else { return nil }
        return doc.strings(value, name(key))?.map(\.0)
    }

    /// One of `choices` at `key`; nil when it is not set (`required`: with an error) or not one of them.
    public mutating func choice(_ key: String, of choices: [String], required: Bool = false) -> String? {
        guard let value = value(key, required: required), let text = doc.string(value, name(key)) else { return nil }
        guard choices.contains(text) else {
            doc.error(
                "\(name(key)) must be one of \(choices.joined(separator: ", ")), not '\(text.escapedOnOneLine)'.",
                value)
            return nil
        }
        return text
    }

    /// Reports `message` at the value of `key` (at the kind's key when nil or not set): a mistake only
    /// the kind can see, such as two settings that exclude each other.
    public mutating func error(_ message: String, at key: String? = nil) {
        doc.error(message, key.flatMap { fields[$0] } ?? node)
    }

    /// Whether an error was reported for this source's settings.
    public var failed: Bool { doc.diagnostics.dropFirst(start).contains { $0.severity == .error } }

    private mutating func value(_ key: String, required: Bool) -> Node? {
        if let value = fields[key] { return value }
        if required { doc.error("'\(kind)' needs \(name(key)).", node) }
        return nil
    }
}

extension SourceKind {
    /// A kind whose settings are a mapping with the keys `allowed`, decoded into the kind's own type by
    /// `decode` through a `SourceSettingsReader`: every mistake names tidemark.yaml's line, as the
    /// built-in kinds' do. The settings are nil (the source is not built) when `decode` returns nil or
    /// any error was reported.
    public static func typed(
        _ key: String, allowed: [String],
        _ decode: @escaping @Sendable (inout SourceSettingsReader) -> (any SourceSettings)?
    ) -> SourceKind {
        SourceKind(key: key) { node, doc in
            guard var reader = SourceSettingsReader(kind: key, allowed: allowed, node: node, doc: &doc) else {
                return nil
            }
            let settings = decode(&reader)
            doc = reader.doc
            return reader.failed ? nil : settings
        }
    }
}
