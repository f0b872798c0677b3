extension String {
    /// The text with every character that could drive a terminal or reorder what a reader sees shown
    /// as an escape (`\u{1B}`): C0 controls other than newline and tab, DEL, C1 controls and the
    /// Unicode bidirectional overrides. Renderers pass what comes from files (a plan file, a state
    /// row) through it, so a crafted file cannot rewrite a reviewer's terminal or hide a line.
    public var escapingControlCharacters: String {
        guard utf8.contains(where: { $0 < 0x20 || $0 == 0x7F || $0 == 0xC2 || $0 == 0xE2 }) else { return self }
        var out = String.UnicodeScalarView()
        var changed = false
        for scalar in unicodeScalars {
            if Self.isHidden(scalar) {
                changed = true
                out.append(contentsOf: "\\u{\(String(scalar.value, radix: 16, uppercase: true))}".unicodeScalars)
            } else {
                out.append(scalar)
            }
        }
        return changed ? String(out) : self
    }

    /// The text as one line: `escapingControlCharacters`, newlines and tabs escaped too (for a value
    /// quoted in a message, where a newline would split it).
    public var escapedOnOneLine: String {
        guard utf8.contains(where: { $0 == 0x0A || $0 == 0x09 }) else { return escapingControlCharacters }
        return escapingControlCharacters.replacingOccurrences(of: "\n", with: "\\n").replacingOccurrences(
            of: "\t", with: "\\t")
    }

    static func isHidden(_ scalar: Unicode.Scalar) -> Bool {
        switch scalar.value {
        case 0x0A, 0x09: false
        case 0x00..<0x20, 0x7F, 0x80..<0xA0: true
        case 0x202A...0x202E, 0x2066...0x2069: true
        default: false
        }
    }
}
