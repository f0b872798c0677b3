import Foundation
import Yams

/// The settings under one kind's key in an `inventory:` item of tidemark.yaml (`postgres:`, `exec:`,
/// or a kind a front end registers), as that kind decoded them. The registry entry that builds a
/// source of the kind reads them back with `ConfiguredSource.settings(as:)`.
public protocol SourceSettings: Sendable {
    /// The key that declares the kind in tidemark.yaml (`postgres`).
    var key: String { get }
    /// What messages call a source of this kind that has no `name:` (`postgres APP_DATABASE_URL`).
    var defaultName: String { get }
    /// The environment variables the source reads its connection from: what `tidemark init --ci`
    /// passes from CI secrets.
    var environmentNames: [String] { get }
    /// Whether `on_dead` may be an SQL statement, run on the source's own database.
    var runsSQL: Bool { get }
    /// Whether `other` holds the same settings (the same kind with equal values).
    func isSame(as other: any SourceSettings) -> Bool
}

extension SourceSettings {
    /// The kind's key.
    public var defaultName: String { key }
    /// None.
    public var environmentNames: [String] { [] }
    /// No: only a database source runs SQL.
    public var runsSQL: Bool { false }
}

extension SourceSettings where Self: Equatable {
    /// Equal when `other` is of this type with equal values.
    public func isSame(as other: any SourceSettings) -> Bool { (other as? Self) == self }
}

/// One kind of inventory source that tidemark.yaml may declare: the key that declares it and how the
/// settings under that key are decoded. A registry entry pairs it with what builds the source.
public struct SourceKind: Sendable {
    /// The key that declares the kind in an `inventory:` item.
    public let key: String
    /// Decodes the value under the key, reporting what is wrong into the document; nil on an error.
    let decode: @Sendable (Node, inout YAMLDocument) -> (any SourceSettings)?

    init(key: String, decode: @escaping @Sendable (Node, inout YAMLDocument) -> (any SourceSettings)?) {
        self.key = key
        self.decode = decode
    }

    /// A kind whose settings are a mapping of strings (`lines: {devices: "…"}`), decoded as
    /// `StringSourceSettings`: what a front end registers without writing a decoder.
    public static func strings(_ key: String) -> SourceKind {
        SourceKind(key: key) { node, doc in
            guard case .mapping(let mapping) = node else {
                doc.error("'\(key)' must be a mapping of settings, not \(YAMLDocument.kind(node)).", node)
                return nil
            }
            var values: [String: String] = [:]
            var failed = false
            for (keyNode, field) in mapping {
                guard case .scalar(let word) = keyNode, let text = doc.string(field, "'\(key).\(word.string)'")
                else {
                    failed = true
                    continue
                }
                values[word.string] = text
            }
            return failed ? nil : StringSourceSettings(key: key, values: values)
        }
    }

    /// A query on the app's PostgreSQL (`postgres:`).
    public static let postgres = SourceKind(key: PostgresSourceSettings.key) { node, doc in
        PostgresSourceSettings.decode(node, &doc)
    }
    /// A program's output (`exec:`).
    public static let exec = SourceKind(key: ExecSourceSettings.key) { node, doc in
        ExecSourceSettings.decode(node, &doc)
    }
    /// The kinds tidemark builds itself.
    public static let builtIn = [postgres, exec]
}

/// The settings of a kind registered with `SourceKind.strings`: its key and a string for each setting.
public struct StringSourceSettings: SourceSettings, Equatable {
    /// The key that declares the kind.
    public var key: String
    /// Each setting under the key, as written.
    public var values: [String: String]

    /// Settings of kind `key`.
    public init(key: String, values: [String: String]) {
        self.key = key
        self.values = values
    }
}
