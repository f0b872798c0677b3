import Foundation

/// Tokens state can forget, so that it does not grow forever: dead tokens and tokens no longer
/// declared that hold no membership tidemark manages, unseen for a retention.
public struct PruneSelection: Sendable, Equatable {
    /// Tokens FCM reported dead that the manifests and inventory no longer declare.
    public var dead: [UInt32] = []
    /// Tokens that left the inventory, live or unknown, with no membership tidemark manages (it
    /// unsubscribed them already) and no device-group membership.
    public var departed: [UInt32] = []

    /// Nothing to forget.
    public init() {}

    /// Tokens to forget, dead and departed.
    public var count: Int { dead.count + departed.count }
    /// Whether there is nothing to forget.
    public var isEmpty: Bool { count == 0 }
}

extension State {
    /// What `prune` would forget: tokens not in `declared` (the inventory and the manifests' own
    /// tokens) that left it at least `retention` seconds ago (as an apply noted), and either dead (and
    /// not seen alive since) or holding no membership tidemark manages: a token with managed
    /// memberships is kept until an apply unsubscribed it.
    public func prunable(declared: TokenSet, now: Int64, retention: Int64) -> PruneSelection {
        let held = TokenSet.union(of: topics.values.map(\.managed) + groups.values.map(\.members))
        let cutoff = now - retention
        var selection = PruneSelection()
        for index in 0..<tokens.count {
            let id = UInt32(index)
            if declared.contains(id) { continue }
            let left = leftAt[index]
            guard left != 0, left <= cutoff else { continue }
            if seenAt[index] > cutoff, dead.contains(id) { continue }
            if dead.contains(id) {
                selection.dead.append(id)
            } else if !held.contains(id) {
                selection.departed.append(id)
            }
        }
        return selection
    }

    /// This state without the selected tokens: the token table is rebuilt densely (ids renumbered in
    /// order) and every set remapped; memberships of removed tokens are dropped.
    public func removing(_ selection: PruneSelection) -> State {
        let removed = TokenSet(selection.dead + selection.departed)
        var map = [UInt32](repeating: .max, count: tokens.count)
        var kept: [String] = []
        var seen: [Int64] = []
        var devices: [String] = []
        var left: [Int64] = []
        for index in 0..<tokens.count where !removed.contains(UInt32(index)) {
            map[index] = UInt32(kept.count)
            kept.append(tokens[UInt32(index)])
            seen.append(seenAt[index])
            devices.append(deviceIDs[index])
            left.append(leftAt[index])
        }
        // Ids keep their order, so a remapped sorted set stays sorted.
        func remap(_ set: TokenSet) -> TokenSet {
            TokenSet(sorted: set.compactMap { map[Int($0)] == .max ? nil : map[Int($0)] })
        }
        // The tokens kept were distinct in this registry, so they are in the new one.
        let registry = try! TokenRegistry(tokens: kept, seenAt: seen, deviceIDs: devices, leftAt: left)
        return State(
            lineage: lineage, serial: serial, tokens: registry, dead: remap(dead),
            topics: topics.mapValues { topic in
                var topic = topic
                topic.managed = remap(topic.managed)
                topic.observed = remap(topic.observed)
                topic.optedOut = remap(topic.optedOut)
                return topic
            },
            groups: groups.mapValues { group in
                var group = group
                group.members = remap(group.members)
                group.exported = group.exported.map(remap)
                return group
            },
            backend: backend, versions: versions, inventoryRows: inventoryRows)
    }
}

extension StateWrite {
    /// A write of a state whose token table was rebuilt (`State.removing`): every token, topic and
    /// group is replaced; the serial and the versions move on as for any write.
    public static func compacting(_ state: State) -> StateWrite {
        var write = restoring(state)
        write.restore = false
        write.compact = true
        return write
    }
}
