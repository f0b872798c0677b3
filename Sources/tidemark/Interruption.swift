import Dispatch
import Foundation
import Synchronization

/// Turns SIGINT and SIGTERM into cancellation of the work in flight, so an apply stops between
/// operations with everything finished journaled, instead of dying mid-write.
final class Interruption: Sendable {
    private let received = Mutex<Int32?>(nil)

    /// The signal that arrived, if one did.
    var signal: Int32? { received.withLock { $0 } }

    /// The exit code for the signal, as shells report it (130 for SIGINT, 143 for SIGTERM).
    var exitCode: Int32? { signal.map { 128 + $0 } }

    /// Runs `body` in a task that the first SIGINT or SIGTERM cancels.
    func run<T: Sendable>(_ body: @escaping @Sendable () async throws -> T) async throws -> T {
        let task = Task { try await body() }
        let queue = DispatchQueue(label: "tidemark.signals")
        var made: [any DispatchSourceSignal] = []
        for number in [SIGINT, SIGTERM] {
            Foundation.signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number, queue: queue)
            source.setEventHandler { [self] in
                let first = self.received.withLock { current -> Bool in
                    guard current == nil else { return false }
                    current = number
                    return true
                }
                if first {
                    FileHandle.standardError.write(
                        Data(
                            "\nStopping: the operations in flight finish or are abandoned, and the journal is written. (Again to stop at once.)\n"
                                .utf8))
                    task.cancel()
                } else {
                    // A second signal: at a prompt, or impatient. Everything finished is journaled already.
                    exit(128 + number)
                }
            }
            source.resume()
            made.append(source)
        }
        defer {
            for source in made { source.cancel() }
            for number in [SIGINT, SIGTERM] { Foundation.signal(number, SIG_DFL) }
        }
        return try await task.value
    }
}

extension Interruption {
    /// For a command that changes nothing (plan, drift): the first SIGINT or SIGTERM ends the process
    /// at once with the shell's code (130, 143), saying why and that nothing was changed, instead of a
    /// silent exit. Kept for as long as the returned sources live.
    static func endAtOnce(_ what: String) -> [any DispatchSourceSignal] {
        let queue = DispatchQueue(label: "tidemark.signals")
        return [SIGINT, SIGTERM].map { number in
            Foundation.signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number, queue: queue)
            source.setEventHandler {
                FileHandle.standardError.write(
                    Data("\nInterrupted by \(number == SIGINT ? "SIGINT" : "SIGTERM"): \(what)\n".utf8))
                exit(128 + number)
            }
            source.resume()
            return source
        }
    }
}
