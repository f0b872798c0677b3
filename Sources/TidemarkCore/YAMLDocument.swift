import Yams

/// Walks a composed YAML tree and collects diagnostics with file, line and column.
///
/// Decoding never stops at the first problem: each accessor reports what is wrong and returns
/// `nil`, so one run shows everything a user has to fix.
struct YAMLDocument {
    let file: String
    var diagnostics: [Diagnostic] = []

    init(file: String) { self.file = file }

    /// Parses `text`; a syntax error becomes a diagnostic at the parser's position.
    mutating func compose(_ text: String) -> Node? {
        do {
            return try Yams.compose(yaml: text)
        } catch let error as YamlError {
            diagnostics.append(Self.diagnostic(for: error, file: file))
            return nil
        } catch {
            diagnostics.append(.error("cannot read YAML: \(error)", at: SourceLocation(file: file, line: 1, column: 1)))
            return nil
        }
    }

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
            s.tag.description.hasSuffix(":null") || s.string.isEmpty ? "an empty value" : "'\(s.string)'"
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
    mutating func string(_ node: Node, _ what: String) -> String? {
        guard case .scalar(let scalar) = node, !scalar.tag.description.hasSuffix(":null") else {
            error("\(what) must be a string, not \(Self.kind(node)).", node)
            return nil
        }
        if scalar.string.isEmpty {
            error("\(what) must not be empty.", node)
            return nil
        }
        return scalar.string
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
