import Foundation
import TidemarkCore

/// Values tests share.
public enum Fixtures {
    /// A well-formed registration token, distinct per `i`.
    public static func token(_ i: Int, prefix: String = "t") -> String {
        "\(prefix)\(i):APA91b" + String(repeating: "x", count: 60)
    }

    /// A backend identity for plans made in tests.
    public static let backend = BackendIdentity(kind: .embedded, project: "tidemark-test")

    /// Manifest files in memory, as a manifest source for workflows.
    public static func manifests(_ files: [String: String]) -> ManifestLoader {
        ManifestLoader(files: InMemoryFileSource(files))
    }
}
