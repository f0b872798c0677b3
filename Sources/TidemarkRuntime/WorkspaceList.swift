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

extension Runtime {
    /// Every workspace of the state's file or database, by name, with its size, its last apply and
    /// who holds its lock; reads state only.
    public func workspaceSummaries() async throws -> [WorkspaceSummary] {
        var names = try await stateStore().workspaces()
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
