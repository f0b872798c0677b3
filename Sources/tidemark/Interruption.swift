import Foundation
import Logging
import ServiceLifecycle
import Synchronization
import UnixSignals

/// SIGINT and SIGTERM for a command that changes things (apply): the first starts a graceful shutdown
/// of the command, run as a swift-service-lifecycle service, so the apply stops its requests and the
/// steps that finished are journaled before it ends (`ApplyWorkflow.run`); a second ends the process
/// at once.
final class Interruption: Sendable {
    private let received = Mutex<UnixSignal?>(nil)
    private let group = Mutex<ServiceGroup?>(nil)

    /// The signal that arrived, if one did.
    var signal: UnixSignal? { received.withLock { $0 } }

    /// The exit code for the signal, as shells report it (130 for SIGINT, 143 for SIGTERM).
    var exitCode: Int32? { signal.map { 128 + $0.rawValue } }

    /// Runs `body` as a service of a service group, beside a service that watches for the signals.
    func run<T: Sendable>(_ body: @escaping @Sendable () async throws -> T) async throws -> T {
        let outcome = Mutex<Result<T, any Error>?>(nil)
        let command = Command {
            let result: Result<T, any Error>
            do { result = .success(try await body()) } catch { result = .failure(error) }
            outcome.withLock { $0 = result }
        }
        let watcher = Watcher(owner: self, signals: await UnixSignalsSequence(trapping: .sigint, .sigterm))
        // Services stop in reverse order: the command first, while the watcher still hears a second signal.
        let services = ServiceGroup(
            configuration: ServiceGroupConfiguration(
                services: [
                    .init(service: watcher),
                    .init(
                        service: command, successTerminationBehavior: .gracefullyShutdownGroup,
                        failureTerminationBehavior: .gracefullyShutdownGroup),
                ],
                logger: Logger(label: "tidemark", factory: { _ in SwiftLogNoOpLogHandler() })))
        group.withLock { $0 = services }
        try await services.run()
        guard let result = outcome.withLock({ $0 }) else { throw CancellationError() }
        return try result.get()
    }

    /// The first signal: remembered, said, and the command told to stop; true when it is the first.
    fileprivate func first(_ signal: UnixSignal) async -> Bool {
        let first = received.withLock { current -> Bool in
            guard current == nil else { return false }
            current = signal
            return true
        }
        guard first else { return false }
        FileHandle.standardError.write(
            Data(
                "\nStopping: the operations in flight finish or are abandoned, and the journal is written. (Again to stop at once.)\n"
                    .utf8))
        await group.withLock { $0 }?.triggerGracefulShutdown()
        return true
    }

    private struct Command: Service {
        let body: @Sendable () async -> Void
        func run() async { await body() }
    }

    /// Hears SIGINT and SIGTERM until the command has stopped.
    private struct Watcher: Service {
        let owner: Interruption
        let signals: UnixSignalsSequence

        func run() async {
            await cancelWhenGracefulShutdown {
                for await signal in signals {
                    if await owner.first(signal) { continue }
                    // A second signal: at a prompt, or impatient. Everything finished is journaled already.
                    exit(128 + signal.rawValue)
                }
            }
        }
    }
}

extension Interruption {
    /// For a command that changes nothing (plan, drift): the first SIGINT or SIGTERM ends the process at
    /// once with the shell's code (130, 143), saying why and that nothing was changed, instead of a
    /// silent exit. `body` runs beside the task that listens, which ends with it.
    static func endingAtOnce<T: Sendable>(_ what: String, _ body: () async throws -> T) async throws -> T {
        let signals = await UnixSignalsSequence(trapping: .sigint, .sigterm)
        return try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                for await signal in signals {
                    FileHandle.standardError.write(
                        Data("\nInterrupted by \(signal == .sigint ? "SIGINT" : "SIGTERM"): \(what)\n".utf8))
                    exit(128 + signal.rawValue)
                }
            }
            defer { group.cancelAll() }
            return try await body()
        }
    }
}
