import Foundation

/// `TIDEMARK_TRACE_PHASES=1`: each marked phase of a run is written to stderr with the seconds since
/// the process's first mark, for finding where a slow plan spends its time. Off (and free) otherwise.
public enum PhaseTrace {
    static let enabled = ProcessInfo.processInfo.environment["TIDEMARK_TRACE_PHASES"] == "1"
    static let origin = ContinuousClock.now

    /// Writes `name` and the time since the first mark, when tracing is on.
    @inline(__always)
    public static func mark(_ name: @autoclosure () -> String) {
        guard enabled else { return }
        let elapsed = ContinuousClock.now - origin
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        FileHandle.standardError.write(Data("[phase \(String(format: "%7.3f", seconds)) s] \(name())\n".utf8))
    }
}
