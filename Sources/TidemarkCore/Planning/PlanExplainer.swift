import Foundation

/// Says why each topic's devices join and leave, for the reviewer of a plan: which member entry
/// (selector, device list, tokens, token file) at which manifest line brings devices in; and why
/// others go: the device left the inventory, its token rotated, a selector no longer matches it,
/// it was subscribed outside tidemark, or the topic left the manifests. Also marks mode changes.
struct PlanExplainer {
    let loaded: LoadedManifests
    /// State after the refresh was absorbed, sharing its token table with `loaded`.
    let state: State
    let plan: Plan

    /// Beyond this many leaving tokens in one topic, a selector's mismatch is not looked into per device.
    static let detailLimit = 20_000

    func explain() -> [TopicChange] {
        let topics = Dictionary(loaded.desired.topics.map { ($0.name, $0) }, uniquingKeysWith: { a, _ in a })
        var joins: [String: [UInt32]] = [:]
        var leaves: [String: [UInt32]] = [:]
        for op in plan.operations where op.kind == .subscribe || op.kind == .unsubscribe {
            let ids = op.tokens.compactMap { state.tokens.id($0) }
            if op.kind == .subscribe {
                joins[op.target, default: []] += ids
            } else {
                leaves[op.target, default: []] += ids
            }
        }
        let rotatedTo = Set((plan.rotations ?? []).map(\.to))
        let rotatedFrom = Set((plan.rotations ?? []).map(\.from))
        var changes = plan.topics
        for index in changes.indices {
            let name = changes[index].topic
            let spec = topics[name]
            let current = state.topics[name]
            if let spec, let previous = current?.mode, previous != spec.mode {
                changes[index].previousMode = previous
            }
            var reasons: [ChangeReason] = []
            let added = TokenSet(joins[name] ?? [])
            if !added.isEmpty {
                reasons += joinReasons(added, spec: spec, current: current, rotatedTo: rotatedTo)
            }
            let removed = TokenSet(leaves[name] ?? [])
            if !removed.isEmpty {
                if changes[index].removedFromManifests {
                    reasons.append(
                        ChangeReason(direction: .leave, count: removed.count, why: "topic no longer in the manifests"))
                } else {
                    reasons += leaveReasons(removed, spec: spec, current: current, rotatedFrom: rotatedFrom)
                }
            }
            changes[index].reasons = reasons.isEmpty ? nil : reasons
        }
        // A mode change with no membership change is still a change a reviewer must see.
        let listed = Set(changes.map(\.topic))
        for spec in loaded.desired.topics where !listed.contains(spec.name) {
            guard let previous = state.topics[spec.name]?.mode, previous != spec.mode,
                state.topics[spec.name].map({ !$0.managed.isEmpty || !$0.observed.isEmpty }) == true
            else { continue }
            changes.append(
                TopicChange(
                    topic: spec.name, mode: spec.mode, subscribe: 0, unsubscribe: 0, removedFromManifests: false,
                    notes: [], previousMode: previous))
        }
        return changes.sorted { $0.topic < $1.topic }
    }

    private func joinReasons(
        _ added: TokenSet, spec: DesiredTopic?, current: TopicState?, rotatedTo: Set<String>
    ) -> [ChangeReason] {
        var remaining = added
        var reasons: [ChangeReason] = []
        // Memberships tidemark made that FCM lost: drift put right.
        if let managed = current?.managed {
            let restored = remaining.intersection(managed)
            if !restored.isEmpty {
                reasons.append(
                    ChangeReason(
                        direction: .join, count: restored.count,
                        why: "dropped in FCM outside tidemark; subscribed again"))
                remaining.subtract(restored)
            }
        }
        if !rotatedTo.isEmpty {
            let rotated = TokenSet(remaining.filter { rotatedTo.contains(state.tokens[$0]) })
            if !rotated.isEmpty {
                reasons.append(
                    ChangeReason(
                        direction: .join, count: rotated.count, why: "new token of a device whose token rotated"))
                remaining.subtract(rotated)
            }
        }
        for entry in spec?.entries ?? [] where !remaining.isEmpty {
            let hit = entry.ids.map { remaining.intersection($0) } ?? remaining
            guard !hit.isEmpty else { continue }
            reasons.append(
                ChangeReason(
                    direction: .join, count: hit.count, why: entry.ref.cause, at: entry.ref.location.map { "\($0)" }))
            remaining.subtract(hit)
        }
        if !remaining.isEmpty {
            reasons.append(ChangeReason(direction: .join, count: remaining.count, why: "declared in the manifests"))
        }
        return reasons
    }

    private func leaveReasons(
        _ removed: TokenSet, spec: DesiredTopic?, current: TopicState?, rotatedFrom: Set<String>
    ) -> [ChangeReason] {
        struct Key: Hashable {
            var why: String
            var at: String?
        }
        var counts: [Key: Int] = [:]
        var order: [Key] = []
        func count(_ key: Key) {
            if counts[key] == nil { order.append(key) }
            counts[key, default: 0] += 1
        }
        let inventory = loaded.inventory
        let selectors = (spec?.entries ?? []).compactMap { entry -> ([LabelRequirement], SourceLocation, String)? in
            if case .selector(let requirements, let location) = entry.ref {
                return (requirements, location, entry.ref.cause)
            }
            return nil
        }
        let detailed = removed.count <= Self.detailLimit
        for id in removed {
            let token = state.tokens[id]
            if rotatedFrom.contains(token) {
                count(Key(why: "token rotated: the device has a new one"))
            } else if let spec, spec.mode == .authoritative, current?.managed.contains(id) != true {
                count(Key(why: "subscribed outside tidemark (authoritative topic)"))
            } else if let device = inventory.index(ofToken: token) {
                guard detailed, let (requirements, location, cause) = selectors.first else {
                    count(Key(why: "no longer named by the topic's members"))
                    continue
                }
                // The devices a selector no longer matches: say which label moved.
                let failing = requirements.first { !Self.holds($0, inventory.label($0.key, ofDevice: device)) }
                let label = failing.map { " (\($0.key) does not match)" } ?? ""
                count(Key(why: "no longer matched by \(cause)\(label)", at: "\(location)"))
            } else if state.deviceID(of: id) != nil {
                count(Key(why: "device left the inventory"))
            } else {
                count(Key(why: "no longer listed in the manifests"))
            }
        }
        return order.map { ChangeReason(direction: .leave, count: counts[$0]!, why: $0.why, at: $0.at) }
            .sorted { $0.count > $1.count }
    }

    static func holds(_ requirement: LabelRequirement, _ value: String?) -> Bool {
        switch requirement.op {
        case .equals(let wanted): value == wanted
        case .inSet(let wanted): value.map { wanted.contains($0) } ?? false
        case .notEquals(let unwanted): value != unwanted
        case .notInSet(let unwanted): !(value.map { unwanted.contains($0) } ?? false)
        }
    }
}
