import TidemarkCore

/// What a front end says when a run fails: the lines to show, each a whole message, and the stable
/// reason an operator can match (`state_locked`, `stale_plan`; `unexpected` for an error tidemark
/// did not throw on purpose). The CLI prints the lines; `serve` keeps the reason and the first line as
/// a workspace's status and sends them in its events.
public struct Failure: Sendable, Equatable {
    /// The kind of failure (`TidemarkError.reason`), or `unexpected`.
    public var reason: FailureReason
    /// The messages, each beginning `error: ` unless it is a diagnostic that names its own file and line.
    public var lines: [String]

    /// The failure `error` stands for.
    public init(_ error: any Error) {
        switch error {
        case let error as DiagnosticsError:
            reason = error.reason
            lines = error.diagnostics.condensed().map(\.description)
        case let error as WorkflowError where error.errorCount != nil:
            // The manifests' diagnostics were reported as the workflow found them; this is the count.
            reason = error.reason
            lines = [error.description]
        case let error as any TidemarkError:
            reason = error.reason
            lines = [Self.line(error.description)]
        default:
            reason = .unexpected
            lines = [Self.line(ErrorText.describe(error))]
        }
    }

    /// A message without its `error: ` prefix (a status or a log line says what it is).
    public static func plain(_ message: String) -> String {
        message.hasPrefix("error: ") ? String(message.dropFirst("error: ".count)) : message
    }

    /// The failure as one message (its lines, joined), without the `error: ` prefix.
    public var plainMessage: String { Self.plain(message) }

    /// The failure as one message (its lines, joined).
    public var message: String { lines.joined(separator: "\n") }

    /// `error: message`, every error the same way: the message's first word in lower case unless it
    /// is a name written in capitals or with digits (`GET`, `FCM_EMULATOR_HOST`, `HTTP`) or it already
    /// says "error:".
    public static func line(_ message: String) -> String {
        if message.hasPrefix("error:") { return message }
        let first = message.prefix { !$0.isWhitespace && $0 != ":" && $0 != "," }
        let isName = first.dropFirst().contains { $0.isUppercase || $0.isNumber || $0 == "_" }
        guard let head = first.first, head.isUppercase, !isName else { return "error: " + message }
        return "error: " + head.lowercased() + message.dropFirst()
    }
}
