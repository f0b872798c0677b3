import Foundation
import Testing

/// Golden files: rendered output compared with a file kept beside the tests, re-recorded only when
/// `TIDEMARK_RECORD_GOLDEN=1` is set (never silently).
public enum Golden {
    /// Whether `TIDEMARK_RECORD_GOLDEN=1` asks for golden files to be written rather than compared.
    public static var recording: Bool { ProcessInfo.processInfo.environment["TIDEMARK_RECORD_GOLDEN"] == "1" }

    /// Compares `actual` with `directory/name`; records it instead when recording.
    public static func check(
        _ actual: String, _ name: String, in directory: URL,
        sourceLocation: SourceLocation = #_sourceLocation
    ) {
        let url = directory.appendingPathComponent(name)
        if recording {
            do {
                try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
                try Data(actual.utf8).write(to: url)
            } catch {
                Issue.record("could not record \(url.path): \(error)", sourceLocation: sourceLocation)
            }
            return
        }
        guard let data = FileManager.default.contents(atPath: url.path) else {
            Issue.record(
                "no golden file \(url.path); record it with TIDEMARK_RECORD_GOLDEN=1 and review it.",
                sourceLocation: sourceLocation)
            return
        }
        let expected = String(decoding: data, as: UTF8.self)
        guard expected != actual else { return }
        let want = expected.components(separatedBy: "\n")
        let got = actual.components(separatedBy: "\n")
        let line = (0..<min(want.count, got.count)).first { want[$0] != got[$0] } ?? min(want.count, got.count)
        Issue.record(
            """
            \(name) differs from its golden file at line \(line + 1):
              expected: \(line < want.count ? want[line] : "(end of file)")
              actual:   \(line < got.count ? got[line] : "(end of output)")
            If the change is intended, re-record with TIDEMARK_RECORD_GOLDEN=1 and review the diff.
            """, sourceLocation: sourceLocation)
    }
}
