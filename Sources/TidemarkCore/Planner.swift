import Foundation

/// Builds a plan: records what a refresh saw, then diffs the desired state against the result.
public struct Planner: Sendable {
    public var differ: Differ
    public var tidemarkVersion: String

    public init(differ: Differ = Differ(), tidemarkVersion: String) {
        self.differ = differ
        self.tidemarkVersion = tidemarkVersion
    }

    /// `state` must share its token table with `loaded` (the manifests were resolved into `state.tokens`).
    public func plan(loaded: LoadedManifests, state: State, refresh: RefreshResult?, backend: BackendIdentity,
        now: Date) -> Plan
    {
        var working = state
        working.growToTable()
        var observations = Observations()
        if let refresh {
            observations = working.observations(from: refresh)
            working.apply(observations, seen: refresh.refreshed)
        }
        let result = differ.diff(desired: loaded.desired, state: working)
        var diagnostics = loaded.diagnostics.filter { $0.severity != .error } + result.diagnostics
        if !observations.dead.isEmpty {
            let names = observations.dead.prefix(5).map { describe($0, loaded.inventory) }.joined(separator: ", ")
            diagnostics.append(.warning("\(observations.dead.count) token(s) are no longer registered in FCM (\(names)\(observations.dead.count > 5 ? ", …" : "")); they are skipped. Remove them from the inventory or update their tokens."))
        }
        return Plan(tidemarkVersion: tidemarkVersion, createdAt: now, lineage: state.lineage, serial: state.serial,
            manifestsDigest: loaded.digest, backend: backend, refreshed: refresh != nil, operations: result.operations,
            topics: result.topics, groups: result.groups, diagnostics: diagnostics, observations: observations)
    }

    private func describe(_ token: String, _ inventory: Inventory) -> String {
        if let index = inventory.index(ofToken: token) { return "device '\(inventory.deviceIDs[index])'" }
        return Redaction.redact(token)
    }
}
