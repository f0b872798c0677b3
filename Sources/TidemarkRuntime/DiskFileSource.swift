import Foundation
import TidemarkCore

/// The real disk, rooted at the manifests directory.
public struct DiskFileSource: FileSource {
    /// The manifests directory, absolute.
    public let root: String
    /// How the root is shown in messages (as the user named it).
    public let displayRoot: String
    /// Where files may be read from (the project directory); nil reads anywhere (`fmt` of named files).
    package var confinement: InputFile.Confinement?

    /// The disk under `root`, shown as `displayRoot`, read only within `confinement` when given.
    package init(root: String, displayRoot: String, confinement: InputFile.Confinement? = nil) {
        self.root = root
        self.displayRoot = displayRoot
        self.confinement = confinement
    }

    /// `path` under the root (an absolute path stays as it is).
    public func resolve(_ path: String) -> String {
        if path.hasPrefix("/") { return path }
        return path == "." ? root : (root as NSString).appendingPathComponent(path)
    }

    /// The file at `path`, at most `limit` bytes, within the confinement when one is set.
    public func read(_ path: String, atMost limit: Int, setting: String?) throws -> Data {
        try InputFile.read(resolve(path), atMost: limit, setting: setting, within: confinement)
    }

    /// The names in `directory`.
    public func list(_ directory: String) throws -> [String] {
        try FileManager.default.contentsOfDirectory(atPath: resolve(directory))
    }

    /// Every file under `directory`, as paths relative to it; hidden entries skipped.
    public func listFiles(_ directory: String) throws -> [String] {
        let base = resolve(directory)
        _ = try FileManager.default.contentsOfDirectory(atPath: base)  // a missing directory is an error
        guard
            let walker = FileManager.default.enumerator(
                at: URL(fileURLWithPath: base), includingPropertiesForKeys: [.isRegularFileKey],
                options: [.skipsHiddenFiles])
        else { return [] }
        var files: [String] = []
        let root = URL(fileURLWithPath: base).standardizedFileURL.path
        // Every entry but a directory: a symlink or a FIFO among the manifests is named and refused when
        // read, never skipped in silence.
        for case let url as URL in walker
        where (try? url.resourceValues(forKeys: [.isDirectoryKey]))?.isDirectory != true {
            let path = url.standardizedFileURL.path
            guard path.hasPrefix(root + "/") else { continue }
            files.append(String(path.dropFirst(root.count + 1)))
        }
        return files
    }

    /// `path` as the user named the manifests directory.
    public func displayPath(_ path: String) -> String {
        if path.hasPrefix("/") { return path }
        if path == "." { return displayRoot }
        return displayRoot == "." ? path : (displayRoot as NSString).appendingPathComponent(path)
    }
}
