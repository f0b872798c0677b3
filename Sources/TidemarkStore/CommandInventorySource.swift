import Foundation
import TidemarkCore

/// Devices printed by a program (`exec: {command: [...], format: jsonl|csv}` in tidemark.yaml), the
/// way kubectl credential plugins and Terraform's external data source work: the door to Firestore,
/// BigQuery or an internal API without tidemark linking their SDKs.
public struct CommandInventorySource: DeadTokenSink {
    /// How messages name the source.
    public var name: String
    /// How the program is run: its words, directory and timeout.
    public var runner: ProcessRunner
    /// What the program prints: JSON lines or CSV.
    public var format: InventoryFormat
    /// Devices left out by `exclude_if`, as of the run.
    public var exclusion: ExclusionFilter?
    /// Where tidemark.yaml declares the source.
    public var declaredAt: SourceLocation?
    /// Whether reading no device at all is acceptable (`allow_empty: true`); otherwise it is an error.
    public var allowEmpty = false
    /// Where dead devices are reported back (`on_dead`): a program run in the command's directory,
    /// within its timeout, or a statement (which needs a database, so is refused for a command source).
    public var onDead: DeadTokenHook?

    /// A source reading what `runner`'s program prints in `format`.
    public init(
        name: String, runner: ProcessRunner, format: InventoryFormat, exclusion: ExclusionFilter? = nil,
        declaredAt: SourceLocation? = nil
    ) {
        self.name = name
        self.runner = runner
        self.format = format
        self.exclusion = exclusion
        self.declaredAt = declaredAt
    }

    /// Whether `on_dead` is set.
    public var reportsDead: Bool { onDead != nil }

    /// Runs the `on_dead` program for `devices`, in batches; nothing without a hook.
    public func reportDead(_ devices: [DeadDevice], at time: Date) async throws -> (reported: Int, rowsChanged: Int?) {
        guard let onDead else { return (0, nil) }
        return try await DeadTokenReporter(
            sourceName: name, hook: onDead, directory: runner.directory, timeout: runner.timeout
        ).report(devices, at: time)
    }

    /// Runs the program and adds what it printed; a digest of its output is the snapshot.
    public func load(into builder: inout InventoryBuilder) async throws -> InventorySnapshot {
        let result = try await runner.run()
        guard result.status == 0 else {
            throw InventorySourceError(
                "'\(runner.display)' exited with status \(result.status)\(result.stderr.isEmpty ? " and printed nothing on stderr" : "; its stderr ended with: \(ProcessRunner.oneLine(result.stderr))")"
            )
        }
        var output = result.stdout
        if Gzip.isCompressed(output) {
            output = try Gzip.decompress(output, atMost: runner.maxOutput, setting: "inventory_bytes")
        }
        if !allowEmpty, output.allSatisfy({ $0 == 0x20 || $0 == 0x0A || $0 == 0x0D || $0 == 0x09 }) {
            throw InventorySourceError.empty("'\(runner.display)' printed no devices (its output was empty)")
        }
        // Output in another encoding (PowerShell writes UTF-16) or binary is named for what it is.
        if let problem = InputFile.notTextProblem(output) {
            throw InventorySourceError("what '\(runner.display)' printed is not devices: \(problem.problem)")
        }
        let file = ConfiguredSource.display(name)
        let before = (builder.inventory.count, builder.excluded, builder.diagnostics.count)
        switch format {
        case .csv:
            FileInventorySource.loadCSV(output, file: file, into: &builder, exclusion: exclusion, rowsAreLines: false)
        case .jsonl:
            FileInventorySource.loadJSONLines(
                output, file: file, into: &builder, exclusion: exclusion, rowsAreLines: false)
        }
        if !allowEmpty, builder.inventory.count == before.0, builder.excluded == before.1,
            builder.diagnostics.count == before.2
        {
            throw InventorySourceError.empty("'\(runner.display)' printed no devices")
        }
        return InventorySnapshot(
            identity: SHA256Digest.hex(output), rows: builder.inventory.count - before.0,
            excluded: builder.excluded - before.1)
    }
}
