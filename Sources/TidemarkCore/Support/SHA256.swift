import Crypto
import Foundation

/// SHA-256 in lower-case hex, over swift-crypto: digests of manifests, inventories and plans.
public struct SHA256Digest: Sendable {
    private var hasher = SHA256()

    /// An empty digest.
    public init() {}

    /// Adds `data`.
    public mutating func update(_ data: some DataProtocol) { hasher.update(data: data) }

    /// Adds `text` as UTF-8.
    public mutating func update(_ text: String) { hasher.update(data: Data(text.utf8)) }

    /// The digest of everything given so far, in hex.
    public func finalize() -> String { Self.hexString(hasher.finalize()) }

    /// The digest of `data`, in hex.
    public static func hex(_ data: some DataProtocol) -> String { hexString(SHA256.hash(data: data)) }

    static func hexString(_ digest: SHA256.Digest) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var bytes: [UInt8] = []
        bytes.reserveCapacity(64)
        for byte in digest {
            bytes.append(digits[Int(byte >> 4)])
            bytes.append(digits[Int(byte & 0x0F)])
        }
        return String(decoding: bytes, as: UTF8.self)
    }
}
