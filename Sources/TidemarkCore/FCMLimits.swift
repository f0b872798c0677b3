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

    static func isTopicCharacter(_ c: Unicode.Scalar) -> Bool {
        switch c {
        case "a"..."z", "A"..."Z", "0"..."9", "-", "_", ".", "~", "%": true
        default: false
        }
    }

    /// Why `token` cannot be a registration token (FCM token or installation ID), or nil when it can.
    public static func tokenProblem(_ token: String) -> String? {
        var token = token
        let ok = token.withUTF8 { bytes -> Bool in
            guard !bytes.isEmpty, bytes.count <= 4096 else { return false }
            for byte in bytes {
                switch byte {
                case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
                    UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "_"), UInt8(ascii: ":"),
                    UInt8(ascii: "."):
                    continue
                default: return false
                }
            }
            return true
        }
        if ok { return nil }
        if token.isEmpty { return "a registration token must not be empty" }
        if token.utf8.count > 4096 { return "a registration token has at most 4096 characters" }
        for scalar in token.unicodeScalars {
            switch scalar {
            case "a"..."z", "A"..."Z", "0"..."9", "-", "_", ":", ".": continue
            default:
                return "'\(scalar.escaped(asASCII: true))' cannot appear in a registration token"
            }
        }
        return nil
    }
}
