import Foundation

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// An exclusive lock on a state file, held with `flock` on `STATE.lock`.
///
/// The kernel drops the lock when the process ends, even on SIGKILL, so a killed apply never
/// leaves a stale lock; the file tells a second run who holds it and since when.
public final class StateLock: Sendable {
    public let path: String
    private let descriptor: Int32

    private init(path: String, descriptor: Int32) {
        self.path = path
        self.descriptor = descriptor
    }

    /// Takes the lock at once or throws `.locked` naming the holder.
    public static func acquire(statePath: String, operation: String, now: Date = Date()) throws -> StateLock {
        let path = statePath + ".lock"
        let fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            throw StateStoreError(.io, path: statePath, "cannot open the lock file \(path): \(String(cString: strerror(errno)))")
        }
        if flock(fd, LOCK_EX | LOCK_NB) != 0 {
            let holder = (try? String(contentsOfFile: path, encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines)
            close(fd)
            throw StateStoreError(.locked, path: statePath, holder.flatMap { $0.isEmpty ? nil : $0 } ?? "another process")
        }
        let formatter = ISO8601DateFormatter()
        let user = ProcessInfo.processInfo.environment["USER"] ?? String(getuid())
        let info = "\(operation) (pid \(getpid()), user \(user) on \(ProcessInfo.processInfo.hostName)) since \(formatter.string(from: now))\n"
        _ = ftruncate(fd, 0)
        _ = info.withCString { pwrite(fd, $0, strlen($0), 0) }
        return StateLock(path: path, descriptor: fd)
    }

    deinit {
        _ = ftruncate(descriptor, 0)
        flock(descriptor, LOCK_UN)
        close(descriptor)
    }
}
