import Foundation

/// A run's phase trace: each marked phase is written with the seconds since the trace began, for
/// finding where a slow plan spends its time. It is bound to a task and its children with `bound(_:)`
/// (the runtime binds one for `TIDEMARK_TRACE_PHASES=1`); unbound, a mark costs one task-local read.
package struct PhaseTrace: Sendable {
    /// The trace of the running task, if one is bound.
    @TaskLocal public static var current: PhaseTrace?

    private let origin: ContinuousClock.Instant
    private let write: @Sendable (String) -> Void

    /// A trace that starts now and writes each line with `write` (standard error by default).
    package init(write: @escaping @Sendable (String) -> Void = { FileHandle.standardError.write(Data($0.utf8)) }) {
        origin = .now
        self.write = write
    }

    /// Runs `body` with this trace bound: the marks made in it and in its child tasks are written.
    package func bound<T>(_ body: () async throws -> T) async rethrows -> T {
        try await Self.$current.withValue(self) { try await body() }
    }

    /// Writes `name` and the time since the trace began, when a trace is bound.
    @inline(__always)
    package static func mark(_ name: @autoclosure () -> String) {
        guard let trace = current else { return }
        let elapsed = ContinuousClock.now - trace.origin
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        trace.write("[phase \(String(format: "%7.3f", seconds)) s] \(name())\n")
    }
}
