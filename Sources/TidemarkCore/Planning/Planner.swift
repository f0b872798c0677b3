import Foundation

/// Builds a plan: records what a refresh saw, then diffs the desired state against the result.
public struct Planner: Sendable {
    /// How state is diffed against the desired state.
    public var differ: Differ
    /// The tidemark version recorded in plans.
    public var tidemarkVersion: String

    /// A planner with `differ`.
    public init(differ: Differ = Differ(), tidemarkVersion: String) {
        self.differ = differ
        self.tidemarkVersion = tidemarkVersion
    }

    /// `state` must share its token table with `loaded` (the manifests were resolved into `state.tokens`).
    /// A partial plan (`targets`) diffs only what it covers; `maxUnsubscribes` turns a plan past that
    /// blast radius into an error. With `scope`, only those tokens' topic memberships are diffed (see
    /// `Differ.diff`). `topicRail` is the rail of every topic whose manifests set no
    /// `max_unsubscribes` of its own (`serve`'s default, `UnattendedRail`); nil: none.
    public func plan(
        loaded: LoadedManifests, state: State, refresh: RefreshResult?, backend: BackendIdentity,
        now: Date, targets: Targets = .all, maxUnsubscribes: UnsubscribeLimit? = nil, scope: TokenSet? = nil,
        topicRail: UnattendedRail? = nil
    ) -> Plan {
        var working = state
        let observations = refresh.map { working.recordRefresh($0) } ?? Observations()
        let result = differ.diff(desired: loaded.desired, state: working, targets: targets, scope: scope)
        var diagnostics = loaded.diagnostics.filter { $0.severity != .error } + result.diagnostics
        if !observations.dead.isEmpty {
            let names = observations.dead.prefix(5).map { describe($0, loaded.inventory) }.joined(separator: ", ")
            diagnostics.append(
                .warning(
                    "\(PlanRenderer.counted(observations.dead.count, "token")) \(observations.dead.count == 1 ? "is" : "are") no longer registered in FCM (\(names)\(observations.dead.count > 5 ? ", …" : "")); \(observations.dead.count == 1 ? "it is" : "they are") skipped. Remove them from the inventory or update their tokens."
                ))
        }
        var plan = Plan(
            tidemarkVersion: tidemarkVersion, createdAt: now, lineage: state.lineage, serial: state.serial,
            manifestsDigest: loaded.digest, backend: backend, refreshed: refresh != nil,
            targets: targets.include.map(\.description), operations: result.operations,
            topics: result.topics, groups: result.groups, diagnostics: diagnostics, observations: observations)
        plan.excludes = targets.exclude.map(\.description)
        plan.inventory = InventoryRecord.of(loaded.snapshots)
        let rotations = Self.rotations(plan, state: working, inventory: loaded.inventory)
        plan.rotations = rotations.isEmpty ? nil : rotations
        plan.topics = PlanExplainer(loaded: loaded, state: working, plan: plan).explain()
        let specs = Dictionary(loaded.desired.topics.map { ($0.name, $0) }, uniquingKeysWith: { a, _ in a })
        Self.annotate(&plan, specs: specs, state: working, inventory: loaded.inventory)
        plan.manifestFiles = loaded.filesDigest.isEmpty ? nil : loaded.filesDigest
        plan.optedOut = result.optedOut == 0 ? nil : result.optedOut
        var versions: [String: Int] = [:]
        for op in plan.operations {
            let key = State.versionKey(op.kind.isGroup ? .group : .topic, op.target)
            versions[key] = state.versions[key] ?? 0
        }
        plan.versions = versions
        let meanings = loaded.entryDigests
        // A touched topic no longer declared has no meaning: "" records that.
        plan.desired = Dictionary(uniqueKeysWithValues: versions.keys.map { ($0, meanings[$0] ?? "") })
        if let maxUnsubscribes,
            let violation = maxUnsubscribes.violation(
                unsubscribes: plan.unsubscribeCount - plan.rotatedUnsubscribeCount,
                known: working.observedMembershipCount)
        {
            plan.diagnostics.append(Diagnostic.error(violation).coded("rail.max_unsubscribes"))
        }
        plan.diagnostics += Self.topicRails(plan, specs: specs, unattended: topicRail)
        return plan
    }

