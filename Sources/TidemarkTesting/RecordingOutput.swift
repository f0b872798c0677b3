import Synchronization
import TidemarkCore

/// Keeps every workflow event, for tests that check what a person would have been told.
public final class RecordingOutput: WorkflowOutput {
    private let recorded = Mutex<[WorkflowEvent]>([])

    /// An output that has recorded nothing yet.
    public init() {}

    /// Keeps `event`.
    public func emit(_ event: WorkflowEvent) { recorded.withLock { $0.append(event) } }

    /// Every event so far, in order.
    public var events: [WorkflowEvent] { recorded.withLock { $0 } }

    /// The diagnostics reported, as `file:line:col: severity: message` lines.
    public var diagnostics: [String] {
        events.flatMap { event -> [String] in
            if case .diagnostics(let list) = event { return list.map(\.description) }
            return []
        }
    }
}
