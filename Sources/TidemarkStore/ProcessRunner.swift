import Foundation
import Synchronization
import TidemarkCore

#if canImport(Glibc)
import Glibc
#endif

/// Runs a program without a shell (`/usr/bin/env` finds it on PATH), feeding it stdin, reading its
/// stdout up to a limit, keeping the end of its stderr for messages, and stopping it after a timeout
/// (SIGTERM, then SIGKILL 5 seconds later).
public struct ProcessRunner: Sendable {
    /// The program and its arguments; no shell.
    public var command: [String]
    /// Where it runs; nil: the current directory.
    public var directory: String?
    /// How long it may run, in seconds.
    public var timeout: Double
    /// The most stdout bytes kept; past it the program is stopped and the run refused.
    public var maxOutput: Int

    /// A runner of `command`.
    public init(command: [String], directory: String? = nil, timeout: Double, maxOutput: Int = 8 << 30) {
        self.command = command
        self.directory = directory
        self.timeout = timeout
        self.maxOutput = maxOutput
    }

    /// How the program ended, and what it printed.
    public struct Result: Sendable {
        /// Its exit status.
        public var status: Int32
        /// What it printed on stdout.
        public var stdout: Data
        /// The last lines of stderr (at most 4 KiB).
        public var stderr: String
    }

    /// The command as messages show it (arguments only, never the environment).
    public var display: String { command.joined(separator: " ") }

    /// Runs the program to its end; throws when it cannot start, outlives the timeout or prints too much.
    ///
    /// Spawned with posix_spawn and an empty signal mask: the threads of a Swift process block most
    /// signals, and a child that inherited that mask could not be stopped by SIGTERM.
    public func run(stdin: Data? = nil) async throws -> Result {
        var outPipe: [Int32] = [0, 0]
        var errPipe: [Int32] = [0, 0]
        var inPipe: [Int32] = [0, 0]
        // pipe2 with O_CLOEXEC, atomically: a program spawned by another thread meanwhile must not
        // inherit these ends (it would hold the pipe open, and this read would never see its end).
        func cloexecPipe(_ fds: inout [Int32]) -> Bool {
            fds.withUnsafeMutableBufferPointer { systemPipe2($0.baseAddress!, O_CLOEXEC) } == 0
        }
        guard cloexecPipe(&outPipe), cloexecPipe(&errPipe), cloexecPipe(&inPipe) else {
            throw InventorySourceError("cannot run '\(display)': no pipes (\(String(cString: strerror(errno))))")
        }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        if stdin != nil {
            posix_spawn_file_actions_adddup2(&actions, inPipe[0], 0)
        } else {
            posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        }
        posix_spawn_file_actions_adddup2(&actions, outPipe[1], 1)
        posix_spawn_file_actions_adddup2(&actions, errPipe[1], 2)
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var empty = sigset_t()
        sigemptyset(&empty)
        var all = sigset_t()
        sigfillset(&all)
        posix_spawnattr_setsigmask(&attributes, &empty)
        posix_spawnattr_setsigdefault(&attributes, &all)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
        // env finds the program on PATH; `-C` (GNU env) starts it in the project directory.
        let argv = (["/usr/bin/env"] + (directory.map { ["-C", $0] } ?? []) + command).map { strdup($0) } + [nil]
        defer { for arg in argv { free(arg) } }
        var pid: pid_t = 0
        let spawned = posix_spawn(&pid, "/usr/bin/env", &actions, &attributes, argv, environ)
        close(outPipe[1])
        close(errPipe[1])
        close(inPipe[0])
        guard spawned == 0 else {
            close(outPipe[0])
            close(errPipe[0])
            close(inPipe[1])
            throw InventorySourceError("cannot run '\(display)': \(String(cString: strerror(spawned)))")
        }
        let outputLimit = maxOutput
        // Reading starts now, on threads of their own: a program that fills its pipe must never wait for
        // the task pool (which tests, or a busy tidemark, can keep occupied).
        let stdoutData = PipeDrain(outPipe[0], limit: outputLimit)
        let stderrData = PipeDrain(errPipe[0], limit: 1 << 20)
        let inputFD = inPipe[1]
        if let stdin {
            // Written off the caller's thread: a program that does not read stdin must not block tidemark.
            Thread.detachNewThread {
                stdin.withUnsafeBytes { buffer in
                    var offset = 0
                    while offset < buffer.count {
                        let n = write(inputFD, buffer.baseAddress! + offset, buffer.count - offset)
                        if n < 0, errno == EINTR { continue }
                        if n <= 0 { break }
                        offset += n
                    }
                }
                close(inputFD)
            }
        } else {
            close(inputFD)
        }
        let exited = AsyncExit()
        let child = pid
        let ended = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            var status: Int32 = 0
            while waitpid(child, &status, 0) < 0, errno == EINTR {}
            // Exit status, or 128 + signal as shells report it.
            let code = (status & 0x7f) == 0 ? (status >> 8) & 0xff : 128 + (status & 0x7f)
            ended.signal()
            exited.finish(code)
        }
        // The watchdog is a thread of its own: a busy task pool must not delay the stop.
        let limit = timeout
        Thread.detachNewThread {
            guard ended.wait(timeout: .now() + limit) == .timedOut else { return }
            exited.timedOut()
            kill(child, SIGTERM)
            if ended.wait(timeout: .now() + 5) == .timedOut { kill(child, SIGKILL) }
        }
        let status = await exited.wait()
        // The program's exit ends the read: what it wrote is in the pipes already, and a process it left
        // behind (a daemon, a grandchild that kept stdout) is given a moment to close them, not for ever.
        stdoutData.finish(within: Self.afterExit)
        stderrData.finish(within: Self.afterExit)
        let (output, overflow) = await stdoutData.value()
        let (errors, _) = await stderrData.value()
        let tail = String(decoding: errors.suffix(4096), as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        if exited.didTimeOut {
            throw InventorySourceError(
                "'\(display)' did not finish within \(Self.seconds(timeout)) and was stopped; raise 'timeout' in tidemark.yaml or make it faster\(tail.isEmpty ? "" : ". Its stderr ended with: \(Self.oneLine(tail))")",
                kind: .timedOut)
        }
        if overflow {
            throw InventorySourceError(
                "'\(display)' printed more than \(outputLimit) bytes (limits.inventory_bytes in tidemark.yaml)")
        }
        return Result(status: status, stdout: output, stderr: tail)
    }

