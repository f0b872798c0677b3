import Crypto
import Foundation

enum SHA256Hex {
    static func digest(_ data: some DataProtocol) -> String {
        SHA256.hash(data: data).map { String(format: "%02x", $0) }.joined()
    }
}
