import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// Why a file could not be written.
public struct AtomicWriteError: TidemarkError {
    /// `write_failed`.
    public var reason: FailureReason { "write_failed" }

    /// What failed, naming the file.
    public var description: String
}

/// Writes files so that readers see the old or the new content, never a mix, and so that no
/// temporary copy (which may hold full registration tokens or a private key) outlives a write.
public enum AtomicFile {
    /// Writes `data` to a temporary file created with `mode` from the start (never wider), flushes
    /// it, and renames it over `path`. Temporary files of earlier writes to `path` by processes that
    /// no longer run (killed mid-write) are removed first; on any error the temporary file is removed.
    public static func write(_ data: Data, to path: String, mode: Int = 0o644) throws {
        removeStaleTemporaries(of: path)
        let temporary = path + ".tmp-\(getpid())"
        unlink(temporary)
        let fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode_t(mode))
        guard fd >= 0 else {
            throw AtomicWriteError(
                description:
                    "cannot write \(path): \(String(cString: strerror(errno))); check that its directory exists and is writable."
            )
        }
        // The umask may have narrowed the mode; it never widens it.
        let written = data.withUnsafeBytes { buffer -> Bool in
            var offset = 0
            while offset < buffer.count {
                let n = Glibc.write(fd, buffer.baseAddress! + offset, buffer.count - offset)
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
            throw AtomicWriteError(description: "cannot write \(path): \(failure).")
        }
        if rename(temporary, path) != 0 {
            let failure = String(cString: strerror(errno))
            unlink(temporary)
            throw AtomicWriteError(description: "cannot write \(path): \(failure).")
        }
    }

    /// Removes `path.tmp-PID` files whose process is gone.
    public static func removeStaleTemporaries(of path: String) {
        let directory = (path as NSString).deletingLastPathComponent
        let prefix = (path as NSString).lastPathComponent + ".tmp-"
        guard
            let names = try? FileManager.default.contentsOfDirectory(
                atPath: directory.isEmpty ? "." : directory)
        else { return }
        for name in names where name.hasPrefix(prefix) {
            guard let pid = Int32(name.dropFirst(prefix.count)), pid > 0, pid != getpid() else { continue }
            // kill(pid, 0) fails with ESRCH when no such process runs.
            if kill(pid, 0) != 0, errno == ESRCH {
                unlink(directory.isEmpty ? name : (directory as NSString).appendingPathComponent(name))
            }
        }
    }
}
