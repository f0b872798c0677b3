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
    /// Paths are shown as given.
    public func displayPath(_ path: String) -> String { path }

    /// The bytes of a file, however large.
    public func read(_ path: String) throws -> Data { try read(path, atMost: .max, setting: nil) }

    /// Only the directory's own entries: a source without subdirectories.
    public func listFiles(_ directory: String) throws -> [String] { try list(directory) }
}

/// Files held in memory, keyed by path.
public struct InMemoryFileSource: FileSource {
    /// The files' bytes, by path.
    public var files: [String: Data]

    /// Files with the given text, by path.
    public init(_ files: [String: String]) {
        self.files = files.mapValues { Data($0.utf8) }
    }

    /// The file's bytes; a missing file or one past `limit` is refused.
    public func read(_ path: String, atMost limit: Int, setting: String?) throws -> Data {
        guard let data = files[path] else { throw FileSourceError.notFound(path) }
        guard data.count <= limit else { throw InputFile.tooLarge(data.count, limit, setting) }
        return data
    }

    /// The names directly in `directory` ("" or "." for the top).
    public func list(_ directory: String) throws -> [String] {
        let prefix = directory.isEmpty || directory == "." ? "" : directory + "/"
        return files.keys.compactMap { key in
            guard key.hasPrefix(prefix) else { return nil }
            let rest = key.dropFirst(prefix.count)
            return rest.contains("/") ? nil : String(rest)
        }
    }

    /// Every file below `directory`, hidden ones skipped.
    public func listFiles(_ directory: String) throws -> [String] {
        let prefix = directory.isEmpty || directory == "." ? "" : directory + "/"
        return files.keys.filter { $0.hasPrefix(prefix) }.map { String($0.dropFirst(prefix.count)) }
            .filter { !$0.split(separator: "/").contains { $0.hasPrefix(".") } }
    }
}

/// A file an in-memory source does not hold.
public struct FileSourceError: TidemarkError {
    /// The path asked for.
    public var path: String

    /// A missing `path`.
    public static func notFound(_ path: String) -> Self { Self(path: path) }

    /// `input_not_found`, as a missing file on disk.
    public var reason: FailureReason { "input_not_found" }
    /// "no such file: PATH".
    public var description: String { "no such file: \(path)" }
}
