import Foundation
import Yams

/// `tidemark fmt`: rewrites a manifest in canonical form so pull-request diffs stay minimal.
///
/// Keys come in a fixed order (topics: name, description, mode, protect, allow_empty, members;
/// labels and selectors alphabetically), lists of tokens, device ids and selector values are
/// sorted, indentation is two spaces. Comments, blank lines between entries, scalar quoting and
/// short flow collections (`[a, b]`, `{team: x}`) are kept. The result is checked to mean the same
/// as the input before it is returned.
public struct ManifestFormatter: Sendable {
    /// Flow collections longer than this are written in block style.
    public var lineWidth: Int

    /// A formatter that folds flow collections longer than `lineWidth`.
    public init(lineWidth: Int = 120) { self.lineWidth = lineWidth }

    /// What `fmt` made of one file.
    public enum Outcome: Sendable {
        case formatted(String)
        case failed([Diagnostic])
    }

    /// `text` with each CRLF made LF.
    static func lf(_ text: String) -> String {
        let bytes = Array(text.utf8)
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count)
        for (i, byte) in bytes.enumerated() where !(byte == 0x0D && i + 1 < bytes.count && bytes[i + 1] == 0x0A) {
            out.append(byte)
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// The file formatted. Line endings come out as LF: a file saved with CRLF (Windows editors) is
    /// rewritten with LF, as git stores text.
    public func format(_ text: String, file: String) -> Outcome {
        let text = text.utf8.contains(0x0D) ? Self.lf(text) : text
        var doc = YAMLDocument(file: file)
        let composed = doc.compose(text)
        if !doc.diagnostics.isEmpty { return .failed(doc.diagnostics) }
        var emitter = Emitter(source: text, lineWidth: lineWidth)
        guard let root = composed else { return .formatted(emitter.finishComments()) }  // comments only
        if case .scalar(let s) = root, s.string.isEmpty {
            return .formatted(emitter.finishComments())
        }
        if let (message, node) = Self.notAManifest(root, .root) {
            return .failed([
                .error(
                    "\(message); this is not a tidemark manifest as tidemark fmt knows them, so it was left as it is.",
                    at: doc.location(node))
            ])
        }
        emitter.emitDocument(root)
        let output = emitter.finishComments()
        // Safety: the output must mean exactly what the input meant, in canonical order.
        guard let reparsed = try? Yams.compose(yaml: output),
            Canonical(root, context: .root) == Canonical(reparsed, context: .root)
        else {
            return .failed([
                .error(
                    "tidemark fmt could not rewrite this file without changing its meaning; it was left as it is. Please report it.",
                    at: SourceLocation(file: file, line: 1, column: 1))
            ])
        }
        return .formatted(output)
    }

    /// The first key the manifest schema does not have, or a root that is not a mapping: fmt rewrites
    /// only what it knows to be a manifest.
    static func notAManifest(_ node: Node, _ context: Context) -> (String, Node)? {
        let section: ManifestSchema.Node? =
            switch context {
            case .root: .root
            case .inventory: .inventory
            case .inventoryFile: .inventoryFile
            case .device: .device
            case .topic: .topic
            case .group: .group
            case .audience: .audience
            case .member: .member
            case .removed: .removed
            default: nil
            }
        switch node {
        case .mapping(let mapping):
            guard let section else { return nil }
            let allowed = ManifestSchema.keys(section)
            for (key, value) in mapping {
                guard let name = key.string, allowed.contains(name) else {
                    return ("unknown key '\(key.string ?? YAMLDocument.kind(key))'", key)
                }
                if let problem = notAManifest(value, context.child(key: name)) { return problem }
            }
            return nil
        case .sequence(let sequence) where section != nil && context != .root:
            for item in sequence {
                if let problem = notAManifest(item, context) { return problem }
            }
            return nil
        default:
            return context == .root
                ? ("the file is \(YAMLDocument.kind(node)), not a mapping of topics, groups and inventory", node) : nil
        }
    }

    /// Where a node sits in the manifest schema, which decides key order and list sorting.
    enum Context: Equatable {
        case root, inventory, inventoryFile, device, labels, topic, group, audience, member, removed, selector,
            sortedList, plain

        func child(key: String) -> Context {
            switch (self, key) {
            case (.root, "inventory"): .inventory
            case (.root, "topics"): .topic  // the items of the list
            case (.root, "groups"): .group
            case (.root, "audiences"): .audience
            case (.root, "removed"): .removed
            case (.inventory, "files"): .inventoryFile
            case (.inventory, "devices"): .device
            case (.device, "labels"): .labels
            case (.topic, "members"), (.group, "members"), (.audience, "members"): .member
            case (.member, "selector"): .selector
            case (.member, "tokens"), (.member, "devices"), (.member, "token"), (.member, "device"): .sortedList
            case (.selector, _), (.sortedList, _): .sortedList
            default: .plain
            }
        }

        /// The canonical position of `key`; unknown keys keep their order after the known ones.
        func rank(_ key: String) -> Int? {
            let order: [String]
            switch self {
            case .root: order = ManifestSchema.keys(.root)
            case .inventory: order = ManifestSchema.keys(.inventory)
            case .inventoryFile: order = ManifestSchema.keys(.inventoryFile)
            case .device: order = ManifestSchema.keys(.device)
            case .topic: order = ManifestSchema.keys(.topic)
            case .group: order = ManifestSchema.keys(.group)
            case .audience: order = ManifestSchema.keys(.audience)
            case .member: order = ManifestSchema.keys(.member)
            case .removed: order = ManifestSchema.keys(.removed)
            case .labels, .selector, .sortedList: return nil  // alphabetical
            case .plain: return 0
            }
            return order.firstIndex(of: key) ?? order.count
        }

        var sortsKeysAlphabetically: Bool { self == .labels || self == .selector || self == .sortedList }
    }

    static func orderedPairs(_ mapping: Node.Mapping, _ context: Context) -> [(Node, Node)] {
        let pairs = Array(mapping)
        let indexed = pairs.enumerated().map { (offset: $0.offset, key: $0.element.key.string ?? "", pair: $0.element) }
        let sorted = indexed.sorted { a, b in
            if context.sortsKeysAlphabetically { return a.key == b.key ? a.offset < b.offset : a.key < b.key }
            let ra = context.rank(a.key) ?? 0
            let rb = context.rank(b.key) ?? 0
            return ra == rb ? a.offset < b.offset : ra < rb
        }
        return sorted.map { ($0.pair.key, $0.pair.value) }
    }

    /// Items of a list, sorted by value when the list holds only scalars and its place asks for it.
    static func orderedItems(_ sequence: Node.Sequence, _ context: Context) -> [Node] {
        let items = Array(sequence)
        guard context == .sortedList, items.allSatisfy({ $0.scalar != nil }) else { return items }
        return items.enumerated().sorted { a, b in
            let x = a.element.scalar!.string
            let y = b.element.scalar!.string
            return x == y ? a.offset < b.offset : x < y
        }.map(\.element)
    }

    /// A node's meaning in canonical order, ignoring styles and positions.
    indirect enum Canonical: Equatable {
        case scalar(String, String)
        case list([Canonical])
        case map([String], [Canonical])

        init(_ node: Node, context: Context) {
            switch node {
            case .scalar(let s):
                self = .scalar(s.string, s.tag.description)
            case .sequence(let seq):
                self = .list(ManifestFormatter.orderedItems(seq, context).map { Canonical($0, context: context) })
            case .mapping(let map):
                let pairs = ManifestFormatter.orderedPairs(map, context)
                self = .map(
                    pairs.map { $0.0.string ?? "" },
                    pairs.map { Canonical($0.1, context: context.child(key: $0.0.string ?? "")) })
            case .alias:
                self = .scalar("*alias", "")
            }
        }
    }
}

/// Writes nodes as YAML lines, carrying the source's comments and blank lines along.
private struct Emitter {
    let lines: [Substring]
    let lineWidth: Int
    var out: [String] = []
    /// Full-line comments by the source line of the node they precede.
    var commentsBefore: [Int: [(line: Int, text: String)]] = [:]
    /// Comments after the last node.
    var trailingComments: [(line: Int, text: String)] = []
    /// Whether the document opened with an explicit `---`.
    var documentStart = false
    /// End-of-line comments by source line.
    var endOfLine: [Int: String] = [:]
    /// Source lines whose preceding comments and blank line were written.
    var ledIn = Set<Int>()

