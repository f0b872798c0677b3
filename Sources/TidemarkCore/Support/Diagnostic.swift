/// A place in a user's file: 1-based line and column.
public struct SourceLocation: Hashable, Sendable, Codable, CustomStringConvertible {
    /// The file as the user names it.
    public var file: String
    /// The line (or an inventory's row), from 1.
    public var line: Int
    /// The column, from 1; 0 for a whole row.
    public var column: Int

    /// A place in `file`.
    public init(file: String, line: Int, column: Int) {
        self.file = file
        self.line = line
        self.column = column
    }

    /// Column 0 marks a row of a source that is not a file (a query's or a command's row).
    public var description: String { column == 0 ? "\(file) row \(line)" : "\(file):\(line):\(column)" }
}

/// A problem in the user's input, reported with where it is and what to do about it.
public struct Diagnostic: Hashable, Sendable, Codable, CustomStringConvertible {
    /// How bad it is: a note, a warning, or an error that stops the command.
    public enum Severity: String, Sendable, Codable, Comparable {
        case note, warning, error

        private var rank: Int {
            switch self {
            case .note: 0
            case .warning: 1
            case .error: 2
            }
        }

        /// Notes before warnings before errors.
        public static func < (lhs: Severity, rhs: Severity) -> Bool { lhs.rank < rhs.rank }
    }

    /// How bad it is.
    public var severity: Severity
    /// What is wrong and what to do, in a sentence.
    public var message: String
    /// Where, when it is about a place in a file.
    public var location: SourceLocation?
    /// A stable name for diagnostics a script may act on, such as "deadline.device_groups".
    public var code: String? = nil
    /// The date (YYYY-MM-DD) a deadline diagnostic is about.
    public var deadline: String? = nil
    /// The one topic or group a rail's refusal is about, when it is about one (a topic's own
    /// `max_unsubscribes`, `protect`, `allow_empty`): a plan beside it can go on while it is held.
    /// Nil for a rail about the whole workspace (the global `max_unsubscribes`) and for the rest.
    public var subject: PlanSubject? = nil

    /// A diagnostic of `severity` saying `message`, at `location`.
    public init(_ severity: Severity, _ message: String, at location: SourceLocation? = nil) {
        self.severity = severity
        self.message = message
        self.location = location
    }

    /// An error: the command stops.
    public static func error(_ message: String, at location: SourceLocation? = nil) -> Diagnostic {
        Diagnostic(.error, message, at: location)
    }

    /// A warning: the command goes on.
    public static func warning(_ message: String, at location: SourceLocation? = nil) -> Diagnostic {
        Diagnostic(.warning, message, at: location)
    }

    /// The diagnostic with `code` as its stable name: `rail.max_unsubscribes`, `rail.protect` and
    /// `rail.allow_empty` mark the rails that refuse a plan, which `serve` reports as `blocked`.
    public func coded(_ code: String) -> Diagnostic {
        var coded = self
        coded.code = code
        return coded
    }

    /// The diagnostic about `kind` named `name` alone (`subject`).
    public func about(_ kind: SubjectKind, _ name: String) -> Diagnostic {
        var about = self
        about.subject = PlanSubject(kind, name)
        return about
    }

    /// `file:line:col: error: message`, the form editors and CI annotators understand.
    public var description: String {
        if let location {
            return "\(location): \(severity.rawValue): \(message)"
        }
        return "\(severity.rawValue): \(message)"
    }
}

/// Thrown when diagnostics with errors stop the work; carries all of them.
public struct DiagnosticsError: TidemarkError {
    /// `invalid_input`.
    public var reason: FailureReason { "invalid_input" }

    /// Every diagnostic, errors and the rest.
    public var diagnostics: [Diagnostic]

    /// An error carrying `diagnostics`.
    public init(_ diagnostics: [Diagnostic]) { self.diagnostics = diagnostics }

    /// The diagnostics, one per line (each once, at most 20 of a kind: `condensed`).
    public var description: String {
        diagnostics.condensed().map(\.description).joined(separator: "\n")
    }
}

/// Keys `condensed` groups diagnostics by.
enum CondensedKey {
    struct Seen: Hashable {
        var severity: Diagnostic.Severity
        var message: String
        var location: SourceLocation?
    }

