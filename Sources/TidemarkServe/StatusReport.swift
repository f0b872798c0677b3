import Foundation
import TidemarkCore

/// What `tidemark status --format json` prints: each workspace as its state store records it (owner,
/// replicas, requests) with the status its owner published, the same `WorkspaceStatus` that `/status`
/// serves.
public struct StatusReport: Sendable, Codable, Equatable {
    /// One workspace.
    public struct Workspace: Sendable, Codable, Equatable {
        /// Its name.
        public var workspace: String
        /// Its state, as shown (never a password).
        public var state: String
        /// Whether `tidemark suspend` stopped it.
        public var suspended: Bool
        /// Who suspended or resumed it last, and when.
        public var suspendedBy: String?
        /// The replica whose claim is live (null: none).
        public var owner: String?
        /// The replicas whose presence is live, the owner among them.
        public var replicas: [String]
        /// When `tidemark reconcile` last asked for a reconcile.
        public var reconcileRequestedAt: Date?
        /// When the owner last published its status.
        public var statusAt: Date?
        /// The status the owner last published (null: none yet, or one this version cannot read).
        public var status: WorkspaceStatus?

        /// The workspace `record` describes, its state shown as `state`, as it is at `now`.
        public init(record: ServeRecord, state: String, now: Date) {
            workspace = record.workspace
            self.state = state
            suspended = record.suspended
            suspendedBy = record.suspendedBy
            owner = record.liveOwner(at: now)
            replicas = record.liveReplicas(at: now)
            reconcileRequestedAt = record.reconcileRequestedAt
            statusAt = record.statusAt
            status = record.publishedStatus
        }

        enum CodingKeys: String, CodingKey {
            case workspace, state, suspended, suspendedBy, owner, replicas, reconcileRequestedAt, statusAt, status
        }

        /// Written with `owner` and `status` present when null: a reader tells "none" from "not said".
        public func encode(to encoder: any Encoder) throws {
            var container = encoder.container(keyedBy: CodingKeys.self)
            try container.encode(workspace, forKey: .workspace)
            try container.encode(state, forKey: .state)
            try container.encode(suspended, forKey: .suspended)
            try container.encodeIfPresent(suspendedBy, forKey: .suspendedBy)
            try container.encode(owner, forKey: .owner)
            try container.encode(replicas, forKey: .replicas)
            try container.encodeIfPresent(reconcileRequestedAt, forKey: .reconcileRequestedAt)
            try container.encodeIfPresent(statusAt, forKey: .statusAt)
            try container.encode(status, forKey: .status)
        }
    }

    /// The workspaces, in the order asked.
    public var workspaces: [Workspace]

    /// A report of `workspaces`.
    public init(workspaces: [Workspace]) { self.workspaces = workspaces }

    /// The JSON `tidemark status --format json` prints (`WorkspaceStatus.encoder`'s form).
    public func json() throws -> String {
        String(decoding: try WorkspaceStatus.encoder.encode(self), as: UTF8.self)
    }
}
