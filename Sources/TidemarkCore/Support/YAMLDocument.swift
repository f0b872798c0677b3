import Yams

/// Walks a composed YAML tree and collects diagnostics with file, line and column.
///
/// Decoding never stops at the first problem: each accessor reports what is wrong and returns
/// `nil`, so one run shows everything a user has to fix.
struct YAMLDocument {
    let file: String
    var diagnostics: [Diagnostic] = [] {
        // Counted as they come (diagnostics are only appended): decoders ask after every topic, and
        // counting the whole list each time made a manifest of 100,000 bad names quadratic.
        didSet {
            if diagnostics.count < counted {
                counted = 0
                errorCount = 0
            }
            for diagnostic in diagnostics[counted...] where diagnostic.severity == .error { errorCount += 1 }
            counted = diagnostics.count
        }
    }
    /// The errors reported so far.
    private(set) var errorCount = 0
    /// How many of `diagnostics` `errorCount` has counted.
    private var counted = 0

    init(file: String) { self.file = file }

    /// The most values a document may hold once its aliases are expanded: a few bytes of anchors and
    /// aliases can stand for billions of values ("billion laughs"), and every reader walks the expansion.
    static func valueLimit(bytes: Int) -> Int { 10_000 + 10 * bytes }
    /// Nesting deeper than any manifest needs; bounded so that no reader can exhaust the stack.
    static let depthLimit = 64

    /// Parses `text`; a syntax error becomes a diagnostic at the parser's position. A document whose
    /// aliases expand past `valueLimit` values, or that nests deeper than `depthLimit`, is refused.
    mutating func compose(_ text: String) -> Node? {
        do {
            guard let root = try Yams.compose(yaml: text) else { return nil }
            if let problem = Self.sizeProblem(root, bytes: text.utf8.count) {
                diagnostics.append(.error(problem.message, at: location(problem.node)))
                return nil
            }
            reportTags(root)
            return root
        } catch let error as YamlError {
            diagnostics.append(Self.diagnostic(for: error, file: file))
            return nil
        } catch {
            diagnostics.append(.error("cannot read YAML: \(error)", at: SourceLocation(file: file, line: 1, column: 1)))
            return nil
        }
    }

    /// Walks `root` without recursion, stopping at the first value past the limits.
    static func sizeProblem(_ root: Node, bytes: Int) -> (message: String, node: Node)? {
        let limit = valueLimit(bytes: bytes)
        var count = 0
        var stack: [(node: Node, depth: Int)] = [(root, 1)]
        while let (node, depth) = stack.popLast() {
            count += 1
            if count > limit {
                return (
                    "YAML aliases expand this \(bytes)-byte file to more than \(limit) values; write the values out (tidemark manifests need no anchors or aliases).",
                    node
                )
            }
            if depth > depthLimit {
                return ("YAML nests more than \(depthLimit) levels deep here; no manifest needs this.", node)
            }
            switch node {
            case .mapping(let mapping):
                for (key, value) in mapping { stack += [(key, depth + 1), (value, depth + 1)] }
            case .sequence(let sequence):
                for item in sequence { stack.append((item, depth + 1)) }
            case .scalar, .alias:
                break
            }
        }
        return nil
    }

    /// The tags a value may carry: none, YAML's non-specific `!`, and the standard tag of its own kind
    /// (`!!str` on a scalar, `!!map`, `!!seq`), which change nothing.
    static func tagIsPlain(_ node: Node) -> Bool {
        let (tag, own): (String, Tag.Name) =
            switch node {
            case .scalar(let scalar): (scalar.tag.description, .str)
            case .mapping(let mapping): (mapping.tag.description, .map)
            case .sequence(let sequence): (sequence.tag.description, .seq)
            case .alias: ("", .str)
            }
        return tag.isEmpty || tag == "!" || tag == own.rawValue
    }

