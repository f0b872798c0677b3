import Foundation

/// Which topics and groups a partial plan covers: `--target` / `--exclude` selectors such as
/// `topic:weather-*`, `group:user-*`, or a bare glob that matches both kinds.
public struct Targets: Sendable, Equatable {
    /// Topics or groups (audiences count as groups).
    public typealias Kind = SubjectKind

    /// One topic or group (or audience) by its exact name: what a rail holds (`HeldChange`).
    public typealias Subject = PlanSubject

    /// One `--target` or `--exclude` selector.
    public struct Selector: Sendable, Equatable, CustomStringConvertible {
        /// nil matches topics and groups alike.
        public var kind: Kind?
        /// The glob the name must match.
        public var pattern: String

        /// Parses `topic:GLOB`, `group:GLOB` or `GLOB`; globs know `*` (any run) and `?` (one character).
        public init(parsing text: String) throws(TargetError) {
            var kind: Kind?
            var pattern = Substring(text)
            if let colon = text.firstIndex(of: ":") {
                let prefix = String(text[..<colon])
                guard let parsed = Kind(rawValue: prefix) else {
                    throw TargetError(
                        "'\(text)' is not a selector: the part before ':' must be 'topic' or 'group', not '\(prefix)'.")
                }
                kind = parsed
                pattern = text[text.index(after: colon)...]
            }
            guard !pattern.isEmpty else {
                throw TargetError(
                    "'\(text)' is not a selector: give a name or glob, e.g. topic:weather-* or group:user-*.")
            }
            // A glob that no topic or group name could match is a mistake (or a forged plan), not a
            // selection: the same name rules as the manifests, plus '*' and '?'.
            if pattern.unicodeScalars.contains(where: { $0.properties.generalCategory == .control })
                || pattern.utf8.count > FCMLimits.maxTopicNameLength
            {
                throw TargetError(
                    "'\(text.count > 80 ? String(text.prefix(80)) + "…" : text)' is not a selector: \(pattern.utf8.count > FCMLimits.maxTopicNameLength ? "it is longer than any topic or group name" : "it has a control character (a newline, a tab)")."
                        .escapedOnOneLine)
            }
            if kind == .topic,
                let bad = pattern.unicodeScalars.first(where: {
                    !FCMLimits.isTopicCharacter($0) && $0 != "*" && $0 != "?"
                })
            {
                throw TargetError(
                    "'\(text.escapedOnOneLine)' is not a selector: '\(bad.escaped(asASCII: true))' cannot appear in a topic name (letters, digits and - _ . ~ %; '*' and '?' match)."
                )
            }
            self.kind = kind
            self.pattern = String(pattern)
        }

        /// Whether it selects the `kind` named `name`.
        public func matches(_ kind: Kind, _ name: String) -> Bool {
            if let own = self.kind, own != kind { return false }
            return Self.glob(Array(pattern.unicodeScalars), Array(name.unicodeScalars))
        }

        /// "topic:weather-*", as written.
        public var description: String { kind.map { "\($0.rawValue):\(pattern)" } ?? pattern }

        /// Iterative glob match with backtracking to the last `*`: linear in practice, no recursion.
        static func glob(_ pattern: [Unicode.Scalar], _ name: [Unicode.Scalar]) -> Bool {
            var p = 0
            var n = 0
            var star = -1
            var mark = 0
            while n < name.count {
                if p < pattern.count, pattern[p] == "?" || pattern[p] == name[n] {
                    p += 1
                    n += 1
                } else if p < pattern.count, pattern[p] == "*" {
                    star = p
                    mark = n
                    p += 1
                } else if star >= 0 {
                    p = star + 1
                    mark += 1
                    n = mark
                } else {
                    return false
                }
            }
            while p < pattern.count, pattern[p] == "*" { p += 1 }
            return p == pattern.count
        }
    }

    /// The `--target` selectors; empty means everything not excluded.
    public var include: [Selector]
    /// The `--exclude` selectors.
    public var exclude: [Selector]
    /// Topics and groups a rail holds (by exact name, never a glob): left out as an exclude would
    /// leave them, and shown as held rather than as a partial plan.
    public var withheld: Set<Subject> = []

    /// A selection of parsed selectors.
    public init(include: [Selector] = [], exclude: [Selector] = [], withheld: Set<Subject> = []) {
        self.include = include
        self.exclude = exclude
        self.withheld = withheld
    }

    /// Parses `--target` and `--exclude` values; throws on a selector that cannot be used.
    public init(include: [String], exclude: [String]) throws(TargetError) {
        var included: [Selector] = []
        for text in include { included.append(try Selector(parsing: text)) }
        var excluded: [Selector] = []
        for text in exclude { excluded.append(try Selector(parsing: text)) }
        self.init(include: included, exclude: excluded)
    }

    /// Every topic and group.
    public static let all = Targets()

    /// True when the plan is limited to some topics or groups by `--target` or `--exclude` (held
    /// topics aside: a plan beside them is still the whole plan of everything else).
    public var isPartial: Bool { !include.isEmpty || !exclude.isEmpty }

    /// Whether the selection covers the `kind` named `name`: some target matches (or there are none) and no exclude does.
    public func covers(_ kind: Kind, _ name: String) -> Bool {
        if !include.isEmpty, !include.contains(where: { $0.matches(kind, name) }) { return false }
        if !withheld.isEmpty, withheld.contains(Subject(kind, name)) { return false }
        return !exclude.contains { $0.matches(kind, name) }
    }

    /// The selectors that match none of `topics` and `groups`, each with the closest names: a selector
    /// that matches nothing is a typo, never a plan of nothing.
    public func unmatched(topics: some Collection<String>, groups: some Collection<String>) -> [(Selector, [String])] {
        (include + exclude).compactMap { selector in
            let hits =
                topics.contains { selector.matches(.topic, $0) } || groups.contains { selector.matches(.group, $0) }
            guard !hits else { return nil }
            var candidates: [String] = []
            if selector.kind != .group { candidates += topics.map { "topic:\($0)" } }
            if selector.kind != .topic { candidates += groups.map { "group:\($0)" } }
            let literal = selector.pattern.replacingOccurrences(of: "*", with: "").replacingOccurrences(
                of: "?", with: "")
            let ranked = candidates.sorted {
                (levenshtein(literal, String($0.split(separator: ":", maxSplits: 1)[1])), $0)
                    < (levenshtein(literal, String($1.split(separator: ":", maxSplits: 1)[1])), $1)
            }
            return (selector, Array(ranked.prefix(3)))
        }
    }

    /// Whether the selection covers topic `name`.
    public func coversTopic(_ name: String) -> Bool { covers(.topic, name) }
    /// Whether the selection covers group (or audience) `name`.
    public func coversGroup(_ name: String) -> Bool { covers(.group, name) }

    /// "only topic:weather-*, group:user-*; excluding topic:weather-test".
    public var summary: String {
        var parts: [String] = []
        if !include.isEmpty { parts.append("only " + include.map(\.description).joined(separator: ", ")) }
        if !exclude.isEmpty { parts.append("excluding " + exclude.map(\.description).joined(separator: ", ")) }
        return parts.isEmpty ? "everything" : parts.joined(separator: "; ")
    }
}
