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
            "Retrying \(notice.call) (\(notice.cause)): attempt \(notice.attempt + 1) in \(Int(notice.nextIn.rounded(.up))) s; \(Int(notice.waited.rounded())) s spent, giving up in \(left) s\(others). If this does not mend: \(notice.advice)."
    }

    let progress: ProgressDisplay

    /// An output on standard error; `progress` draws long work.
    init(progress: ProgressDisplay = ProgressDisplay()) { self.progress = progress }

    /// Runs `body` with an output whose progress is redrawn every quarter second while it runs (the
    /// ticker is a child task: it ends with `body`).
    static func during<T>(_ body: (TerminalOutput) async throws -> T) async throws -> T {
        let output = TerminalOutput()
        return try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await output.progress.ticking() }
            defer { group.cancelAll() }
            return try await body(output)
        }
    }

    /// A notice on a line of its own.
    private func say(_ text: String) {
        progress.clearForNotice()
        Terminal.err(text)
    }

    func emit(_ event: WorkflowEvent) {
        switch event {
        case .phaseStarted(let phase): progress.start(phase)
        case .phaseEnded(let phase): progress.end(phase)
        case .diagnostics(let diagnostics):
            progress.clearForNotice()
            for diagnostic in diagnostics.condensed() { Terminal.err(diagnostic.description) }
        case .refreshProgress(let done, let total):
            progress.update(done: done, total: total)
        case .refreshed(let registrations, let seconds):
            say(
                "Refreshed \(PlanRenderer.formatCount(registrations)) registrations in \(String(format: "%.1f", seconds)) s (\(PlanRenderer.formatCount(Int(Double(registrations) / max(seconds, 0.001))))/s)."
            )
        case .applyProgress(let executed):
            progress.update(done: executed.tokensDone, total: executed.tokensTotal)
        case .resuming(let startedAt, let done, let total):
            say(
                "Resuming the apply started at \(ISO8601DateFormatter().string(from: startedAt)) that was interrupted: \(done) of \(total) operations were done; running the \(total - done) remaining."
            )
        case .resumed(let summary):
            say("Finished the interrupted apply: \(ApplyCommand.describe(summary)).")
        case .savedPlanChecked(let registrations, let readAgain, let age):
            let count = PlanRenderer.formatCount(registrations)
            let made = age.map { " (made \($0) s ago)" } ?? ""
            say(
                readAgain == 0
                    ? "Checked the saved plan\(made): state and the manifests call for every change it makes to its \(count) registration\(registrations == 1 ? "" : "s"), so none was read again."
                    : "Checked the saved plan\(made): of its \(count) registration\(registrations == 1 ? "" : "s"), \(PlanRenderer.formatCount(readAgain)) with changes that rest on what its refresh read were read again."
            )
        case .abandoned(let startedAt):
            say(
                "An apply started at \(ISO8601DateFormatter().string(from: startedAt)) was interrupted, and the manifests or backend changed since; it is abandoned and a new plan is made from the current state."
            )
        case .retrying(let notice):
            say(Self.describe(notice))
        case .answeringAgain(let seconds):
            say("Answers came back, \(Int(seconds.rounded())) s after the retries began; going on.")
        }
    }
}

/// Writes a file atomically (see `AtomicFile.write`).
func writeAtomically(_ data: Data, to path: String, mode: Int = 0o644) throws {
    try AtomicFile.write(data, to: path, mode: mode)
}

/// A failure worth one clear line to the user.
struct CLIError: TidemarkError {
    var description: String
    /// `command_line`: the options as given cannot be carried out.
    var reason: FailureReason { "command_line" }
    init(_ description: String) { self.description = description }
}
