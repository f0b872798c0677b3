import Foundation
import Synchronization
import TidemarkCore
import TidemarkRuntime

/// Where output goes, and whether a person is watching.
enum Terminal {
    static var stdoutIsTerminal: Bool { isatty(STDOUT_FILENO) == 1 }
    static var stdinIsTerminal: Bool { isatty(STDIN_FILENO) == 1 }
    static var stderrIsTerminal: Bool { isatty(STDERR_FILENO) == 1 }

    /// The columns plans are wrapped to: the terminal's width (`COLUMNS`, else the window's, else
    /// 80) when standard output is a terminal; nil (no wrapping) for pipes, files and CI logs.
    static var width: Int? {
        guard stdoutIsTerminal else { return nil }
        if let columns = ProcessEnvironment.terminal.columns, columns >= 40 { return columns }
        var size = winsize()
        if ioctl(STDOUT_FILENO, UInt(TIOCGWINSZ), &size) == 0, size.ws_col >= 40 { return Int(size.ws_col) }
        return 80
    }

    /// Colour on a terminal, unless `NO_COLOR` is set (no-color.org) or `TERM` is dumb.
    static var colour: Bool {
        stdoutIsTerminal && !ProcessEnvironment.terminal.colourOff
    }

    /// A rendered plan or report with ANSI colour: the verdict bold, joins green, leaves and errors
    /// red, destructive changes and warnings yellow.
    static func coloured(_ text: String) -> String {
        let (bold, red, green, yellow, reset) = ("\u{1B}[1m", "\u{1B}[31m", "\u{1B}[32m", "\u{1B}[33m", "\u{1B}[0m")
        var first = true
        return text.split(separator: "\n", omittingEmptySubsequences: false).map { raw -> String in
            let line = String(raw)
            // The verdict is the first paragraph, however many lines it wraps to.
            if line.isEmpty {
                first = false
                return line
            }
            if first || line.hasPrefix("Error:") || line.hasPrefix("error:") {
                return (line.hasPrefix("Error") || line.hasPrefix("error") ? bold + red : bold) + line + reset
            }
            let body = line.drop { $0 == " " }
            if line.hasPrefix("  ! ") || line.hasPrefix("warning:") || line.contains(": warning:") {
                return yellow + line + reset
            }
            if line.hasPrefix("      ") {
                if body.hasPrefix("+ ") { return green + line + reset }
                if body.hasPrefix("− ") || body.hasPrefix("- ") { return red + line + reset }
            }
            if line.hasPrefix("  + ") || line.hasPrefix("  ~ ") || line.hasPrefix("  - ") { return bold + line + reset }
            return line
        }.joined(separator: "\n")
    }

    static func out(_ text: String) {
        FileHandle.standardOutput.write(Data(text.utf8))
    }

    /// Writes to standard output, reporting a failed write (a full disk, a closed pipe) as an error.
    static func write(_ text: String) throws { try write(Data(text.utf8)) }

    static func write(_ data: Data) throws {
        do {
            try FileHandle.standardOutput.write(contentsOf: data)
        } catch {
            throw CLIError(
                "could not write to standard output (\(error.localizedDescription)); the output is incomplete.")
        }
    }

    /// Writes `value` as pretty JSON (snake_case keys, ISO 8601 dates, as plan files are) and a newline.
    static func writeJSON(_ value: some Encodable) throws { try write(jsonFile(value)) }

    static func err(_ text: String) {
        FileHandle.standardError.write(Data((text.hasSuffix("\n") ? text : text + "\n").utf8))
    }

    /// Asks on the terminal; only "yes" proceeds, as with Terraform.
    static func confirm(_ question: String) -> Bool {
        err(question)
        FileHandle.standardError.write(Data("  Only 'yes' will be accepted: ".utf8))
        return readLine()?.trimmingCharacters(in: .whitespaces) == "yes"
    }
}

/// `value` as the JSON tidemark writes to files and standard output, with a final newline.
func jsonFile(_ value: some Encodable) throws -> Data {
    var data = try Plan.encoder().encode(value)
    data.append(UInt8(ascii: "\n"))
    return data
}

/// Progress of long work: a redrawn line on a terminal, a plain line every few seconds otherwise.
final class ProgressReporter: Sendable {
    private let label: String
    private let interactive: Bool
    private let timing: Timing
    private let start: Duration
    private let lastPrint = Mutex<Duration?>(nil)

    init(label: String, interactive: Bool = Terminal.stderrIsTerminal, timing: Timing = .live) {
        self.label = label
        self.interactive = interactive
        self.timing = timing
        start = timing.now()
    }

