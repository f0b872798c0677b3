import Foundation

/// A unified diff of two texts, line by line (as `diff -u` prints it), for `tidemark fmt --diff`.
public enum UnifiedDiff {
    /// The hunks that turn `old` into `new`, each with `context` unchanged lines around its changes,
    /// after a `--- oldName` / `+++ newName` header; empty when the texts are equal.
    public static func render(
        _ old: String, _ new: String, oldName: String, newName: String, context: Int = 3
    ) -> String {
        let a = lines(old)
        let b = lines(new)
        var out = "--- \(oldName)\n+++ \(newName)\n"
        guard a != b else {
            // Only the line ends differ: the new text ends with a newline, the old did not (or the reverse).
            return old == new ? "" : out + "\\ only the newline at the end of the file differs\n"
        }
        let edits = script(a, b)
        var index = 0
        while index < edits.count {
            guard let firstChange = edits[index...].firstIndex(where: { $0.kind != .same }) else { break }
            // The hunk runs until a stretch of more than twice the context is unchanged.
            var last = firstChange
            var scan = firstChange + 1
            while scan < edits.count {
                if edits[scan].kind != .same {
                    last = scan
                } else if scan - last > 2 * context {
                    break
                }
                scan += 1
            }
            let start = max(index, firstChange - context)
            let end = min(edits.count, last + context + 1)
            let hunk = edits[start..<end]
            let oldCount = hunk.filter { $0.kind != .insert }.count
            let newCount = hunk.filter { $0.kind != .delete }.count
            let oldStart = oldCount == 0 ? hunk.first!.old : hunk.first!.old + 1
            let newStart = newCount == 0 ? hunk.first!.new : hunk.first!.new + 1
            out += "@@ -\(range(oldStart, oldCount)) +\(range(newStart, newCount)) @@\n"
            for edit in hunk {
                switch edit.kind {
                case .same: out += " " + a[edit.old] + "\n"
                case .delete: out += "-" + a[edit.old] + "\n"
                case .insert: out += "+" + b[edit.new] + "\n"
                }
            }
            index = end
        }
        return out
    }

    private struct Edit {
        enum Kind { case same, delete, insert }
        var kind: Kind
        /// The line's index in the old text (for an insertion: the index of the old line after it).
        var old: Int
        /// The line's index in the new text (for a deletion: the index of the new line after it).
        var new: Int
    }

    /// The edit script from `a` to `b`, in order, from the standard library's difference (Myers).
    private static func script(_ a: [String], _ b: [String]) -> [Edit] {
        var removed = Set<Int>()
        var inserted = Set<Int>()
        for change in b.difference(from: a) {
            switch change {
            case .remove(let offset, _, _): removed.insert(offset)
            case .insert(let offset, _, _): inserted.insert(offset)
            }
        }
        var edits: [Edit] = []
        var (i, j) = (0, 0)
        while i < a.count || j < b.count {
            if i < a.count, removed.contains(i) {
                edits.append(Edit(kind: .delete, old: i, new: j))
                i += 1
            } else if j < b.count, inserted.contains(j) {
                edits.append(Edit(kind: .insert, old: i, new: j))
                j += 1
            } else {
                edits.append(Edit(kind: .same, old: i, new: j))
                i += 1
                j += 1
            }
        }
        return edits
    }

    private static func lines(_ text: String) -> [String] {
        var lines = text.components(separatedBy: "\n")
        if lines.last == "" { lines.removeLast() }
        return lines
    }

    private static func range(_ start: Int, _ count: Int) -> String {
        count == 1 ? "\(start)" : "\(start),\(count)"
    }
}