    init(source: String, lineWidth: Int) {
        self.lineWidth = lineWidth
        lines = source.split(separator: "\n", omittingEmptySubsequences: false)
        var nodeLines: [Int] = []
        if let root = try? Yams.compose(yaml: source) { Self.collectLines(root, into: &nodeLines) }
        let starts = Set(nodeLines).sorted()
        for (index, raw) in lines.enumerated() {
            let number = index + 1
            let trimmed = raw.drop { $0 == " " || $0 == "\t" }
            if trimmed.hasPrefix("#") {
                let text = String(trimmed).trimmingTrailingSpaces()
                if let anchor = starts.first(where: { $0 > number }) {
                    commentsBefore[anchor, default: []].append((number, text))
                } else {
                    trailingComments.append((number, text))
                }
            } else if trimmed.hasPrefix("---"), starts.first.map({ number < $0 }) ?? true {
                documentStart = true
            } else if let comment = Self.endOfLineComment(raw) {
                endOfLine[number] = comment
            }
        }
    }

    static func collectLines(_ node: Node, into lines: inout [Int]) {
        if let mark = node.mark { lines.append(mark.line) }
        switch node {
        case .mapping(let map):
            for (key, value) in map {
                collectLines(key, into: &lines)
                collectLines(value, into: &lines)
            }
        case .sequence(let seq):
            for item in seq { collectLines(item, into: &lines) }
        default: break
        }
    }

