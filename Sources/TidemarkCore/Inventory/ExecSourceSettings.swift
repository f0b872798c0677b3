import Foundation
import Yams

/// `exec:` in an `inventory:` item: a program that prints devices on its standard output, run without
/// a shell in the project directory.
public struct ExecSourceSettings: SourceSettings, Equatable {
    /// The key that declares the kind.
    public static let key = "exec"
    /// The keys of its mapping.
    static let keys = ["command", "format", "timeout", "interval"]
    /// The longest a command may run (`exec.timeout`) when not said.
    public static let defaultTimeout = 300.0

    /// The program and its arguments.
    public var command: [String]
    /// What it prints.
    public var format: InventoryFormat
    /// Seconds after which it is stopped.
    public var timeout: Double
    /// `exec.interval`: how often `serve` runs the command between reconciles to see whether what it
    /// prints changed (a change starts a reconcile at once); nil: it is run by reconciles only.
    public var interval: Duration?

    /// Settings running `command`.
    public init(
        command: [String], format: InventoryFormat = .jsonl, timeout: Double = defaultTimeout,
        interval: Duration? = nil
    ) {
        self.command = command
        self.format = format
        self.timeout = timeout
        self.interval = interval
    }

    /// `exec`.
    public var key: String { Self.key }
    /// `exec SCRIPT`: the script rather than its interpreter, so [python3, scripts/devices.py] is
    /// "exec devices.py".
    public var defaultName: String {
        "exec \(((command.last { $0.contains("/") } ?? command[0]) as NSString).lastPathComponent)"
    }

    static func decode(_ node: Node, _ doc: inout YAMLDocument) -> ExecSourceSettings? {
        guard let fields = doc.mapping(node, "'exec'", allowed: keys) else { return nil }
        var command: [String]?
        var format = InventoryFormat.jsonl
        var timeout = defaultTimeout
        var interval: Duration?
        for (field, _, value) in fields {
            switch field {
            case "command":
                guard case .sequence = value else {
                    doc.error(
                        "'exec.command' must be a list of words such as [python3, scripts/devices.py]; tidemark runs no shell.",
                        value)
                    continue
                }
                command = doc.strings(value, "'exec.command'")?.map(\.0)
            case "format":
                let text = doc.string(value, "'exec.format'") ?? ""
                if let known = InventoryFormat(rawValue: text) {
                    format = known
                } else {
                    doc.error("unknown format '\(text)'; use \(InventoryFormat.choices).", value)
                }
            case "interval":
                let text = doc.string(value, "'exec.interval'") ?? ""
                if let seconds = Quantities.seconds(text) {
                    interval = .seconds(seconds)
                } else {
                    doc.error(
                        "'exec.interval' must be a duration such as 30s or 5m (how often serve runs the command to see whether it changed), not '\(text)'.",
                        value)
                }
            default:
                let text = doc.string(value, "'exec.timeout'") ?? ""
                if let seconds = Quantities.seconds(text) ?? Int64(text) {
                    timeout = Double(seconds)
                } else {
                    doc.error("'exec.timeout' must be a duration such as 60s or 5m, not '\(text)'.", value)
                }
            }
        }
        guard let command, !command.isEmpty else {
            if !doc.diagnostics.hasErrors { doc.error("'exec' needs a 'command' list.", node) }
            return nil
        }
        return ExecSourceSettings(command: command, format: format, timeout: timeout, interval: interval)
    }
}
