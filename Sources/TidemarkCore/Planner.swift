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
    /// A partial plan (`targets`) diffs only what it covers; `maxUnsubscribes` turns a plan past that
    /// blast radius into an error.
    public func plan(
        loaded: LoadedManifests, state: State, refresh: RefreshResult?, backend: BackendIdentity,
        now: Date, targets: Targets = .all, maxUnsubscribes: UnsubscribeLimit? = nil
    ) -> Plan {
        var working = state
        working.growToTable()
        let observations = refresh.map { working.absorb($0) } ?? Observations()
        let result = differ.diff(desired: loaded.desired, state: working, targets: targets)
        var diagnostics = loaded.diagnostics.filter { $0.severity != .error } + result.diagnostics
        if !observations.dead.isEmpty {
            let names = observations.dead.prefix(5).map { describe($0, loaded.inventory) }.joined(separator: ", ")
            diagnostics.append(
                .warning(
                    "\(observations.dead.count) token(s) are no longer registered in FCM (\(names)\(observations.dead.count > 5 ? ", …" : "")); they are skipped. Remove them from the inventory or update their tokens."
                ))
        }
        var plan = Plan(
            tidemarkVersion: tidemarkVersion, createdAt: now, lineage: state.lineage, serial: state.serial,
            manifestsDigest: loaded.digest, backend: backend, refreshed: refresh != nil,
            targets: targets.include.map(\.description), operations: result.operations,
            topics: result.topics, groups: result.groups, diagnostics: diagnostics, observations: observations)
        plan.excludes = targets.exclude.map(\.description)
        plan.inventory = InventoryRecord.of(loaded.snapshots)
        plan.optedOut = result.optedOut == 0 ? nil : result.optedOut
        var versions: [String: Int] = [:]
        for op in plan.operations {
            let key = State.versionKey(op.kind.isGroup ? .group : .topic, op.target)
            versions[key] = state.versions[key] ?? 0
        }
        plan.versions = versions
        let meanings = loaded.desired.entryDigests(tokens: working.tokens)
        // A touched topic no longer declared has no meaning: "" records that.
        plan.desired = Dictionary(uniqueKeysWithValues: versions.keys.map { ($0, meanings[$0] ?? "") })
        if let maxUnsubscribes,
            let violation = maxUnsubscribes.violation(
                unsubscribes: plan.unsubscribeCount, known: working.observedMembershipCount)
        {
            plan.diagnostics.append(.error(violation))
        }
        return plan
    }

    private func describe(_ token: String, _ inventory: Inventory) -> String {
        if let index = inventory.index(ofToken: token) { return "device '\(inventory.deviceIDs[index])'" }
        return Redaction.redact(token)
    }
}