    func update(done: Int, total: Int, unit: String) {
        let now = timing.now()
        let due = lastPrint.withLock { last -> Bool in
            let interval: Duration = interactive ? .milliseconds(100) : .seconds(5)
            guard done == total || last.map({ now - $0 >= interval }) ?? true else { return false }
            last = now
            return true
        }
        guard due, total > 0 else { return }
        let elapsed = max(0.001, Timing.seconds(now - start))
        let rate = Double(done) / elapsed
        let eta = rate > 0 ? Double(total - done) / rate : 0
        let percent = Int(Double(done) * 100 / Double(total))
        let text =
            "\(label): \(PlanRenderer.formatCount(done))/\(PlanRenderer.formatCount(total)) \(unit) (\(percent)%), \(PlanRenderer.formatCount(Int(rate)))/s, ETA \(Int(eta.rounded()))s"
        if interactive {
            let width = 24
            let filled = total == 0 ? width : width * done / total
            let bar = String(repeating: "█", count: filled) + String(repeating: "░", count: width - filled)
            FileHandle.standardError.write(Data("\r\u{1B}[K\(bar) \(text)\(done == total ? "\n" : "")".utf8))
        } else {
            Terminal.err(text)
        }
    }
}

/// Renders workflow events for a person: diagnostics and notices on standard error, progress as a
/// bar on a terminal and as a line every few seconds otherwise.
final class TerminalOutput: WorkflowOutput {
    /// A retry's line: the call, the cause, the attempt and when the next one goes, how long it may
    /// go on, and the setting to check if it does not mend.
    static func describe(_ notice: RetryNotice) -> String {
        let left = max(0, Int((notice.budget - notice.waited).rounded()))
        let others =
            notice.othersRetried > 0
            ? " (\(PlanRenderer.counted(notice.othersRetried, "other retry", plural: "other retries")) since the last notice)"
            : ""
        return
            "Retrying \(notice.call) (\(notice.cause)): attempt \(notice.attempt + 1) in \(Int(notice.nextIn.rounded(.up))) s; \(Int(notice.waited.rounded())) s spent, giving up in \(left) s\(others). If this does not mend, check \(notice.setting)."
    }

    /// Ends a progress bar drawn on the terminal, so a notice starts on a line of its own.
    private func clearProgressLine() {
        if Terminal.stderrIsTerminal { FileHandle.standardError.write(Data("\r\u{1B}[K".utf8)) }
    }

    /// Made at the first progress event of each kind, so rates count from when the work began.
    private let reporters = Mutex<[String: ProgressReporter]>([:])

    private func reporter(_ label: String) -> ProgressReporter {
        reporters.withLock { reporters in
            if let existing = reporters[label] { return existing }
            let made = ProgressReporter(label: label)
            reporters[label] = made
            return made
        }
    }

    func emit(_ event: WorkflowEvent) {
        switch event {
        case .diagnostics(let diagnostics):
            for diagnostic in diagnostics { Terminal.err(diagnostic.description) }
        case .refreshProgress(let done, let total):
            reporter("Refreshing").update(done: done, total: total, unit: "tokens")
        case .refreshed(let registrations, let seconds):
            // A plan may read twice (a sample's slice first): the next read's rate counts from its own start.
            _ = reporters.withLock { $0.removeValue(forKey: "Refreshing") }
            Terminal.err(
                "Refreshed \(PlanRenderer.formatCount(registrations)) registrations in \(String(format: "%.1f", seconds)) s (\(PlanRenderer.formatCount(Int(Double(registrations) / max(seconds, 0.001))))/s)."
            )
        case .applyProgress(let progress):
            reporter("Applying").update(done: progress.tokensDone, total: progress.tokensTotal, unit: "tokens")
        case .resuming(let startedAt, let done, let total):
            Terminal.err(
                "Resuming the apply started at \(ISO8601DateFormatter().string(from: startedAt)) that was interrupted: \(done) of \(total) operations were done; running the \(total - done) remaining."
            )
        case .savedPlanChecked(let registrations, let readAgain, let age):
            let count = PlanRenderer.formatCount(registrations)
            let made = age.map { " (made \($0) s ago)" } ?? ""
            Terminal.err(
                readAgain == 0
                    ? "Checked the saved plan\(made): state and the manifests call for every change it makes to its \(count) registration\(registrations == 1 ? "" : "s"), so none was read again."
                    : "Checked the saved plan\(made): of its \(count) registration\(registrations == 1 ? "" : "s"), \(PlanRenderer.formatCount(readAgain)) with changes that rest on what its refresh read were read again."
            )
        case .abandoned(let startedAt):
            Terminal.err(
                "An apply started at \(ISO8601DateFormatter().string(from: startedAt)) was interrupted, and the manifests or backend changed since; it is abandoned and a new plan is made from the current state."
            )
        case .retrying(let notice):
            clearProgressLine()
            Terminal.err(Self.describe(notice))
        case .answeringAgain(let seconds):
            clearProgressLine()
            Terminal.err("Answers came back, \(Int(seconds.rounded())) s after the retries began; going on.")
        }
    }
}

/// Writes a file atomically (see `AtomicFile.write`).
func writeAtomically(_ data: Data, to path: String, mode: Int = 0o644) throws {
    try AtomicFile.write(data, to: path, mode: mode)
}

/// A failure worth one clear line to the user.
struct CLIError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}
