/// Shortens registration tokens for human output: the last five characters and a short hash.
///
/// Enough to tell tokens apart and find one in an inventory, not enough to send to the device.
public enum Redaction {
    public static func redact(_ token: String) -> String {
        var hash: UInt32 = 2_166_136_261
        for byte in token.utf8 {
            hash = (hash ^ UInt32(byte)) &* 16_777_619
        }
        let hex = String(hash, radix: 16)
        let padded = String(repeating: "0", count: max(0, 8 - hex.count)) + hex
        return "…\(token.suffix(5))#\(padded.prefix(6))"
    }
}
