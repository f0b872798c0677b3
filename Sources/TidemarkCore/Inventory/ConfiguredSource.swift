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

/// Devices a source leaves out: those whose `column` (a time) is older than `maxAge` seconds.
public struct ExclusionRule: Sendable, Equatable {
    /// The label (or column) holding when the device was last seen.
    public var column: String
    /// Devices last seen longer ago than this many seconds are left out.
    public var maxAge: Int64
    /// The original wording (`270d`), for messages.
    public var text: String

    /// A rule on `column` (default `last_seen`).
    public init(column: String = "last_seen", maxAge: Int64, text: String) {
        self.column = column
        self.maxAge = maxAge
        self.text = text
    }

    /// Epoch seconds from a number in seconds, milliseconds, microseconds or nanoseconds.
    static func epoch(_ number: Double) -> Int64? {
        let magnitude = abs(number)
        let seconds: Double
        switch magnitude {
        case ..<1e11: seconds = number
        case ..<1e14: seconds = number / 1e3
        case ..<1e17: seconds = number / 1e6
        case ..<1e20: seconds = number / 1e9
        default: return nil
        }
        return Int64(seconds.rounded(.down))
    }

    /// Seconds in a duration such as `270d`, `12h`, `30m`, `90s` or `2w`.
    public static func seconds(_ text: String) -> Int64? {
        let units: [(Character, Int64)] = [("s", 1), ("m", 60), ("h", 3600), ("d", 86_400), ("w", 604_800)]
        guard let last = text.last, let unit = units.first(where: { $0.0 == last }),
            let number = Int64(text.dropLast()), number > 0, number < Int64.max / unit.1
        else { return nil }
        return number * unit.1
    }

    /// What `exclude_if` makes of a device seen at `value`, at `now` (seconds since 1970).
    public enum Verdict: Sendable, Equatable {
        case keep, exclude
        /// Not a time tidemark reads.
        case unreadable
        /// A time no device was seen at (before FCM existed, or in the future): read in a unit it is not
        /// written in, or a placeholder such as 1970-01-01; the seconds it read as.
        case implausible(Int64)
    }

    /// The earliest time a device can have been seen (2008-01-01, before FCM and GCM existed).
    public static let earliest: Int64 = 1_199_145_600

    /// What the rule makes of a device last seen at `value` (a time as the source writes it), at `now`.
    public func verdict(_ value: String, now: Int64) -> Verdict {
        if value.isEmpty { return .keep }  // nothing says it is stale
        guard let seen = Self.time(value) else { return .unreadable }
        // A clock a day or two ahead of this machine's is not an error; a time years ahead is.
        guard seen >= Self.earliest, seen <= now + 2 * 86_400 else { return .implausible(seen) }
        return now - seen > maxAge ? .exclude : .keep
    }

    /// Whether a device seen at `value` is excluded at `now` (seconds since 1970); nil when `value`
    /// is not a plausible time. An empty value keeps the device (nothing says it is stale).
    public func excludes(_ value: String, now: Int64) -> Bool? {
        switch verdict(value, now: now) {
        case .keep: false
        case .exclude: true
        case .unreadable, .implausible: nil
        }
    }

    /// Seconds since 1970 in the forms databases and exports write: epoch seconds, milliseconds,
    /// microseconds or nanoseconds (told apart by magnitude: from 2001 to 5138 each unit has its own
    /// number of digits), `2026-05-01`, `2026-05-01T10:00:00Z`, `2026-05-01 10:00:00.123+00`
    /// (PostgreSQL's text form).
    public static func time(_ text: String) -> Int64? {
        if let number = Int64(text) { return epoch(Double(number)) }
        if let first = text.utf8.first, first == UInt8(ascii: "-") || (first >= 48 && first <= 57),
            let number = Double(text), number.isFinite
        {
            return epoch(number)
        }
        let bytes = Array(text.utf8)
        func number(_ range: Range<Int>) -> Int? {
            guard range.upperBound <= bytes.count else { return nil }
            var value = 0
            for b in bytes[range] {
                guard b >= 48, b <= 57 else { return nil }
                value = value * 10 + Int(b - 48)
            }
            return value
        }
        guard bytes.count >= 10, bytes[4] == UInt8(ascii: "-"), bytes[7] == UInt8(ascii: "-"),
            let year = number(0..<4), let month = number(5..<7), let day = number(8..<10), (1...12).contains(month),
            (1...31).contains(day)
        else { return nil }
        var seconds = 0
        var offset = 0
        if bytes.count > 10 {
            guard bytes[10] == UInt8(ascii: "T") || bytes[10] == UInt8(ascii: " "), let hour = number(11..<13),
                bytes.count >= 19, let minute = number(14..<16), let second = number(17..<19)
            else { return nil }
            seconds = hour * 3600 + minute * 60 + second
            var i = 19
            if i < bytes.count, bytes[i] == UInt8(ascii: ".") {
                i += 1
                while i < bytes.count, bytes[i] >= 48, bytes[i] <= 57 { i += 1 }
            }
            if i < bytes.count {
                switch bytes[i] {
                case UInt8(ascii: "Z"), UInt8(ascii: "z"): i += 1
                case UInt8(ascii: "+"), UInt8(ascii: "-"):
                    let sign = bytes[i] == UInt8(ascii: "+") ? 1 : -1
                    guard let hours = number((i + 1)..<(i + 3)) else { return nil }
                    i += 3
                    var minutes = 0
                    if i < bytes.count, bytes[i] == UInt8(ascii: ":") { i += 1 }
                    if i + 2 <= bytes.count, let m = number(i..<(i + 2)) {
                        minutes = m
                        i += 2
                    }
                    offset = sign * (hours * 3600 + minutes * 60)
                default: return nil
                }
            }
            guard i == bytes.count else { return nil }
        }
        // Days from the civil date (Howard Hinnant's algorithm).
        let y = month <= 2 ? year - 1 : year
        let era = (y >= 0 ? y : y - 399) / 400
        let yoe = y - era * 400
        let mp = (month + 9) % 12
        let doy = (153 * mp + 2) / 5 + day - 1
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy
        let days = era * 146_097 + doe - 719_468
        return Int64(days * 86_400 + seconds - offset)
    }
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
            } else if let seconds = ExclusionRule.seconds(text) {
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
