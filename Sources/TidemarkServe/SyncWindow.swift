import Foundation
import TidemarkCore

/// Whether a workspace's sync windows let changes through at a moment: the machine decides it when it
/// starts a reconcile (and wakes at the opening when changes wait for it); the reconcile only plans
/// while they are closed.
public enum SyncWindow: Sendable, Equatable {
    /// Changes may be applied (no windows, or an allow window open and no deny window).
    case open
    /// Changes wait; `opensAt`: when the windows next let them through (nil: not within the search).
    case closed(opensAt: Date?)

    /// The state `windows` are in at `date`.
    public init(_ windows: [ServeWindow], at date: Date) {
        if windows.isEmpty || ServeWindow.allowChanges(windows, at: date) {
            self = .open
        } else {
            self = .closed(opensAt: ServeWindow.nextAllowed(windows, after: date))
        }
    }

    /// Whether changes may be applied.
    public var isOpen: Bool { self == .open }
}
