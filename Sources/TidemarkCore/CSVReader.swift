import Foundation

/// A small RFC 4180 reader over bytes: quoted fields, doubled quotes, CRLF.
struct CSVReader {
    struct Row {
        var fields: [String]
        var line: Int
        var problem: String?
    }

    private let bytes: [UInt8]
    private var position = 0
    private var line = 1

    init(_ data: Data) { bytes = [UInt8](data) }

    mutating func next() -> Row? {
        guard position < bytes.count else { return nil }
        return bytes.withUnsafeBufferPointer { buffer in nextRow(buffer) }
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
                while position < buffer.count, buffer[position] != UInt8(ascii: ","),
                    buffer[position] != UInt8(ascii: "\n")
                {
                    position += 1
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
