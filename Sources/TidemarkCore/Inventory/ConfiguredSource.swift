import Foundation
import Yams

/// An inventory source declared in tidemark.yaml's `inventory:`. Sources that run SQL or a command
/// (and the `on_dead` hooks that write back) are honoured only there, never in a manifest, so a pull
/// request that edits manifests cannot make CI run a statement or a program.
public struct ConfiguredSource: Sendable, Equatable {
    /// How messages name the source (`name:`, or a default from its kind).
    public var name: String
    /// What it reads, and how: the settings its kind decoded.
    public var settings: any SourceSettings
    /// Where dead tokens are reported back to (apply only).
    public var onDead: DeadTokenHook?
    /// Devices left out by policy (`exclude_if: {last_seen_older_than: 270d}`).
    public var exclusion: ExclusionRule?
    /// Where tidemark.yaml declares it.
    public var location: SourceLocation
    /// A source that reads no device is an error (a broken query would otherwise look like every
    /// device leaving) unless `allow_empty: true`.
    public var allowEmpty = false
    /// `max_shrink`: the share of its devices this source may lose between applies (nil: the default).
    public var maxShrink: Double?

    /// A source named `name` reading with `settings`, declared at `location`.
    public init(
        name: String, settings: any SourceSettings, onDead: DeadTokenHook? = nil, exclusion: ExclusionRule? = nil,
        location: SourceLocation
    ) {
        self.name = name
        self.settings = settings
        self.onDead = onDead
        self.exclusion = exclusion
        self.location = location
    }

    /// The key that declares its kind.
    public var key: String { settings.key }

    /// Its settings as `type`, the type its kind decodes; nil for another kind.
    public func settings<Settings: SourceSettings>(as type: Settings.Type) -> Settings? {
        settings as? Settings
    }

    /// The keys of one `inventory:` item in tidemark.yaml besides the kinds' own.
    public static let keys = ["name", "on_dead", "exclude_if", "allow_empty", "max_shrink"]
    /// How a configured source names itself in messages and as the place of its devices.
    public static func display(_ name: String) -> String { "inventory source '\(name)'" }

    /// The longest a command may run (`exec.timeout`, `on_dead: {exec: …}`) when not said.
    public static let defaultTimeout = ExecSourceSettings.defaultTimeout

    /// Equal when every field is, the settings of the same kind with equal values.
    public static func == (lhs: ConfiguredSource, rhs: ConfiguredSource) -> Bool {
        lhs.name == rhs.name && lhs.settings.isSame(as: rhs.settings) && lhs.onDead == rhs.onDead
            && lhs.exclusion == rhs.exclusion && lhs.location == rhs.location && lhs.allowEmpty == rhs.allowEmpty
            && lhs.maxShrink == rhs.maxShrink
    }
}

/// How an apply tells a source which of its tokens FCM reported dead.
public enum DeadTokenHook: Sendable, Equatable {
    /// A statement run once per token with the token as `$1`, in batches of one transaction each.
    case sql(String)
    /// A program that reads NDJSON (`{"device_id", "token", "reason"}` a line) on stdin, once per batch.
    case exec([String])
}

extension ConfiguredSource {
    /// Decodes tidemark.yaml's `inventory:` list, each item's kind one of `kinds`.
    static func decodeList(_ node: Node, _ doc: inout YAMLDocument, kinds: [SourceKind]) -> [ConfiguredSource] {
        var sources: [ConfiguredSource] = []
        for item in doc.sequence(node, "'inventory' in tidemark.yaml") ?? [] {
            guard let source = decode(item, &doc, kinds: kinds) else { continue }
            if sources.contains(where: { $0.name == source.name }) {
                doc.error(
                    "two inventory sources are named '\(source.name)'; give each its own 'name:'.", item)
                continue
            }
            sources.append(source)
        }
        return sources
    }