    /// Each topic's size before the plan, the removals that are rotations, its protection and its own
    /// rail; and the device each departing token belonged to.
    static func annotate(_ plan: inout Plan, specs: [String: DesiredTopic], state: State, inventory: Inventory) {
        let rotatedFrom = Set((plan.rotations ?? []).map(\.from))
        var rotated: [String: Int] = [:]
        var departed: [String: String] = [:]
        for op in plan.operations where op.kind == .unsubscribe {
            for token in op.tokens {
                if rotatedFrom.contains(token) {
                    rotated[op.target, default: 0] += 1
                } else if departed[token] == nil, inventory.index(ofToken: token) == nil,
                    let id = state.tokens.id(token), let device = state.deviceID(of: id),
                    inventory.index(ofDevice: device) == nil
                {
                    departed[token] = device
                }
            }
        }
        for index in plan.topics.indices {
            let name = plan.topics[index].topic
            let spec = specs[name]
            plan.topics[index].before = state.topics[name]?.observed.count ?? 0
            plan.topics[index].rotated = rotated[name]
            let protected = spec?.protect ?? state.topics[name]?.protect ?? false
            plan.topics[index].protected = protected ? true : nil
            plan.topics[index].maxUnsubscribes = spec?.maxUnsubscribes?.description
        }
        plan.departed =
            departed.isEmpty
            ? nil : departed.sorted { $0.key < $1.key }.map { Departure(device: $0.value, token: $0.key) }
    }

    /// A topic's own `max_unsubscribes`: a plan that takes more from it is refused. A topic that
    /// sets none has the `unattended` rail, when there is one.
    static func topicRails(
        _ plan: Plan, specs: [String: DesiredTopic], unattended: UnattendedRail? = nil
    ) -> [Diagnostic] {
        plan.topics.compactMap { change -> Diagnostic? in
            let before = change.before ?? 0
            let share =
                before > 0
                ? " (\(PlanRenderer.formatShare(Double(change.losses) / Double(before))) of its \(PlanRenderer.counted(before, "known subscriber")))"
                : ""
            if let (limit, allowed) = change.ownRail {
                guard change.losses > allowed else { return nil }
                return .error(
                    "this plan would unsubscribe \(PlanRenderer.counted(change.losses, "device")) from topic '\(change.topic)'\(share), more than its max_unsubscribes \(limit) allows (\(PlanRenderer.formatCount(allowed))); rotated tokens are not counted. Check the manifests and the inventory, or raise max_unsubscribes on the topic if this is intended.",
                    at: specs[change.topic]?.location
                ).coded("rail.max_unsubscribes").about(.topic, change.topic)
            }
            guard change.maxUnsubscribes == nil, let unattended else { return nil }
            let allowed = unattended.allowed(of: before)
            guard change.losses > allowed else { return nil }
            let removed = change.removedFromManifests ? ", which the manifests no longer declare" : ""
            return .error(
                "this plan would unsubscribe \(PlanRenderer.counted(change.losses, "device")) from topic '\(change.topic)'\(removed)\(share), more than \(unattended.describe(allowed: allowed)) without a person; rotated tokens are not counted. A person applies it with 'tidemark apply'; or set max_unsubscribes on the topic (or 'max_unsubscribes: none' in tidemark.yaml) to let serve apply such plans.",
                at: specs[change.topic]?.location
            ).coded("rail.unattended").about(.topic, change.topic)
        }
    }

    /// Tokens the plan removes (or found dead) that state knows as a device's, where the inventory now
    /// lists that device with another token: one rotation each, not an unrelated leave and join.
    static func rotations(_ plan: Plan, state: State, inventory: Inventory) -> [Rotation] {
        var unsubscribes: [String: Int] = [:]
        var subscribes: [String: Int] = [:]
        for op in plan.operations {
            switch op.kind {
            case .unsubscribe, .groupRemove: for token in op.tokens { unsubscribes[token, default: 0] += 1 }
            case .subscribe, .groupAdd, .groupCreate: for token in op.tokens { subscribes[token, default: 0] += 1 }
            case .audienceSet, .audienceDelete, .audienceUnlink, .topicAdopt, .topicRelease, .groupRelease: break
            }
        }
        var candidates = Set(unsubscribes.keys)
        candidates.formUnion(plan.observations.dead)
        var result: [Rotation] = []
        for token in candidates where inventory.index(ofToken: token) == nil {
            guard let id = state.tokens.id(token), let device = state.deviceID(of: id),
                let index = inventory.index(ofDevice: device)
            else { continue }
            let new = inventory.tokens[index]
            guard new != token else { continue }
            result.append(
                Rotation(
                    device: device, from: token, to: new, subscribes: subscribes[new] ?? 0,
                    unsubscribes: unsubscribes[token] ?? 0))
        }
        return result.sorted { $0.device < $1.device }
    }

    private func describe(_ token: String, _ inventory: Inventory) -> String {
        if let index = inventory.index(ofToken: token) { return "device '\(inventory.deviceIDs[index])'" }
        return Redaction.redact(token)
    }
}
