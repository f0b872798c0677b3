import Foundation

/// After an apply: the inventory's devices whose token FCM reported dead go to a file (NDJSON, full
/// tokens, private to the user) and to the hook of the source that listed each one, so the app stops
/// sending to them. Every hook is tried; the failures come back in the report, not as a throw, so the
/// caller can say what did get reported.
public struct DeadTokenWriteBack: Sendable {
    /// The sources that may take dead devices back; those without a hook are skipped.
    public var sinks: [any DeadTokenSink]
    /// The clock that stamps each line's `reported_at`.
    public var timing: Timing

    /// A write-back to `sinks`, timed by `timing`.
    public init(sinks: [any DeadTokenSink], timing: Timing) {
        self.sinks = sinks
        self.timing = timing
    }

    /// What was written and reported.
    public struct Report: Sendable {
        /// Dead devices in all.
        public var dead: Int
        /// The file they were written to, when one was named.
        public var file: String?
        /// Per source with a hook and devices of its own: its name, how many were reported, and how
        /// many of its rows changed when the hook could tell.
        public var reported: [(source: String, devices: Int, rowsChanged: Int?)] = []
        /// Why hooks failed, one sentence each; the next apply reports their devices again.
        public var failures: [String] = []
    }

    /// Why the file could not be written.
    public struct FileError: TidemarkError {
        /// `dead_token_file`.
        public var reason: FailureReason { "dead_token_file" }

        /// The file, as named.
        public var path: String
        /// Why it could not be written.
        public var detail: String
        /// "cannot write PATH: DETAIL".
        public var description: String { "cannot write \(path): \(detail)" }
    }

    /// Writes `dead` to `file` (when given, replacing it atomically, mode 0600) and reports each
    /// sink's share to its hook. Throws `FileError` when the file cannot be written, before any hook runs.
    public func run(_ dead: [DeadDevice], file: String?) async throws -> Report {
        let now = timing.wallClock()
        var report = Report(dead: dead.count, file: file)
        if let file {
            do {
                try AtomicFile.write(try DeadTokenLine.ndjson(dead, reportedAt: now), to: file, mode: 0o600)
            } catch {
                throw FileError(path: file, detail: ErrorText.describe(error))
            }
        }
        for sink in sinks where sink.reportsDead {
            let label = ConfiguredSource.display(sink.name)
            let mine = dead.filter { $0.source == label }
            guard !mine.isEmpty else { continue }
            do {
                let (count, changed) = try await sink.reportDead(mine, at: now)
                report.reported.append((sink.name, count, changed))
            } catch {
                report.failures.append(ErrorText.describe(error))
            }
        }
        return report
    }
}
