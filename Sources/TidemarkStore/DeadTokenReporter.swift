import Foundation
import PostgresNIO
import TidemarkCore

/// Reports dead tokens back to the source that listed them (`on_dead` in tidemark.yaml), in batches:
/// an SQL statement run once per token (`$1`) in one transaction per batch, or a program fed NDJSON on
/// stdin once per batch. Both must be idempotent (marking a row inactive twice changes nothing): a
/// batch is reported again by the next apply when the source still lists its devices.
public struct DeadTokenReporter: Sendable {
    /// The source's name, for messages.
    public var sourceName: String
    /// The statement or program to report to.
    public var hook: DeadTokenHook
    /// The database URL (from the source's `url_env`) for an SQL hook.
    var url: String?
    var urlEnv: String
    /// Where a program runs (the project directory), and how long one batch may take.
    public var directory: String?
    /// How long one batch may take, in seconds.
    public var timeout: Double
    /// Devices per batch.
    public var batchSize = 500

    /// A reporter for `sourceName`'s `hook`; `url` for an SQL hook.
    public init(
        sourceName: String, hook: DeadTokenHook, url: String? = nil, urlEnv: String = "the URL",
        directory: String? = nil, timeout: Double = ConfiguredSource.defaultTimeout
    ) {
        self.sourceName = sourceName
        self.hook = hook
        self.url = url
        self.urlEnv = urlEnv
        self.directory = directory
        self.timeout = timeout
    }

    /// Reports every device; returns how many were reported (for SQL, also the rows the statement changed).
    public func report(
        _ devices: [DeadDevice], at time: Date
    ) async throws -> (reported: Int, rowsChanged: Int?) {
        guard !devices.isEmpty else { return (0, nil) }
        switch hook {
        case .sql(let statement): return try await reportSQL(statement, devices)
        case .exec(let command): return (try await reportExec(command, devices, at: time), nil)
        }
    }

    private func reportSQL(_ statement: String, _ devices: [DeadDevice]) async throws -> (Int, Int?) {
        let (connection, parsed) = try await PostgresURL.connect(
            url, urlEnv: urlEnv, what: "on_dead of '\(sourceName)'", id: 2, logger: PostgresInventorySource.logger)
        var reported = 0
        var changed = 0
        do {
            for start in stride(from: 0, to: devices.count, by: batchSize) {
                let batch = Array(devices[start..<min(start + batchSize, devices.count)])
                // Each batch is one transaction within the URL's timeout: a server that stops answering
                // ends the hook with its cause instead of hanging the command.
                changed += try await PostgresURL.bounded(connection, parsed.timeout) {
                    var changed = 0
                    try await connection.query("BEGIN", logger: PostgresInventorySource.logger).collect()
                    for device in batch {
                        var bindings = PostgresBindings()
                        bindings.append(device.token)
                        // The callback form reports the command tag: how many rows the statement changed.
                        let metadata = try await connection.query(
                            PostgresQuery(unsafeSQL: statement, binds: bindings), logger: PostgresInventorySource.logger
                        ) { _ in }.get()
                        changed += metadata.rows ?? 0
                    }
                    try await connection.query("COMMIT", logger: PostgresInventorySource.logger).collect()
                    return changed
                }
                reported += batch.count
            }
            try await connection.close()
        } catch {
            _ = try? await connection.query("ROLLBACK", logger: PostgresInventorySource.logger).collect()
            try? await connection.close()
            throw InventorySourceError(
                "on_dead of '\(sourceName)' failed after \(reported) of \(devices.count) tokens: \(PostgresURL.explain(error)); the next apply reports the rest again"
            )
        }
        return (reported, changed)
    }

    private func reportExec(_ command: [String], _ devices: [DeadDevice], at time: Date) async throws -> Int {
        var reported = 0
        for start in stride(from: 0, to: devices.count, by: batchSize) {
            let batch = devices[start..<min(start + batchSize, devices.count)]
            let input = try DeadTokenLine.ndjson(batch, reportedAt: time)
            let runner = ProcessRunner(command: command, directory: directory, timeout: timeout, maxOutput: 1 << 20)
            let result = try await runner.run(stdin: input)
            guard result.status == 0 else {
                throw InventorySourceError(
                    "on_dead of '\(sourceName)': '\(runner.display)' exited with status \(result.status) after \(reported) of \(devices.count) tokens\(result.stderr.isEmpty ? "" : "; its stderr ended with: \(ProcessRunner.oneLine(result.stderr))"); the next apply reports the rest again"
                )
            }
            reported += batch.count
        }
        return reported
    }
}
