/// FCM's documented limits and name rules (see the wire-protocol reference, §1.7, §2.2, §5, §8).
public enum FCMLimits {
    /// Topics one app instance can hold.
    public static let maxTopicsPerToken = 2000
    /// Members of one device group.
    public static let maxGroupMembers = 20
    /// Tokens in one Instance ID batch call, and the planner's batch size.
    public static let maxBatchTokens = 1000
    /// Length of a topic name in the v1 topic subscription API.
    public static let maxTopicNameLength = 900
    /// Documented subscription changes per second per project.
    public static let defaultQuota = 3000
    /// The highest rate tidemark accepts for `qps` and `read_qps` (and their flags), per second.
    public static let maxRate = 1_000_000

    /// Whether `rate` is one tidemark paces by: above zero, at most `maxRate` (not infinity, not NaN).
    public static func isRate(_ rate: Double) -> Bool { rate > 0 && rate <= Double(maxRate) }

    /// Why `name` is not a valid topic name, or nil when it is.
    public static func topicNameProblem(_ name: String) -> String? {
        if name.hasPrefix("/topics/") {
            return "write the bare name without the '/topics/' prefix"
        }
        if name.utf8.count > maxTopicNameLength {
            return "a topic name has at most \(maxTopicNameLength) characters"
        }
        for scalar in name.unicodeScalars where !isTopicCharacter(scalar) {
            return "'\(scalar)' is not allowed; topic names use only letters, digits and - _ . ~ %"
        }
        return name.isEmpty ? "a topic name must not be empty" : nil
    }

    /// The longest device group name tidemark accepts. FCM documents no limit; names are keys a
    /// person reads (`user-1234`), and a bound keeps hostile manifests from growing every request.
    public static let maxGroupNameLength = 256

    /// Why `name` cannot name a device group, or nil when it can.
    public static func groupNameProblem(_ name: String) -> String? {
        if name.utf8.count > maxGroupNameLength {
            return "is \(name.utf8.count) bytes long; a device group name has at most \(maxGroupNameLength)"
        }
        if name.unicodeScalars.contains(where: { $0.properties.generalCategory == .control }) {
            return "'\(name.escapedOnOneLine)' has a control character (a newline, a tab); write the name on one line"
        }
        return nil
    }

    static func isTopicCharacter(_ c: Unicode.Scalar) -> Bool {
        switch c {
        case "a"..."z", "A"..."Z", "0"..."9", "-", "_", ".", "~", "%": true
        default: false
        }
    }

    /// Why `token` cannot be a registration ID FCM could have issued, or nil when it can be one.
    ///
    /// FCM issues three shapes (reference §8.7): registration tokens `PREFIX:APA91b…` (the prefix is the
    /// app instance's id), 22-character Firebase installation IDs, and legacy GCM tokens `APA91b…` of
    /// 100 characters or more. Anything else (a three-letter word, an email address) was never issued
    /// by FCM and is refused before it reaches it.
    public static func tokenProblem(_ token: String) -> String? {
        var token = token
        let shape = token.withUTF8 { bytes -> TokenShape in Self.shape(bytes) }
        switch shape {
        case .valid: return nil
        case .empty: return "a registration token must not be empty"
        case .tooLong: return "a registration token has at most 4096 characters"
        case .badCharacter:
            for scalar in token.unicodeScalars {
                switch scalar {
                case "a"..."z", "A"..."Z", "0"..."9", "-", "_", ":", ".": continue
                default:
                    return "'\(scalar.escaped(asASCII: true))' cannot appear in a registration token"
                }
            }
            return "it has a character a registration token cannot have"
        case .unknownShape:
            let shown = token.count > 24 ? String(token.prefix(12)) + "…" : token
            return
                "'\(shown)' is not a registration ID FCM issues: FCM tokens look like 'PREFIX:APA91b…' and Firebase installation IDs are 22 characters of letters, digits, '-' and '_'"
        }
    }

    enum TokenShape { case valid, empty, tooLong, badCharacter, unknownShape }

    /// Each byte's class for `shape`, looked up rather than matched against ranges.
    static let tokenByteClasses: [UInt8] = (0..<256).map { value -> UInt8 in
        let byte = UInt8(value)
        switch byte {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
            UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "_"):
            return 1
        case UInt8(ascii: ":"): return 2
        case UInt8(ascii: "."): return 3
        default: return 0
        }
    }

    static func shape(_ bytes: UnsafeBufferPointer<UInt8>) -> TokenShape {
        guard !bytes.isEmpty else { return .empty }
        guard bytes.count <= 4096 else { return .tooLong }
        var colon: Int?
        var base64URL = true
        let verdict: TokenShape? = tokenByteClasses.withUnsafeBufferPointer { classes in
            var i = 0
            let n = bytes.count
            while true {
                // 1: letters, digits, '-' and '_' (almost every byte), skipped in a tight loop;
                // 2: ':'; 3: '.'; 0: anything else.
                while i < n, classes[Int(bytes[i])] == 1 { i += 1 }
                guard i < n else { return nil }
                switch classes[Int(bytes[i])] {
                case 2: if colon == nil { colon = i } else { base64URL = false }
                case 3: base64URL = false
                default: return .badCharacter
                }
                i += 1
            }
        }
        if let verdict { return verdict }
        // "APA91b", compared in place (a million tokens are checked on every plan).
        func hasAPA(at start: Int) -> Bool {
            start + 6 <= bytes.count && bytes[start] == 0x41 && bytes[start + 1] == 0x50 && bytes[start + 2] == 0x41
                && bytes[start + 3] == 0x39 && bytes[start + 4] == 0x31 && bytes[start + 5] == 0x62
        }
        if let colon {
            // PREFIX:APA91b…: the prefix is the instance id, letters, digits, '-' and '_'.
            return colon > 0 && hasAPA(at: colon + 1) ? .valid : .unknownShape
        }
        if bytes.count == 22, base64URL { return .valid }  // a Firebase installation ID
        if bytes.count >= 100, hasAPA(at: 0) { return .valid }  // a legacy GCM token
        return .unknownShape
    }
}
