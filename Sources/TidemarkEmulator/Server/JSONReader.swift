import Foundation

/// A small, fast JSON parser for request bodies (a 1000-token batch is about 170 KB).
///
/// Produces what `JSONSerialization` would, minus the bridging: `[String: Any]`, `[Any]` (or
/// `[String]` when every element is a string), `String`, `Int`, `Double`, `Bool`, `NSNull`.
/// Returns nil for anything that is not exactly one JSON value.
enum JSONReader {
    static func parse(_ data: Data) -> Any? {
        data.withUnsafeBytes { raw -> Any? in
            var parser = Parser(bytes: raw.bindMemory(to: UInt8.self))
            guard let value = parser.value(depth: 0) else { return nil }
            parser.skipSpace()
            return parser.index == parser.bytes.count ? value : nil
        }
    }

    struct Parser {
        let bytes: UnsafeBufferPointer<UInt8>
        var index = 0

        mutating func skipSpace() {
            while index < bytes.count {
                switch bytes[index] {
                case 0x20, 0x09, 0x0A, 0x0D: index += 1
                default: return
                }
            }
        }

        mutating func value(depth: Int) -> Any? {
            guard depth < 64 else { return nil }
            skipSpace()
            guard index < bytes.count else { return nil }
            switch bytes[index] {
            case UInt8(ascii: "{"): return object(depth: depth)
            case UInt8(ascii: "["): return array(depth: depth)
            case UInt8(ascii: "\""): return string()
            case UInt8(ascii: "t"): return literal("true", true)
            case UInt8(ascii: "f"): return literal("false", false)
            case UInt8(ascii: "n"): return literal("null", NSNull())
            default: return number()
            }
        }

        mutating func literal(_ text: StaticString, _ value: Any) -> Any? {
            let count = text.utf8CodeUnitCount
            guard index + count <= bytes.count else { return nil }
            for i in 0..<count where bytes[index + i] != text.utf8Start[i] { return nil }
            index += count
            return value
        }

        mutating func object(depth: Int) -> Any? {
            index += 1
            var result: [String: Any] = [:]
            skipSpace()
            if index < bytes.count, bytes[index] == UInt8(ascii: "}") {
                index += 1
                return result
            }
            while true {
                skipSpace()
                guard index < bytes.count, bytes[index] == UInt8(ascii: "\""), let key = string() else { return nil }
                skipSpace()
                guard index < bytes.count, bytes[index] == UInt8(ascii: ":") else { return nil }
                index += 1
                guard let element = value(depth: depth + 1) else { return nil }
                result[key] = element
                skipSpace()
                guard index < bytes.count else { return nil }
                if bytes[index] == UInt8(ascii: ",") {
                    index += 1
                } else if bytes[index] == UInt8(ascii: "}") {
                    index += 1
                    return result
                } else {
                    return nil
                }
            }
        }

        mutating func array(depth: Int) -> Any? {
            index += 1
            var result: [Any] = []
            var strings: [String] = []
            var allStrings = true
            skipSpace()
            if index < bytes.count, bytes[index] == UInt8(ascii: "]") {
                index += 1
                return result
            }
            while true {
                guard let element = value(depth: depth + 1) else { return nil }
                if allStrings, let string = element as? String {
                    strings.append(string)
                } else {
                    if allStrings {
                        result = strings
                        allStrings = false
                    }
                    result.append(element)
                }
                skipSpace()
                guard index < bytes.count else { return nil }
                if bytes[index] == UInt8(ascii: ",") {
                    index += 1
                } else if bytes[index] == UInt8(ascii: "]") {
                    index += 1
                    return allStrings ? strings : result
                } else {
                    return nil
                }
            }
        }

        mutating func string() -> String? {
            index += 1
            let start = index
            // Fast path: no escapes.
            while index < bytes.count {
                let byte = bytes[index]
                if byte == UInt8(ascii: "\"") {
                    let text = String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<index]), as: UTF8.self)
                    index += 1
                    return text
                }
                if byte == UInt8(ascii: "\\") || byte < 0x20 { break }
                index += 1
            }
            var out = Array(bytes[start..<index])
            while index < bytes.count {
                let byte = bytes[index]
                index += 1
                switch byte {
                case UInt8(ascii: "\""): return String(decoding: out, as: UTF8.self)
                case 0..<0x20: return nil
                case UInt8(ascii: "\\"):
                    guard index < bytes.count else { return nil }
                    let escape = bytes[index]
                    index += 1
                    switch escape {
                    case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): out.append(escape)
                    case UInt8(ascii: "b"): out.append(0x08)
                    case UInt8(ascii: "f"): out.append(0x0C)
                    case UInt8(ascii: "n"): out.append(0x0A)
                    case UInt8(ascii: "r"): out.append(0x0D)
                    case UInt8(ascii: "t"): out.append(0x09)
                    case UInt8(ascii: "u"):
                        guard var scalar = hex4() else { return nil }
                        if (0xD800..<0xDC00).contains(scalar) {
                            guard index + 1 < bytes.count, bytes[index] == UInt8(ascii: "\\"),
                                bytes[index + 1] == UInt8(ascii: "u")
                            else { return nil }
                            index += 2
                            guard let low = hex4(), (0xDC00..<0xE000).contains(low) else { return nil }
                            scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                        }
                        guard let unicode = Unicode.Scalar(scalar) else { return nil }
                        out.append(contentsOf: Array(String(Character(unicode)).utf8))
                    default: return nil
                    }
                default: out.append(byte)
                }
            }
            return nil
        }

        mutating func hex4() -> UInt32? {
            guard index + 4 <= bytes.count else { return nil }
            var value: UInt32 = 0
            for _ in 0..<4 {
                let byte = bytes[index]
                index += 1
                let digit: UInt32
                switch byte {
                case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = UInt32(byte - UInt8(ascii: "0"))
                case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = UInt32(byte - UInt8(ascii: "a") + 10)
                case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = UInt32(byte - UInt8(ascii: "A") + 10)
                default: return nil
                }
                value = value << 4 | digit
            }
            return value
        }

        mutating func number() -> Any? {
            let start = index
            var isInteger = true
            while index < bytes.count, Self.isNumberByte(bytes[index]) {
                switch bytes[index] {
                case UInt8(ascii: "."), UInt8(ascii: "e"), UInt8(ascii: "E"): isInteger = false
                default: break
                }
                index += 1
            }
            guard index > start else { return nil }
            let text = String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<index]), as: UTF8.self)
            if isInteger, let int = Int(text) { return int }
            return Double(text)
        }

        static func isNumberByte(_ byte: UInt8) -> Bool {
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "+"), UInt8(ascii: "."),
                UInt8(ascii: "e"), UInt8(ascii: "E"):
                true
            default: false
            }
        }
    }
}