    struct Kind: Hashable {
        var severity: Diagnostic.Severity
        var template: String
    }
}

extension Array where Element == Diagnostic {
    /// What a person reads: each diagnostic once (a value repeated through a YAML alias a thousand
    /// times is one problem), and at most `limit` of a kind (the same message with other quoted
    /// values), the rest counted in one line after them. Linear in the diagnostics.
    public func condensed(limit: Int = 20) -> [Diagnostic] {
        typealias Seen = CondensedKey.Seen
        typealias Kind = CondensedKey.Kind
        var seen = Set<Seen>()
        var shown: [Kind: Int] = [:]
        var firstOf: [Kind: Diagnostic] = [:]
        var order: [Kind] = []
        var out: [Diagnostic] = []
        for diagnostic in self {
            guard
                seen.insert(
                    Seen(severity: diagnostic.severity, message: diagnostic.message, location: diagnostic.location)
                ).inserted
            else { continue }
            let kind = Kind(severity: diagnostic.severity, template: Self.template(diagnostic.message))
            let count = shown[kind, default: 0] + 1
            shown[kind] = count
            if count == 1 {
                order.append(kind)
                firstOf[kind] = diagnostic
            }
            if count <= limit { out.append(diagnostic) }
        }
        for kind in order where shown[kind]! > limit {
            let more = shown[kind]! - limit
            let first = firstOf[kind]!
            let note =
                "\(more) more like '\(Self.shortened(first.message))' (\(shown[kind]!) in all); only the first \(limit) are listed."
            out.append(kind.severity == .error ? .error(note) : .warning(note))
        }
        return out
    }

    /// `message` with its quoted values left out: messages of one kind share it.
    static func template(_ message: String) -> String {
        var out = ""
        var quoted = false
        var previous: Character = " "
        for character in message {
            if character == "'" {
                // An apostrophe inside a word (don't) does not open a quote.
                if quoted || !(previous.isLetter || previous.isNumber) {
                    quoted.toggle()
                    out.append("'")
                } else if !quoted {
                    out.append(character)
                }
            } else if !quoted {
                out.append(character.isNumber ? "#" : character)
            }
            previous = character
        }
        return out
    }

    static func shortened(_ message: String) -> String {
        let line = message.escapedOnOneLine
        return line.count > 100 ? String(line.prefix(100)) + "…" : line
    }

    /// Whether any is an error.
    public var hasErrors: Bool { contains { $0.severity == .error } }
    /// How many are errors.
    public var errorCount: Int { filter { $0.severity == .error }.count }

    /// Sorted by file, line, column; diagnostics without a place go last.
    public func sortedByLocation() -> [Diagnostic] {
        enumerated().sorted { a, b in
            switch (a.element.location, b.element.location) {
            case let (l?, r?):
                if l.file != r.file { return l.file < r.file }
                if l.line != r.line { return l.line < r.line }
                if l.column != r.column { return l.column < r.column }
                return a.offset < b.offset
            case (nil, .some): return false
            case (.some, nil): return true
            case (nil, nil): return a.offset < b.offset
            }
        }.map(\.element)
    }
}

/// Edit distance, for "did you mean" suggestions.
func levenshtein(_ a: String, _ b: String) -> Int {
    let a = Array(a.unicodeScalars)
    let b = Array(b.unicodeScalars)
    if a.isEmpty { return b.count }
    if b.isEmpty { return a.count }
    var previous = Array(0...b.count)
    var current = [Int](repeating: 0, count: b.count + 1)
    for i in 1...a.count {
        current[0] = i
        for j in 1...b.count {
            let cost = a[i - 1] == b[j - 1] ? 0 : 1
            current[j] = Swift.min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost)
        }
        swap(&previous, &current)
    }
    return previous[b.count]
}

/// The candidate closest to `word`, if it is close enough to be a likely typo.
package func nearest(_ word: String, in candidates: some Sequence<String>) -> String? {
    var best: (String, Int)?
    for candidate in candidates {
        let distance = levenshtein(word.lowercased(), candidate.lowercased())
        if distance <= Swift.max(2, candidate.count / 3), distance < (best?.1 ?? Int.max) {
            best = (candidate, distance)
        }
    }
    return best?.0
}