    static func decode(_ node: Node, _ doc: inout YAMLDocument, kinds: [SourceKind]) -> ConfiguredSource? {
        guard let pairs = doc.mapping(node, "an inventory source", allowed: keys + kinds.map(\.key)) else { return nil }
        var name: String?
        var settings: (any SourceSettings)?
        var onDead: DeadTokenHook?
        var exclusion: ExclusionRule?
        var allowEmpty = false
        var maxShrink: Double?
        var failed = false
        for (key, _, value) in pairs {
            switch key {
            case "name":
                name = doc.string(value, "'name'")
            case "allow_empty":
                allowEmpty = doc.bool(value, "'allow_empty'") ?? false
            case "max_shrink":
                maxShrink = doc.share(value, "'max_shrink'", meaning: ShrinkGuard.meaning("the source"))
            case "on_dead":
                onDead = decodeHook(value, &doc)
            case "exclude_if":
                exclusion = decodeExclusion(value, &doc)
            default:
                // A kind's key (the mapping allowed no other).
                guard let kind = kinds.first(where: { $0.key == key }), let decoded = kind.decode(value, &doc) else {
                    failed = true
                    continue
                }
                settings = decoded
            }
        }
        if failed { return nil }
        guard let settings else {
            let kinds = kinds.map { "'\($0.key)'" }
            let choices =
                kinds.count > 1 ? "\(kinds.dropLast().joined(separator: ", ")) or \(kinds.last!)" : kinds.joined()
            doc.error("an inventory source in tidemark.yaml needs \(choices).", node)
            return nil
        }
        if case .sql = onDead, !settings.runsSQL {
            doc.error(
                "'on_dead' as SQL needs a 'postgres' source; an '\(settings.key)' source reports dead tokens with on_dead: {exec: [...]}.",
                node)
            return nil
        }
        var source = ConfiguredSource(
            name: name ?? settings.defaultName, settings: settings, onDead: onDead, exclusion: exclusion,
            location: doc.location(node))
        source.allowEmpty = allowEmpty
        source.maxShrink = maxShrink
        return source
    }

    /// `on_dead`: a statement using `$1`, or `{exec: [words]}`.
    private static func decodeHook(_ value: Node, _ doc: inout YAMLDocument) -> DeadTokenHook? {
        if case .mapping = value {
            var hook: DeadTokenHook?
            for (_, _, v) in doc.mapping(value, "'on_dead'", allowed: ["exec"]) ?? [] {
                guard case .sequence = v, let words = doc.strings(v, "'on_dead.exec'")?.map(\.0), !words.isEmpty
                else {
                    doc.error("'on_dead.exec' must be a list of words such as [python3, mark_dead.py].", v)
                    continue
                }
                hook = .exec(words)
            }
            return hook
        }
        guard let statement = doc.string(value, "'on_dead'") else { return nil }
        guard statement.contains("$1") else {
            doc.error(
                "'on_dead' must use $1 for the token, such as \"update fcm_tokens set active = false where token = $1\".",
                value)
            return nil
        }
        return .sql(statement)
    }

    /// `exclude_if: {last_seen_older_than: 270d, column: …}`.
    private static func decodeExclusion(_ value: Node, _ doc: inout YAMLDocument) -> ExclusionRule? {
        var exclusion: ExclusionRule?
        for (field, _, v) in doc.mapping(value, "'exclude_if'", allowed: ["last_seen_older_than", "column"]) ?? [] {
            let text = doc.string(v, "'exclude_if.\(field)'") ?? ""
            if field == "column" {
                exclusion = ExclusionRule(column: text, maxAge: exclusion?.maxAge ?? 0, text: exclusion?.text ?? "")
            } else if let seconds = Quantities.seconds(text) {
                exclusion = ExclusionRule(column: exclusion?.column ?? "last_seen", maxAge: seconds, text: text)
            } else {
                doc.error(
                    "'exclude_if.last_seen_older_than' must be a duration such as 270d or 12w, not '\(text)'.", v)
            }
        }
        if let rule = exclusion, rule.maxAge == 0 {
            doc.error("'exclude_if' needs 'last_seen_older_than', such as 270d.", value)
            return nil
        }
        return exclusion
    }
}
