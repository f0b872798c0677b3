import Foundation

/// Read-only file access for the pure core; the CLI passes the real disk, tests an in-memory twin.
public protocol FileSource: Sendable {
    /// The bytes of a file, by path relative to the manifests directory or absolute; a file larger
    /// than `limit` is refused (`setting` names the limit in tidemark.yaml, for the message).
    func read(_ path: String, atMost limit: Int, setting: String?) throws -> Data
    /// The names of the entries of a directory (not recursive).
    func list(_ directory: String) throws -> [String]
    /// How to show `path` to a person (for example with the manifests directory in front).
    func displayPath(_ path: String) -> String
    /// Every file below a directory, subdirectories included, as paths relative to it (hidden entries skipped).
    func listFiles(_ directory: String) throws -> [String]
}

extension FileSource {
    public func displayPath(_ path: String) -> String { path }

    /// The bytes of a file, however large.
    public func read(_ path: String) throws -> Data { try read(path, atMost: .max, setting: nil) }

    public func listFiles(_ directory: String) throws -> [String] { try list(directory) }
}

/// Files held in memory, keyed by path.
public struct InMemoryFileSource: FileSource {
    public var files: [String: Data]

    public init(_ files: [String: String]) {
        self.files = files.mapValues { Data($0.utf8) }
    }

    public func read(_ path: String, atMost limit: Int, setting: String?) throws -> Data {
        guard let data = files[path] else { throw FileSourceError.notFound(path) }
        guard data.count <= limit else { throw InputFile.tooLarge(data.count, limit, setting) }
        return data
    }

    public func list(_ directory: String) throws -> [String] {
        let prefix = directory.isEmpty || directory == "." ? "" : directory + "/"
        return files.keys.compactMap { key in
            guard key.hasPrefix(prefix) else { return nil }
            let rest = key.dropFirst(prefix.count)
            return rest.contains("/") ? nil : String(rest)
        }
    }

    public func listFiles(_ directory: String) throws -> [String] {
        let prefix = directory.isEmpty || directory == "." ? "" : directory + "/"
        return files.keys.filter { $0.hasPrefix(prefix) }.map { String($0.dropFirst(prefix.count)) }
            .filter { !$0.split(separator: "/").contains { $0.hasPrefix(".") } }
    }
}

public enum FileSourceError: Error, CustomStringConvertible {
    case notFound(String)

    public var description: String {
        switch self {
        case .notFound(let path): "no such file: \(path)"
        }
    }
}