    /// The `# …` at the end of a line with content, outside quotes.
    static func endOfLineComment(_ line: Substring) -> String? {
        var single = false
        var double = false
        var previous: Character = " "
        var index = line.startIndex
        while index < line.endIndex {
            let c = line[index]
            if c == "'", !double { single.toggle() }
            if c == "\"", !single, previous != "\\" { double.toggle() }
            if c == "#", !single, !double, previous == " " || previous == "\t" {
                let before = line[..<index].trimmingCharacters(in: .whitespaces)
                return before.isEmpty ? nil : String(line[index...]).trimmingTrailingSpaces()
            }
            previous = c
            index = line.index(after: index)
        }
        return nil
    }

    /// Adds one output line that starts at source line `source` (when known), with the comments and
    /// blank line that preceded it there.
    mutating func line(_ text: String, indent: Int, source: Int?) {
        leadIn(source, indent: indent)
        var text = String(repeating: " ", count: indent) + text
        if let source, let trailing = endOfLine.removeValue(forKey: source) { text += " " + trailing }
        out.append(text)
    }

    /// Writes, once per source line, the blank line and comments that preceded a node starting at
    /// `source`: before its first output line, or earlier when the node is written later than its
    /// first line (a reordered list item, the document's header comments).
    mutating func leadIn(_ source: Int?, indent: Int) {
        guard let source, !ledIn.contains(source) else { return }
        ledIn.insert(source)
        let comments = commentsBefore.removeValue(forKey: source) ?? []
        let first = comments.first?.line ?? source
        if !out.isEmpty, first >= 2, lines[first - 2].allSatisfy({ $0 == " " || $0 == "\t" }), out.last != "" {
            out.append("")
        }
        let pad = String(repeating: " ", count: indent)
        for (index, comment) in comments.enumerated() {
            out.append(pad + comment.text)
            // Keep a blank line that separated comment paragraphs.
            if index + 1 < comments.count, comments[index + 1].line > comment.line + 1, out.last != "" {
                out.append("")
            }
        }
    }

    mutating func finishComments() -> String {
        // Comments whose node was never written on its own line (e.g. inside a flow collection).
        for key in commentsBefore.keys.sorted() { out += commentsBefore[key]!.map(\.text) }
        for key in endOfLine.keys.sorted() { out.append(endOfLine[key]!) }
        if let first = trailingComments.first?.line, !out.isEmpty, out.last != "", first >= 2,
            lines[first - 2].allSatisfy({ $0 == " " || $0 == "\t" })
        {
            out.append("")
        }
        out += trailingComments.map(\.text)
        while out.last == "" { out.removeLast() }
        return out.isEmpty ? "" : out.joined(separator: "\n") + "\n"
    }

    mutating func emitDocument(_ root: Node) {
        if documentStart { out.append("---") }
        // Comments above the first key head the file, whatever key comes first after formatting.
        leadIn(root.mark?.line, indent: 0)
        guard case .mapping(let map) = root else {
            emitValue(root, indent: 0, context: .plain)
            return
        }
        emitMapping(map, indent: 0, context: .root)
    }

    mutating func emitMapping(
        _ map: Node.Mapping, indent: Int, context: ManifestFormatter.Context, firstPrefix: String? = nil
    ) {
        var first = true
        for (key, value) in ManifestFormatter.orderedPairs(map, context) {
            let keyText = scalarText(key)
            let childContext = context.child(key: key.string ?? "")
            // In a list item the first key follows "- " on the dash's line.
            let prefix = first ? (firstPrefix ?? "") : ""
            let keyIndent = first && firstPrefix != nil ? indent - 2 : indent
            first = false
            if let inline = inlineText(value, context: childContext),
                indent + prefix.count + keyText.count + 2 + inline.count <= lineWidth || !isCollection(value)
            {
                line("\(prefix)\(keyText): \(inline)", indent: keyIndent, source: key.mark?.line)
                continue
            }
            if case .scalar(let s) = value, s.string.contains("\n") {
                line(
                    "\(prefix)\(keyText): |\(s.string.hasSuffix("\n") ? "" : "-")", indent: keyIndent,
                    source: key.mark?.line)
                for textLine in s.string.split(separator: "\n", omittingEmptySubsequences: false).dropLast(
                    s.string.hasSuffix("\n") ? 1 : 0)
                {
                    out.append(textLine.isEmpty ? "" : String(repeating: " ", count: indent + 2) + textLine)
                }
                continue
            }
            line("\(prefix)\(keyText):", indent: keyIndent, source: key.mark?.line)
            switch value {
            case .sequence(let seq): emitSequence(seq, indent: indent + 2, context: childContext)
            case .mapping(let inner): emitMapping(inner, indent: indent + 2, context: childContext)
            default: emitValue(value, indent: indent + 2, context: childContext)
            }
        }
    }

