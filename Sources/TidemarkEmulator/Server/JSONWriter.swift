import Foundation

/// A small, fast JSON serializer for the emulator's answers.
///
/// Foundation's `JSONSerialization` bridges every dictionary and string, which made it most of
/// the cost of a v1 call. This writes the same JSON (sorted keys, no escaped slashes) straight to
/// bytes. It takes what the handlers build: strings, integers, doubles, booleans, arrays and
/// string-keyed dictionaries of those.
enum JSONWriter {
    static func data(_ value: Any) -> Data {
        var out: [UInt8] = []
        out.reserveCapacity(256)
        write(value, to: &out)
        return Data(out)
    }

    static func write(_ value: Any, to out: inout [UInt8]) {
        switch value {
        case let string as String: writeString(string, to: &out)
        case let object as [String: Any]:
            out.append(UInt8(ascii: "{"))
            var first = true
            for key in object.keys.sorted() {
                if !first { out.append(UInt8(ascii: ",")) }
                first = false
                writeString(key, to: &out)
                out.append(UInt8(ascii: ":"))
                write(object[key]!, to: &out)
            }
            out.append(UInt8(ascii: "}"))
        case let strings as [String]:
            out.append(UInt8(ascii: "["))
            for (i, string) in strings.enumerated() {
                if i > 0 { out.append(UInt8(ascii: ",")) }
                writeString(string, to: &out)
            }
            out.append(UInt8(ascii: "]"))
        case let array as [Any]:
            out.append(UInt8(ascii: "["))
            for (i, element) in array.enumerated() {
                if i > 0 { out.append(UInt8(ascii: ",")) }
                write(element, to: &out)
            }
            out.append(UInt8(ascii: "]"))
        case let bool as Bool: out.append(contentsOf: (bool ? "true" : "false").utf8)
        case let int as Int: out.append(contentsOf: String(int).utf8)
        case let int as UInt64: out.append(contentsOf: String(int).utf8)
        case let double as Double:
            if double.isFinite, double == double.rounded(), abs(double) < 1e15 {
                out.append(contentsOf: String(Int(double)).utf8)
            } else {
                out.append(contentsOf: (double.isFinite ? String(double) : "null").utf8)
            }
        default: out.append(contentsOf: "null".utf8)
        }
    }

    static func writeString(_ string: String, to out: inout [UInt8]) {
        out.append(UInt8(ascii: "\""))
        var string = string
        string.withUTF8 { bytes in
            if !bytes.contains(where: { $0 < 0x20 || $0 == UInt8(ascii: "\"") || $0 == UInt8(ascii: "\\") }) {
                out.append(contentsOf: bytes)
                return
            }
            for byte in bytes {
                switch byte {
                case UInt8(ascii: "\""): out.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "\"")])
                case UInt8(ascii: "\\"): out.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "\\")])
                case UInt8(ascii: "\n"): out.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "n")])
                case UInt8(ascii: "\r"): out.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "r")])
                case UInt8(ascii: "\t"): out.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "t")])
                case 0..<0x20:
                    let hex = Array("0123456789abcdef".utf8)
                    out.append(contentsOf: [
                        UInt8(ascii: "\\"), UInt8(ascii: "u"), UInt8(ascii: "0"), UInt8(ascii: "0"),
                        hex[Int(byte >> 4)], hex[Int(byte & 15)],
                    ])
                default: out.append(byte)
                }
            }
        }
        out.append(UInt8(ascii: "\""))
    }
}
