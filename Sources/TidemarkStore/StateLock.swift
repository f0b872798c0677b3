import Foundation
import Synchronization
import TidemarkCore

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// An exclusive lock on a state file, held with `flock` on `STATE.lock`.
///
/// The kernel drops the lock when the process ends, even on SIGKILL, so a killed apply never
/// leaves a stale lock; the file tells a second run who holds it and since when.
final class StateLock: StateLease {
    let path: String
    private let descriptor: Int32
    private let held = Mutex(true)

    private init(path: String, descriptor: Int32) {
        self.path = path
        self.descriptor = descriptor
    }

    private static func openLockFile(_ statePath: String, location: String) throws -> (String, Int32) {
        let path = statePath + ".lock"
        let directory = (path as NSString).deletingLastPathComponent
        if !directory.isEmpty {
            try? FileManager.default.createDirectory(
                atPath: directory, withIntermediateDirectories: true,
                attributes: [.posixPermissions: 0o700])
        }
        let fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            throw StateStoreError(
                .io, path: location, "cannot open the lock file \(path): \(String(cString: strerror(errno)))")
        }
        return (path, fd)
    }

    /// Takes the lock at once or throws `.locked` naming the holder.
    static func acquire(statePath: String, location: String, holder: LockHolder) throws -> StateLock {
        let (path, fd) = try openLockFile(statePath, location: location)
        if flock(fd, LOCK_EX | LOCK_NB) != 0 {
            let current = readHolder(path)
            close(fd)
            throw StateStoreError(.locked, path: location, current?.description ?? "another process", holder: current)
        }
        var data = (try? JSONEncoder.lockHolder.encode(holder)) ?? Data()
        data.append(UInt8(ascii: "\n"))
        _ = ftruncate(fd, 0)
        _ = data.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, 0) }
        return StateLock(path: path, descriptor: fd)
    }

    /// Who holds the lock, or nil when it is free (tested by trying to take it).
    static func holder(statePath: String, location: String) throws -> LockHolder? {
        guard FileManager.default.fileExists(atPath: statePath + ".lock") else { return nil }
        let (path, fd) = try openLockFile(statePath, location: location)
        defer { close(fd) }
        if flock(fd, LOCK_EX | LOCK_NB) == 0 {
            flock(fd, LOCK_UN)
            return nil
        }
        return readHolder(path)
            ?? LockHolder(
                operation: "another process", user: "?", host: "?", pid: 0,
                since: Date(timeIntervalSince1970: 0))
    }

    private static func readHolder(_ path: String) -> LockHolder? {
        guard let data = FileManager.default.contents(atPath: path) else { return nil }
        return try? JSONDecoder.lockHolder.decode(LockHolder.self, from: data)
    }

    func release() async { unlock() }

    private func unlock() {
        let wasHeld = held.withLock { held in
            defer { held = false }
            return held
        }
        guard wasHeld else { return }
        _ = ftruncate(descriptor, 0)
        flock(descriptor, LOCK_UN)
    }

    deinit {
        unlock()
        close(descriptor)
    }
}

extension JSONEncoder {
    static var lockHolder: JSONEncoder {
        let encoder = JSONEncoder()
        encoder.dateEncodingStrategy = .iso8601
        encoder.outputFormatting = .sortedKeys
        return encoder
    }
}

extension JSONDecoder {
    static var lockHolder: JSONDecoder {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        return decoder
    }
}
