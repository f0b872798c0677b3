import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Runs the built `tidemark` binary in a scratch project, as a user would.
struct CLIRunner {
    struct Result {
        var status: Int32
        var stdout: String
        var stderr: String
    }

    static let repositoryRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    static var binary: URL {
        if let path = ProcessInfo.processInfo.environment["TIDEMARK_BIN"] { return URL(fileURLWithPath: path) }
        var directory = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
        for _ in 0..<4 {
            let candidate = directory.appendingPathComponent("tidemark")
            if FileManager.default.isExecutableFile(atPath: candidate.path) { return candidate }
            directory = directory.deletingLastPathComponent()
        }
        return repositoryRoot.appendingPathComponent(".build/debug/tidemark")
    }

    let project: URL

    /// A new project directory; with `demo`, a copy of the repository's demo manifests.
    init(demo: Bool = false) throws {
        project = FileManager.default.temporaryDirectory.appendingPathComponent("tm-cli-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: project, withIntermediateDirectories: true)
        if demo {
            try FileManager.default.copyItem(
                at: Self.repositoryRoot.appendingPathComponent("manifests"),
                to: project.appendingPathComponent("manifests"))
        } else {
            try FileManager.default.createDirectory(
                at: project.appendingPathComponent("manifests"), withIntermediateDirectories: true)
        }
    }

    func write(_ path: String, _ text: String) throws {
        let url = project.appendingPathComponent(path)
        try FileManager.default.createDirectory(at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
        try text.write(to: url, atomically: true, encoding: .utf8)
    }

    func remove() { try? FileManager.default.removeItem(at: project) }

    /// Starts tidemark (or `executable`) in the project with `arguments`.
    func start(
        _ arguments: [String], environment: [String: String] = [:], executable: String? = nil
    ) throws -> (Process, Pipe, Pipe) {
        let process = Process()
        process.executableURL = executable.map { URL(fileURLWithPath: $0) } ?? Self.binary
        process.arguments = arguments
        process.currentDirectoryURL = project
        var env = ProcessInfo.processInfo.environment
        // The suite may run on a Google Cloud machine: credentials come only from what a test gives.
        env["NO_GCE_CHECK"] = "True"
        for (key, value) in environment { env[key] = value }
        process.environment = env
        let out = Pipe()
        let err = Pipe()
        process.standardOutput = out
        process.standardError = err
        process.standardInput = FileHandle.nullDevice
        try process.run()
        return (process, out, err)
    }

    @discardableResult
    func run(_ arguments: [String], environment: [String: String] = [:], executable: String? = nil) throws -> Result {
        let (process, out, err) = try start(arguments, environment: environment, executable: executable)
        // Both pipes are drained at once: reading one to its end first would deadlock once the
        // process filled the other's buffer.
        let stderrData = Mutex(Data())
        let stderrDone = DispatchSemaphore(value: 0)
        let drain = Thread {
            stderrData.withLock { $0 = err.fileHandleForReading.readAll() }
            stderrDone.signal()
        }
        drain.start()
        let stdout = out.fileHandleForReading.readAll()
        stderrDone.wait()
        let stderr = stderrData.withLock { $0 }
        process.waitUntilExit()
        return Result(
            status: process.terminationStatus, stdout: String(decoding: stdout, as: UTF8.self),
            stderr: String(decoding: stderr, as: UTF8.self))
    }
}

extension FileHandle {
    /// Everything left to read, to the end: `readDataToEndOfFile` traps when a read is interrupted by
    /// a signal (EINTR), which a test process that starts servers and children does receive; this
    /// reads again instead.
    func readAll() -> Data {
        var data = Data()
        var buffer = [UInt8](repeating: 0, count: 65_536)
        while true {
            let count = buffer.withUnsafeMutableBytes { Glibc.read(fileDescriptor, $0.baseAddress, $0.count) }
            if count > 0 {
                data.append(contentsOf: buffer[0..<count])
            } else if count == 0 || errno != EINTR {
                return data
            }
        }
    }
}
