import Foundation
import TidemarkCore

/// The real disk, rooted at the manifests directory.
struct DiskFileSource: FileSource {
    let root: String
    /// How the root is shown in messages (as the user named it).
    let displayRoot: String

    func resolve(_ path: String) -> String {
        if path.hasPrefix("/") { return path }
        return path == "." ? root : (root as NSString).appendingPathComponent(path)
    }

    func read(_ path: String, atMost limit: Int, setting: String?) throws -> Data {
        try InputFile.read(resolve(path), atMost: limit, setting: setting)
    }

    func list(_ directory: String) throws -> [String] {
        try FileManager.default.contentsOfDirectory(atPath: resolve(directory))
    }

    func listFiles(_ directory: String) throws -> [String] {
        let base = resolve(directory)
        _ = try FileManager.default.contentsOfDirectory(atPath: base)  // a missing directory is an error
        guard
            let walker = FileManager.default.enumerator(
                at: URL(fileURLWithPath: base), includingPropertiesForKeys: [.isRegularFileKey],
                options: [.skipsHiddenFiles])
        else { return [] }
        var files: [String] = []
        let root = URL(fileURLWithPath: base).standardizedFileURL.path
        for case let url as URL in walker
        where (try? url.resourceValues(forKeys: [.isRegularFileKey]))?.isRegularFile == true {
            let path = url.standardizedFileURL.path
            guard path.hasPrefix(root + "/") else { continue }
            files.append(String(path.dropFirst(root.count + 1)))
        }
        return files
    }

    func displayPath(_ path: String) -> String {
        if path.hasPrefix("/") { return path }
        if path == "." { return displayRoot }
        return displayRoot == "." ? path : (displayRoot as NSString).appendingPathComponent(path)
    }
}

/// Writes a file so that readers see the old or the new content, never a mix: a temporary file,
/// flushed to disk, then renamed over the target.
func writeAtomically(_ data: Data, to path: String, mode: Int = 0o644) throws {
    let temporary = path + ".tmp-\(ProcessInfo.processInfo.processIdentifier)"
    let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode_t(mode))
    guard fd >= 0 else {
        throw CLIError(
            "cannot write \(path): \(String(cString: strerror(errno))); check that its directory exists and is writable."
        )
    }
    let written = data.withUnsafeBytes { buffer -> Bool in
        var offset = 0
        while offset < buffer.count {
            let n = write(fd, buffer.baseAddress! + offset, buffer.count - offset)
            if n < 0 {
                if errno == EINTR { continue }
                return false
            }
            offset += n
        }
        return true
    }
    let synced = written && fsync(fd) == 0
    let failure = String(cString: strerror(errno))
    close(fd)
    guard synced else {
        unlink(temporary)
        throw CLIError("cannot write \(path): \(failure).")
    }
    if rename(temporary, path) != 0 {
        unlink(temporary)
        throw CLIError("cannot write \(path): \(String(cString: strerror(errno))).")
    }
}

/// A failure worth one clear line to the user.
struct CLIError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}
