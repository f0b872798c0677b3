import Foundation
import TidemarkCore

/// Values tests share.
public enum Fixtures {
    /// A well-formed registration token, distinct per `i` (also in its last characters, which
    /// redacted output shows).
    public static func token(_ i: Int, prefix: String = "t") -> String {
        "\(prefix)\(i):APA91b" + String(repeating: "x", count: 54) + String(format: "%06d", i)
    }

    /// A backend identity for plans made in tests.
    public static let backend = BackendIdentity(kind: .embedded, project: "tidemark-test")

    /// Manifest files in memory, as a manifest source for workflows.
    public static func manifests(_ files: [String: String]) -> ManifestLoader {
        ManifestLoader(files: InMemoryFileSource(files))
    }
}