    /// How long the pipes are read after the program exits, for a process it left holding them.
    static let afterExit: Duration = .seconds(2)

    /// stderr as one line for a message.
    public static func oneLine(_ text: String) -> String {
        let lines = text.split(whereSeparator: \.isNewline).map { $0.trimmingCharacters(in: .whitespaces) }
        return lines.suffix(5).joined(separator: " | ")
    }

    static func seconds(_ value: Double) -> String {
        value == value.rounded() ? "\(Int(value))s" : String(format: "%.1fs", value)
    }

}

/// glibc's pipe2, which Glibc's module map hides behind _GNU_SOURCE.
@_silgen_name("pipe2")
private func systemPipe2(_ fds: UnsafeMutablePointer<Int32>, _ flags: Int32) -> Int32

/// A value a thread produces once and a task awaits: the bridge from the threads that read pipes
/// and reap the child (blocking calls kept off the cooperative pool) to async code, which works
/// however busy the task pool is.
final class OneShot<Value: Sendable>: Sendable {
    private struct Fields {
        var result: Value?
        var waiter: CheckedContinuation<Value, Never>?
    }

    private let fields = Mutex(Fields())

    func fulfil(_ value: Value) {
        let waiter = fields.withLock { fields in
            fields.result = value
            defer { fields.waiter = nil }
            return fields.waiter
        }
        waiter?.resume(returning: value)
    }

    func value() async -> Value {
        await withCheckedContinuation { continuation in
            let ready = fields.withLock { fields -> Value? in
                if let result = fields.result { return result }
                fields.waiter = continuation
                return nil
            }
            if let ready { continuation.resume(returning: ready) }
        }
    }
}

/// Reads a pipe to its end on a thread started at once, then closes it; past `limit` bytes it keeps
/// reading (so the program is not blocked) but drops the rest and says so. `finish(within:)` bounds
/// the read once the program has exited: a process it left behind may hold the pipe open for ever.
final class PipeDrain: Sendable {
    private let read = OneShot<(Data, Bool)>()
    /// When to stop waiting for the end of the pipe (set once the program exited).
    private let deadline = StopTime()

    final class StopTime: Sendable {
        let at = Mutex<ContinuousClock.Instant?>(nil)
    }

    init(_ fd: Int32, limit: Int) {
        let result = read
        let deadline = deadline
        Thread.detachNewThread {
            var data = Data()
            var overflow = false
            var buffer = [UInt8](repeating: 0, count: 1 << 16)
            var poller = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            while true {
                // Wait for bytes in short steps, so a deadline set meanwhile is seen.
                // Past the deadline the pipe holds at most what the program wrote before it exited (a
                // pipe's buffer), read by then; anything still coming is a leftover process's.
                if let end = deadline.at.withLock({ $0 }), ContinuousClock.now >= end { break }
                let ready = poll(&poller, 1, 100)
                if ready < 0, errno == EINTR { continue }
                if ready == 0 { continue }
                let n = buffer.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
                if n < 0, errno == EINTR || errno == EAGAIN { continue }
                if n <= 0 { break }
                if data.count + n > limit {
                    overflow = true
                } else {
                    data.append(contentsOf: buffer[0..<n])
                }
            }
            close(fd)
            result.fulfil((data, overflow))
        }
    }

    /// Stops reading `grace` from now (the program exited), even if the pipe is still open.
    func finish(within grace: Duration) {
        deadline.at.withLock { $0 = .now + grace }
    }

    func value() async -> (Data, Bool) { await read.value() }
}

/// The exit of a process, awaited once, and whether the watchdog stopped it.
final class AsyncExit: Sendable {
    private let status = OneShot<Int32>()
    private let timed = Mutex(false)

    func finish(_ value: Int32) { status.fulfil(value) }
    func timedOut() { timed.withLock { $0 = true } }
    var didTimeOut: Bool { timed.withLock { $0 } }
    func wait() async -> Int32 { await status.value() }
}
