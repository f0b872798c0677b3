import Foundation

/// A small RFC 4180 reader over bytes: quoted fields, doubled quotes, CRLF.
struct CSVReader {
    struct Row {
        var fields: [String]
        var line: Int
        var problem: String?
    }

    /// The bytes read, which the caller keeps alive and unchanged while it reads (a CSV of a million
    /// devices is 183 MB: it is read where it lies, not copied).
    let buffer: UnsafeBufferPointer<UInt8>
    private var position = 0
    private var line = 1

    init(_ buffer: UnsafeBufferPointer<UInt8>) { self.buffer = buffer }

    mutating func next() -> Row? {
        guard position < buffer.count else { return nil }
        return nextRow(buffer)
    }

    /// The next row when it has no quote, as the byte ranges of its fields in `buffer` (as `next()` reads
    /// them: a '\r' ending a field is dropped), and its line; nil at the end, or when the next row
    /// has a quote (read that one with `next()`). `fields` is reused from row to row.
    mutating func nextPlain(_ fields: inout [Range<Int>]) -> Int? {
        guard position < buffer.count, let base = buffer.baseAddress else { return nil }
        let raw = UnsafeRawPointer(base)
        func find(_ byte: UInt8, from: Int, to: Int) -> Int? {
            memchr(raw + from, Int32(byte), to - from).map { UnsafeRawPointer($0) - raw }
        }
        let end = find(0x0A, from: position, to: buffer.count) ?? buffer.count
        if find(0x22, from: position, to: end) != nil { return nil }
        fields.removeAll(keepingCapacity: true)
        var start = position
        while let comma = find(0x2C, from: start, to: end) {
            fields.append(start..<(comma > start && base[comma - 1] == 0x0D ? comma - 1 : comma))
            start = comma + 1
        }
        fields.append(start..<(end > start && base[end - 1] == 0x0D ? end - 1 : end))
        position = end < buffer.count ? end + 1 : end
        line += 1
        return line - 1
    }

    private mutating func nextRow(_ buffer: UnsafeBufferPointer<UInt8>) -> Row {
        let startLine = line
        var fields: [String] = []
        fields.reserveCapacity(8)
        while true {
            // Fast path: an unquoted field is a slice up to the next comma or newline.
            if position < buffer.count, buffer[position] != UInt8(ascii: "\"") {
                let start = position
                while position < buffer.count {
                    let byte = buffer[position]
                    if byte == UInt8(ascii: ",") || byte == UInt8(ascii: "\n") { break }
                    position += 1
                }
                var end = position
                if end > start, buffer[end - 1] == UInt8(ascii: "\r") { end -= 1 }
                fields.append(String(decoding: UnsafeBufferPointer(rebasing: buffer[start..<end]), as: UTF8.self))
            } else if position < buffer.count {
                position += 1
                var field: [UInt8] = []
                var closed = false
                while position < buffer.count {
                    let byte = buffer[position]
                    position += 1
                    if byte == UInt8(ascii: "\"") {
                        if position < buffer.count, buffer[position] == UInt8(ascii: "\"") {
                            field.append(byte)
                            position += 1
                        } else {
                            closed = true
                            break
                        }
                    } else {
                        if byte == UInt8(ascii: "\n") { line += 1 }
                        field.append(byte)
                    }
                }
                fields.append(String(decoding: field, as: UTF8.self))
                if !closed {
                    return Row(
                        fields: fields, line: startLine, problem: "a quoted field is not closed; add the closing '\"'.")
                }
                // After the closing quote comes the separator (a '\r' before a newline allowed); anything
                // else is a broken field, not text to drop.
                var garbage = false
                while position < buffer.count, buffer[position] != UInt8(ascii: ","),
                    buffer[position] != UInt8(ascii: "\n")
                {
                    if buffer[position] != UInt8(ascii: "\r") { garbage = true }
                    position += 1
                }
                if garbage {
                    if position < buffer.count, buffer[position] == UInt8(ascii: "\n") {
                        position += 1
                        line += 1
                    } else {
                        // Skip the rest of the row so that the next one is read from its start.
                        while position < buffer.count, buffer[position] != UInt8(ascii: "\n") { position += 1 }
                        if position < buffer.count {
                            position += 1
                            line += 1
                        }
                    }
                    return Row(
                        fields: fields, line: startLine,
                        problem:
                            "a quoted field has text after its closing '\"'; put the whole value inside the quotes and double any quote in it."
                    )
                }
            } else {
                fields.append("")
            }
            if position >= buffer.count { return Row(fields: fields, line: startLine) }
            let separator = buffer[position]
            position += 1
            if separator == UInt8(ascii: "\n") {
                line += 1
                return Row(fields: fields, line: startLine)
            }
        }
    }
}
