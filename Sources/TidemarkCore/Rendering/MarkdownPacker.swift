/// A piece of a markdown comment that is kept whole when it fits a part, and otherwise split between
/// its lines with `open` and `close` repeated around each piece (so a `<details>` block or a code
/// fence stays well-formed in every part).
public struct MarkdownBlock: Sendable, Equatable {
    /// Lines written before the block's lines (a `<details>` tag, a fence).
    public var open: String
    /// The block's lines, split between parts only here.
    public var lines: [String]
    /// Lines written after them (`</details>`, a closing fence).
    public var close: String
    /// `open` for the second and later pieces of a split block; nil repeats `open`.
    public var reopen: String?

    /// A block of `lines` between `open` and `close`.
    public init(open: String = "", lines: [String], close: String = "", reopen: String? = nil) {
        self.open = open
        self.lines = lines
        self.close = close
        self.reopen = reopen
    }

    /// A block of plain text lines.
    public static func text(_ lines: String...) -> MarkdownBlock { MarkdownBlock(lines: lines) }

    var rendered: String { render(open: open, lines[...]) }

    func render(open: String, _ slice: ArraySlice<String>) -> String {
        var parts: [String] = []
        if !open.isEmpty { parts.append(open) }
        parts.append(contentsOf: slice)
        if !close.isEmpty { parts.append(close) }
        return parts.joined(separator: "\n")
    }
}

/// Packs markdown blocks into comment-sized parts: each part below `limit` UTF-8 bytes (GitHub
/// refuses comments of 65,536 characters or more), later parts headed "continued", and at most
/// `maxParts` parts, the last one ending with a pointer to the full data.
public struct MarkdownPacker: Sendable {
    /// The most UTF-8 bytes of one part.
    public var limit: Int
    /// The most parts; what does not fit is named in the last.
    public var maxParts: Int

    /// A packer for parts below `limit` bytes (at least 2,000), at most `maxParts` of them.
    public init(limit: Int = 60_000, maxParts: Int = 10) {
        precondition(limit >= 2_000, "a part must hold at least a header and a few lines")
        self.limit = limit
        self.maxParts = max(1, maxParts)
    }

    /// `continued(i, n)` heads part i (2-based) of n; `truncated(omittedBlocks)` closes the last part
    /// when not everything fit in `maxParts`.
    public func pack(
        head: String, blocks: [MarkdownBlock], continued: (Int, Int) -> String,
        truncated: (Int) -> String
    ) -> [String] {
        // Room for the "continued" header and the truncation note, with a margin for their numbers.
        let headerRoom = continued(99, 99).utf8.count + 2
        let noteRoom = truncated(999_999).utf8.count + 2
        let room = limit - max(headerRoom, head.utf8.count + 2) - noteRoom
        var pieces: [[String]] = [[]]
        var used = 0
        func startPart() {
            pieces.append([])
            used = 0
        }
        func add(_ text: String) {
            let size = text.utf8.count + 2
            if used > 0, used + size > room { startPart() }
            pieces[pieces.count - 1].append(text)
            used += size
        }
        for block in blocks {
            let whole = block.rendered
            if whole.utf8.count + 2 <= room {
                add(whole)
                continue
            }
            // Split between lines; every piece gets the block's opening and closing.
            var start = block.lines.startIndex
            var first = true
            while start < block.lines.endIndex {
                let open = first ? block.open : (block.reopen ?? block.open)
                let frame = open.utf8.count + block.close.utf8.count + 4
                let free = used == 0 ? room : room - used
                var end = start
                var size = frame
                while end < block.lines.endIndex, size + block.lines[end].utf8.count + 1 <= free {
                    size += block.lines[end].utf8.count + 1
                    end += 1
                }
                if end == start {
                    if used > 0 {
                        startPart()
                        continue
                    }
                    end = start + 1  // One line longer than a part: it goes alone (and is cut below).
                }
                var text = block.render(open: open, block.lines[start..<end])
                if text.utf8.count + 2 > room { text = String(decoding: text.utf8.prefix(room - 2), as: UTF8.self) }
                add(text)
                start = end
                first = false
            }
        }
        if pieces.last?.isEmpty == true, pieces.count > 1 { pieces.removeLast() }
        var omitted = 0
        if pieces.count > maxParts {
            omitted = pieces[maxParts...].reduce(0) { $0 + $1.count }
            pieces = Array(pieces[..<maxParts])
        }
        let count = pieces.count
        return pieces.enumerated().map { index, piece in
            var text = (index == 0 ? head : continued(index + 1, count)) + "\n\n" + piece.joined(separator: "\n\n")
            if omitted > 0, index == count - 1 { text += "\n\n" + truncated(omitted) }
            return text + "\n"
        }
    }
}
