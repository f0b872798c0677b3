import Foundation

/// Which FCM a plan was made against.
public struct BackendIdentity: Sendable, Codable, Equatable, CustomStringConvertible {
    /// The embedded engine, the emulator or the real FCM.
    public var kind: BackendKind
    /// The Firebase project id.
    public var project: String

    /// The backend `kind` serving `project`.
    public init(kind: BackendKind, project: String) {
        self.kind = kind
        self.project = project
    }

    /// As messages and plans show it: `fcm (project my-app)`.
    public var description: String { "\(kind.rawValue) (project \(project))" }
}