    /// Reports every value and key that carries a tag (`!custom`, `!!int`, `!!binary`, on a scalar,
    /// a mapping, a list or a key): other YAML readers would read it otherwise, and tidemark would
    /// silently ignore it. One error per tag, wherever it is; the walk visits each node once.
    mutating func reportTags(_ root: Node) {
        var stack: [Node] = [root]
        var reported = 0
        while let node = stack.popLast() {
            if !Self.tagIsPlain(node) {
                reported += 1
                if reported <= Self.repeatLimit {
                    let tag: String =
                        switch node {
                        case .scalar(let scalar): scalar.tag.description
                        case .mapping(let mapping): mapping.tag.description
                        case .sequence(let sequence): sequence.tag.description
                        case .alias: ""
                        }
                    error(
                        "\(Self.kind(node)) carries the YAML tag '\(tag.escapedOnOneLine)'; tidemark files use no tags, so write the value without it.",
                        node)
                }
            }
            switch node {
            case .mapping(let mapping):
                for (key, value) in mapping { stack += [value, key] }
            case .sequence(let sequence):
                stack += sequence.reversed()
            case .scalar, .alias:
                break
            }
        }
        if reported > Self.repeatLimit {
            diagnostics.append(
                .error(
                    "\(reported - Self.repeatLimit) more values carry YAML tags (\(reported) in all); only the first \(Self.repeatLimit) are listed.",
                    at: location(root)))
        }
    }

    /// The most diagnostics of one kind a file lists; the rest are counted in one line.
    static let repeatLimit = 20

    static func diagnostic(for error: YamlError, file: String) -> Diagnostic {
        switch error {
        case let .scanner(context, problem, mark, _), let .parser(context, problem, mark, _),
            let .composer(context, problem, mark, _):
            var message = "YAML syntax error: \(problem)"
            if let context { message += " (\(context.text) at line \(context.mark.line))" }
            return .error(
                message + "; fix the indentation or quoting there.",
                at: SourceLocation(file: file, line: mark.line, column: mark.column))
        case let .duplicatedKeysInMapping(duplicates, context):
            let keys = duplicates.map { "'\($0)'" }.joined(separator: ", ")
            return .error(
                "duplicate key \(keys) in one mapping; keep only one of them.",
                at: SourceLocation(file: file, line: context.mark.line, column: context.mark.column))
        case let .reader(problem, _, _, _):
            return .error("cannot read YAML: \(problem)", at: SourceLocation(file: file, line: 1, column: 1))
        default:
            return .error("cannot read YAML: \(error)", at: SourceLocation(file: file, line: 1, column: 1))
        }
    }

    func location(_ node: Node) -> SourceLocation {
        let mark = node.mark
        return SourceLocation(file: file, line: mark?.line ?? 1, column: mark?.column ?? 1)
    }

    mutating func error(_ message: String, _ node: Node) {
        diagnostics.append(.error(message, at: location(node)))
    }

    static func kind(_ node: Node) -> String {
        switch node {
        case .scalar(let s):
            isNull(node) || s.string.isEmpty ? "an empty value" : "'\(s.string.escapingControlCharacters)'"
        case .mapping: "a mapping"
        case .sequence: "a list"
        case .alias: "an alias"
        }
    }

    /// The pairs of a mapping whose keys are all in `allowed`; unknown keys are reported with the nearest allowed one.
    mutating func mapping(
        _ node: Node, _ what: String, allowed: [String]
    ) -> [(key: String, keyNode: Node, value: Node)]? {
        guard case .mapping(let mapping) = node else {
            error(
                "\(what) must be a mapping with keys \(allowed.joined(separator: ", ")), not \(Self.kind(node)).", node)
            return nil
        }
        var result: [(String, Node, Node)] = []
        for (keyNode, value) in mapping {
            guard case .scalar(let key) = keyNode else {
                error("keys in \(what) must be plain words.", keyNode)
                continue
            }
            if !allowed.contains(key.string) {
                var message = "unknown key '\(key.string)' in \(what)"
                if let suggestion = nearest(key.string, in: allowed) {
                    message += "; did you mean '\(suggestion)'?"
                } else {
                    message += "; allowed keys are \(allowed.joined(separator: ", "))."
                }
                error(message, keyNode)
                continue
            }
            result.append((key.string, keyNode, value))
        }
        return result
    }

