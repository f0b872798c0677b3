import Foundation

/// One line a person can act on for any error, never a Foundation or Swift dump
/// (`Error Domain=NSCocoaErrorDomain Code=…`, `DecodingError.typeMismatch(…)`).
public enum ErrorText {
    /// The error as one line a person can act on.
    public static func describe(_ error: any Error) -> String {
        switch error {
        case let error as DecodingError:
            return describe(error, snakeCase: false)
        case let error as InputFileError:
            return error.problem
        case let error as CocoaError:
            return describe(cocoa: error.code.rawValue, path: error.filePath ?? error.url?.path, error: error)
        case let error as POSIXError:
            return String(cString: strerror(error.code.rawValue))
        case let described as CustomStringConvertible
        where !(described is NSError) && String(describing: type(of: described)) != "NSError":
            let text = described.description
            if isDump(text) { return unexpected(error) }
            return text.hasPrefix("SQLite error") ? sqlite(text) : text
        default:
            let bridged = error as NSError
            if bridged.domain == NSCocoaErrorDomain {
                return describe(
                    cocoa: bridged.code, path: bridged.userInfo[NSFilePathErrorKey] as? String, error: error)
            }
            if bridged.domain == NSPOSIXErrorDomain { return String(cString: strerror(Int32(bridged.code))) }
            return unexpected(error)
        }
    }

    /// Whether `text` is a value's debug dump rather than a sentence: `SingleConnectionFailure(target:
    /// …)`, `Optional(…)`, `Error Domain=… Code=…`, a type qualified by its module.
    public static func isDump(_ text: String) -> Bool {
        if text.hasPrefix("Error Domain=") || text.contains("Optional(") { return true }
        // "TypeName(label: …" or "Module.TypeName(…": a memberwise dump.
        let head = text.prefix { $0 != "(" }
        guard head.count < text.count, let first = head.first, first.isLetter, !head.contains(" ") else {
            return false
        }
        let rest = text.dropFirst(head.count + 1)
        let label = rest.prefix { $0.isLetter || $0.isNumber || $0 == "_" }
        return head.contains(".") || (first.isUppercase && !label.isEmpty && rest.dropFirst(label.count).hasPrefix(":"))
    }

    /// An error with nothing to say for itself, said without dumping it: what kind of failure, and
    /// where to look.
    static func unexpected(_ error: any Error) -> String {
        let bridged = error as NSError
        let localized = bridged.localizedDescription
        if !localized.isEmpty, !localized.hasPrefix("The operation could not be completed"), !isDump(localized) {
            return localized
        }
        let name = String(describing: type(of: error)).split(separator: ".").last.map(String.init) ?? "unknown"
        return
            "an error tidemark has no words for (\(name), code \(bridged.code)); TIDEMARK_TRACE_PHASES=1 shows the phase it came from"
    }

    static func describe(cocoa code: Int, path: String?, error: any Error) -> String {
        let what: String
        switch code {
        case CocoaError.fileNoSuchFile.rawValue, CocoaError.fileReadNoSuchFile.rawValue: what = "no such file"
        case CocoaError.fileReadNoPermission.rawValue, CocoaError.fileWriteNoPermission.rawValue:
            what = "permission denied; check the file's owner and mode"
        case CocoaError.fileWriteOutOfSpace.rawValue: what = "the disk is full"
        case CocoaError.fileWriteVolumeReadOnly.rawValue: what = "the file system is read-only"
        case CocoaError.fileWriteFileExists.rawValue: what = "a file is in the way where a directory is needed"
        case CocoaError.fileReadCorruptFile.rawValue: what = "the file's content cannot be read"
        case CocoaError.fileReadInapplicableStringEncoding.rawValue: what = "the file is not UTF-8 text"
        default:
            let underlying = ((error as NSError).userInfo[NSUnderlyingErrorKey] as? NSError)
            if let underlying, underlying.domain == NSPOSIXErrorDomain {
                what = String(cString: strerror(Int32(underlying.code)))
            } else {
                what = "the file system refused (code \(code))"
            }
        }
        return path.map { "\($0): \(what)" } ?? what
    }

    /// Where in a JSON document decoding stopped, and why; `snakeCase` names keys as a document
    /// written with `convertToSnakeCase` spells them.
    public static func describe(_ error: DecodingError, snakeCase: Bool = false) -> String {
        func name(_ key: any CodingKey) -> String { snakeCase ? snake(key.stringValue) : key.stringValue }
        func place(_ path: [any CodingKey]) -> String {
            let text = path.map { key in key.intValue.map { "[\($0)]" } ?? ".\(name(key))" }.joined()
            return text.isEmpty ? "the top level" : String(text.drop { $0 == "." })
        }
        switch error {
        case .keyNotFound(let key, let context):
            let parent = place(context.codingPath)
            return "'\(name(key))' is missing at \(parent)"
        case .typeMismatch(let type, let context):
            return "\(place(context.codingPath)) is not \(article(type))"
        case .valueNotFound(let type, let context):
            return "\(place(context.codingPath)) is null where \(article(type)) belongs"
        case .dataCorrupted(let context):
            if context.codingPath.isEmpty { return "it is not valid JSON" }
            return "\(place(context.codingPath)) is invalid: \(context.debugDescription.prefix(200))"
        @unknown default:
            return "it cannot be decoded"
        }
    }

    /// GRDB's "SQLite error 14: unable to open database file - while …" as a reason.
    static func sqlite(_ text: String) -> String {
        let reason =
            text.split(separator: ":", maxSplits: 1).last.map { $0.trimmingCharacters(in: .whitespaces) } ?? text
        return "SQLite could not use the file: " + (reason.components(separatedBy: " - ").first ?? reason)
    }

    static func snake(_ key: String) -> String {
        var out = ""
        for character in key {
            if character.isUppercase {
                if !out.isEmpty { out += "_" }
                out += character.lowercased()
            } else {
                out.append(character)
            }
        }
        return out
    }

    static func article(_ type: Any.Type) -> String {
        switch type {
        case is String.Type: "a string"
        case is Int.Type, is Int64.Type, is UInt32.Type, is Double.Type: "a number"
        case is Bool.Type: "true or false"
        case is [Any].Type: "a list"
        default:
            String(describing: type).hasPrefix("Array") ? "a list" : "an object (\(String(describing: type)))"
        }
    }
}