    mutating func emitSequence(_ seq: Node.Sequence, indent: Int, context: ManifestFormatter.Context) {
        let itemContext = context
        for item in ManifestFormatter.orderedItems(seq, context) {
            leadIn(item.mark?.line, indent: indent)
            switch item {
            case .mapping(let map)
            where !map.isEmpty
                && !(isFlow(item)
                    && inlineText(item, context: itemContext).map { indent + 2 + $0.count <= lineWidth } == true):
                emitMapping(map, indent: indent + 2, context: itemContext, firstPrefix: "- ")
            case .sequence(let inner) where !inner.isEmpty && !isFlow(item):
                line("-", indent: indent, source: item.mark?.line)
                emitSequence(inner, indent: indent + 2, context: .plain)
            default:
                line(
                    "- " + (inlineText(item, context: itemContext) ?? scalarText(item)), indent: indent,
                    source: item.mark?.line)
            }
        }
    }

    mutating func emitValue(_ node: Node, indent: Int, context: ManifestFormatter.Context) {
        line(inlineText(node, context: context) ?? scalarText(node), indent: indent, source: node.mark?.line)
    }

    /// Whether a collection was written in flow style (`[…]`, `{…}`), read from the source: Yams does
    /// not report collection styles reliably.
    func isFlow(_ node: Node) -> Bool {
        guard let mark = node.mark, mark.line >= 1, mark.line <= lines.count else { return false }
        let line = lines[mark.line - 1]
        let offset = mark.column - 1
        guard offset >= 0, offset < line.count else { return false }
        let c = line[line.index(line.startIndex, offsetBy: offset)]
        return c == "[" || c == "{"
    }

    func isCollection(_ node: Node) -> Bool {
        switch node {
        case .mapping(let map): !map.isEmpty
        case .sequence(let seq): !seq.isEmpty
        default: false
        }
    }

    /// The node on one line: scalars, empty collections, and flow collections as written.
    func inlineText(_ node: Node, context: ManifestFormatter.Context) -> String? {
        switch node {
        case .scalar(let s):
            return s.string.contains("\n") ? nil : scalarText(node)
        case .sequence(let seq):
            if seq.isEmpty { return "[]" }
            guard isFlow(node) else { return nil }
            return flowText(node, context: context)
        case .mapping(let map):
            if map.isEmpty { return "{}" }
            guard isFlow(node) else { return nil }
            return flowText(node, context: context)
        case .alias:
            return nil
        }
    }

    func flowText(_ node: Node, context: ManifestFormatter.Context) -> String {
        switch node {
        case .sequence(let seq):
            return "["
                + ManifestFormatter.orderedItems(seq, context).map { flowText($0, context: context) }.joined(
                    separator: ", ") + "]"
        case .mapping(let map):
            return "{"
                + ManifestFormatter.orderedPairs(map, context).map { key, value in
                    "\(scalarText(key)): \(flowText(value, context: context.child(key: key.string ?? "")))"
                }.joined(separator: ", ") + "}"
        default:
            return scalarText(node)
        }
    }

    /// A scalar in its original quoting; block scalars become double-quoted.
    func scalarText(_ node: Node) -> String {
        guard case .scalar(let s) = node else { return "" }
        switch s.style {
        case .singleQuoted:
            return "'" + s.string.replacingOccurrences(of: "'", with: "''") + "'"
        case .doubleQuoted, .literal, .folded:
            return Self.doubleQuoted(s.string)
        default:
            return s.string.isEmpty && !s.tag.description.hasSuffix(":null") ? "\"\"" : s.string
        }
    }

    static func doubleQuoted(_ text: String) -> String {
        var result = "\""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\"": result += "\\\""
            case "\\": result += "\\\\"
            case "\n": result += "\\n"
            case "\t": result += "\\t"
            case "\r": result += "\\r"
            default:
                if scalar.value < 0x20 {
                    result += "\\x" + (scalar.value < 16 ? "0" : "") + String(scalar.value, radix: 16)
                } else {
                    result.unicodeScalars.append(scalar)
                }
            }
        }
        return result + "\""
    }
}

extension String {
    fileprivate func trimmingTrailingSpaces() -> String {
        var s = self
        while s.last == " " || s.last == "\t" || s.last == "\r" { s.removeLast() }
        return s
    }
}