    /// A non-empty scalar string.
    /// A duration such as 90d (s, m, h, d or w) in seconds, with its text; nil, with an error naming
    /// `example`, when it is not one.
    mutating func duration(_ node: Node, _ what: String, example: String) -> (seconds: Int64, text: String)? {
        let text = string(node, what) ?? ""
        guard let seconds = Quantities.seconds(text) else {
            error("\(what) must be a duration such as \(example), not '\(text)'.", node)
            return nil
        }
        return (seconds, text)
    }

    /// Whether YAML reads `node` as null (`~`, `null`, nothing at all), without changing its tag.
    static func isNull(_ node: Node) -> Bool {
        Yams.Resolver.default.resolveTag(of: node) == .null
    }

    /// A non-empty string. A value YAML reads as something else is refused: null, a value with an
    /// explicit tag (`!!int 5`, `!custom x`; manifests use none) and the special numbers `.nan` and
    /// `.inf`, which YAML does not read as text.
    mutating func string(_ node: Node, _ what: String) -> String? {
        // Resolved once: every string of every manifest comes here, and resolving runs YAML's patterns.
        let resolved = Yams.Resolver.default.resolveTag(of: node)
        guard case .scalar(let scalar) = node, resolved != .null else {
            error("\(what) must be a string, not \(Self.kind(node)).", node)
            return nil
        }
        let explicit = scalar.tag.description
        // Reported once, where the document was composed (`reportTags`).
        if !Self.tagIsPlain(node) { return nil }
        if explicit.isEmpty, resolved == .float,
            [".nan", ".inf", "+.inf", "-.inf"].contains(scalar.string.lowercased())
        {
            error(
                "\(what) is '\(scalar.string)', which YAML reads as a special number, not text; quote it if it is meant as text.",
                node)
            return nil
        }
        if scalar.string.isEmpty {
            error("\(what) must not be empty.", node)
            return nil
        }
        return scalar.string
    }

    /// A string that names something exactly as written (a device id): a plain value YAML reads as a
    /// number (`00123`, `1e3`, `123`) is refused, since other YAML readers turn it into 123 or 1000.
    mutating func identifier(_ node: Node, _ what: String) -> String? {
        guard let text = string(node, what) else { return nil }
        if case .scalar(let scalar) = node, scalar.tag.description.isEmpty,
            [Tag.Name.int, .float].contains(Yams.Resolver.default.resolveTag(of: node))
        {
            error("\(what) '\(text)' is a number to YAML; quote it (\"\(text)\") so that it is read as written.", node)
            return nil
        }
        return text
    }

    /// A share such as `25%` or `0.25` (`Quantities.share`), above zero when `aboveZero`; else an
    /// error saying that `what` must be `meaning`.
    mutating func share(_ node: Node, _ what: String, meaning: String, aboveZero: Bool = false) -> Double? {
        let text = string(node, what) ?? ""
        if let share = Quantities.share(text), !aboveZero || share > 0 { return share }
        error("\(what) must be \(meaning), not '\(text.escapedOnOneLine)'.", node)
        return nil
    }

    mutating func bool(_ node: Node, _ what: String) -> Bool? {
        if case .scalar(let scalar) = node {
            switch scalar.string {
            case "true", "True", "TRUE", "yes", "on": return true
            case "false", "False", "FALSE", "no", "off": return false
            default: break
            }
        }
        error("\(what) must be true or false, not \(Self.kind(node)).", node)
        return nil
    }

    mutating func sequence(_ node: Node, _ what: String) -> [Node]? {
        guard case .sequence(let sequence) = node else {
            error("\(what) must be a list, not \(Self.kind(node)).", node)
            return nil
        }
        return Array(sequence)
    }

    /// A scalar or a list of scalars, as strings.
    mutating func strings(_ node: Node, _ what: String) -> [(String, Node)]? {
        switch node {
        case .scalar:
            return string(node, what).map { [($0, node)] }
        case .sequence(let sequence):
            var result: [(String, Node)] = []
            for item in sequence {
                if let value = string(item, "each item of \(what)") { result.append((value, item)) }
            }
            return result
        default:
            error("\(what) must be a string or a list of strings, not \(Self.kind(node)).", node)
            return nil
        }
    }
}
