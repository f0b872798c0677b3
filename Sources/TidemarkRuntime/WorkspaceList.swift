import Foundation
import TidemarkCore

/// One line of `tidemark workspace list`: a workspace of the state's file or database.
public struct WorkspaceSummary: Sendable, Codable, Equatable {
    /// The workspace's name.
    public var name: String
    /// Whether it is the one this run uses (`--workspace`, `TIDEMARK_WORKSPACE`, tidemark.yaml).
    public var current: Bool
    /// Its serial: how many times state was written.
    public var serial: Int
    /// Registration tokens state knows (alive or not).
    public var tokens: Int
    /// Topics it manages.
    public var topics: Int
    /// Device groups it manages.
    public var groups: Int
    /// Audiences it keeps.
    public var audiences: Int
    /// Memberships it manages: topic members and group or audience members.
    public var memberships: Int
    /// The newest apply: when it started, and how it ended (running, finished, abandoned).
    public var lastApply: ApplyRecord?
    /// Who holds its lock now (nil: free).
    public var lockHolder: LockHolder?
}

/// What `tidemark workspace delete` deleted.
public struct WorkspaceDeletion: Sendable, Equatable {
    /// The workspace.
    public var name: String
    /// Its serial when deleted.
    public var serial: Int
    /// Registration tokens its state knew.
    public var tokens: Int
    /// Memberships it managed (left in FCM as they are).
    public var memberships: Int
}

extension Runtime {
    /// Deletes the workspace `name` of the state's file or database (state, journal, history, `serve`
    /// records) under its lock. Refused while it manages any membership, unless `force`: FCM keeps
    /// them, and no tidemark would clean them up. Sends nothing to FCM.
    public func deleteWorkspace(_ name: String, force: Bool) async throws -> WorkspaceDeletion {
        if let problem = ProjectSettings.workspaceProblem(name) { throw RuntimeError("WORKSPACE \(problem)") }
        var settings = resolved
        settings.workspace = name
        guard let opened = name == resolved.workspace ? stateStore() : registries.stores.open(settings) else {
            throw RuntimeError("the state \(resolved.stateDisplay) is a URL tidemark has no store for.")
        }
        guard let store = opened as? any WorkspaceKeeping else {
            _ = try workspaceKeeping()
            throw RuntimeError("the state \(resolved.stateDisplay) keeps no workspaces to delete.")
        }
        let display = settings.stateDisplay
        return try await store.withLock(lockHolder("tidemark workspace delete")) {
            guard let state = try await store.load() else {
                throw RuntimeError(
                    "there is no workspace '\(name)' in \(resolved.stateDisplay); 'tidemark workspace list' lists them."
                )
            }
            let managed = state.managedMemberships
            if managed > 0, !force {
                let topics = state.topics.values.filter { !$0.managed.isEmpty }.count
                let groups = state.groups.values.filter { !$0.members.isEmpty }.count
                throw RuntimeError(
                    "workspace '\(name)' manages \(PlanRenderer.counted(managed, "membership")) (in \(PlanRenderer.counted(topics, "topic")) and \(PlanRenderer.counted(groups, "group or audience", plural: "groups or audiences"))); deleting it forgets them while FCM keeps them, and no tidemark would clean them up. Remove them from its manifests and apply first (that unsubscribes them), or pass --force to forget them without sending anything to FCM. Nothing was deleted from \(display)."
                )
            }
            try await store.deleteWorkspace()
            return WorkspaceDeletion(
                name: name, serial: state.serial, tokens: state.tokens.count, memberships: managed)
        }
    }

    /// Every workspace of the state's file or database, by name, with its size, its last apply and
    /// who holds its lock; reads state only.
    public func workspaceSummaries() async throws -> [WorkspaceSummary] {
        var names = try await workspaceKeeping().workspaces()
        if !names.contains(resolved.workspace), try await stateStore().load() != nil {
            names.append(resolved.workspace)
        }
        var summaries: [WorkspaceSummary] = []
        for name in names.sorted() {
            var settings = resolved
            settings.workspace = name
            guard let store = name == resolved.workspace ? stateStore() : registries.stores.open(settings),
                let state = try await store.load()
            else { continue }
            let audiences = state.groups.values.filter(\.audience).count
            summaries.append(
                WorkspaceSummary(
                    name: name, current: name == resolved.workspace, serial: state.serial, tokens: state.tokens.count,
                    topics: state.topics.count, groups: state.groups.count - audiences, audiences: audiences,
                    memberships: state.managedMemberships, lastApply: try await store.applies(limit: 1).first,
                    lockHolder: try await store.lockHolder()))
        }
        return summaries
    }
}
