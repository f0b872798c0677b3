import Foundation

/// What a full plan that left nothing to do keeps in memory, so that `serve` can plan the changes of
/// a few devices without reading the whole inventory again: the manifests, the devices as they now
/// are, the desired state and state.
///
/// A batch of changed devices is resolved on its own against every topic's members (the same
/// `Resolver`, over an inventory of those devices only), the desired state is patched for their
/// tokens, and only their tokens' registrations are diffed (`Differ` with a scope): the operations are
/// the ones a full plan would make, because a full plan found nothing else to do. What a batch cannot
/// be planned from alone (a device a manifest names by id, a token another device holds, a device
/// group or audience it touches, a topic it leaves without members) is planned in full.
public struct WarmPlan: Sendable {
    /// The manifests, as last read in full.
    public let manifests: ManifestSet
    /// Where token files are read from.
    let files: any FileSource
    /// The largest token file read.
    let tokenFileBytes: Int
    /// The devices as the last full read saw them.
    let inventory: Inventory
    /// The desired state, patched with every batch since the full read.
    public private(set) var desired: DesiredState
    /// State, as the last apply left it.
    public private(set) var state: State
    /// Devices changed since the full read: their token now, nil when they left.
    private var tokenOf: [String: String?] = [:]
    /// Tokens whose device changed since the full read: the device holding them now, nil when none.
    private var holderOf: [String: String?] = [:]
    /// Device ids the manifests name in device lists.
    private let namedDevices: Set<String>
    /// The digest the full plan was made with (what a batch's plan records, marked as a batch's).
    let digest: String
    /// The inventory's shrink guard (`max_shrink`): devices that left since the full read count
    /// against it, so that a migration deleting rows is planned in full (where the guard stops it)
    /// rather than one batch at a time; nil checks nothing.
    let shrinkGuard: ShrinkGuard?
    /// Devices listed now, after every batch since the full read.
    public private(set) var listed: Int
    /// The topics and groups a rail held in the full plan: a batch leaves them out too (their
    /// changes wait for a whole plan whose rail passes).
    public let held: [HeldChange]

    /// What `loaded` (a full read, resolved into `state`'s token table) and `state` (after an apply
    /// that left nothing to do) hold; token files are read from `files`. With `sharingTokens`, the
    /// inventory's tokens become state's strings (a read that did not reuse the last one's; see
    /// `StringReuse`), so that the reading holds one string per token.
    public init(
        loaded: LoadedManifests, state: State, files: any FileSource, tokenFileBytes: Int,
        shrinkGuard: ShrinkGuard? = nil, sharingTokens: Bool = false, held: [HeldChange] = []
    ) {
        self.shrinkGuard = shrinkGuard
        self.held = held
        self.listed = loaded.inventory.count
        self.manifests = loaded.manifests
        self.files = files
        self.tokenFileBytes = tokenFileBytes
        var inventory = loaded.inventory
        if sharingTokens { inventory.shareTokens(with: StringReuse(state.tokens)) }
        self.inventory = inventory
        self.desired = loaded.desired
        self.state = state
        self.digest = loaded.digest
        var named = Set<String>()
        for entry in manifests.topics.flatMap(\.members) + manifests.groups.flatMap(\.members)
            + manifests.audiences.flatMap(\.members)
        {
            if case .devices(let ids) = entry { named.formUnion(ids.map(\.value)) }
        }
        self.namedDevices = named
    }

    /// The token device `id` has now; nil when it is not listed.
    public func token(ofDevice id: String) -> String? {
        if let changed = tokenOf[id] { return changed }
        return inventory.index(ofDevice: id).map { inventory.tokens[$0] }
    }

    /// The device holding `token` now; nil when none does.
    public func device(holding token: String) -> String? {
        if let changed = holderOf[token] { return changed }
        guard let index = inventory.index(ofToken: token) else { return nil }
        let id = inventory.deviceIDs[index]
        // A device that changed since the read holds the token only if it still has it.
        if let now = tokenOf[id], now != token { return nil }
        return id
    }

    /// How many devices changed since the full read (what the overlay holds).
    public var changedSinceRead: Int { tokenOf.count }
}

/// A batch of changed devices planned from a `WarmPlan`, ready to apply through the journal.
public struct ChangePlan: Sendable {
    /// The plan: only the changed devices' operations.
    public var plan: Plan
    /// The manifests as the plan saw them: the patched desired state, and the changed devices that
    /// are listed as the inventory.
    public var loaded: LoadedManifests
    /// State, with the changed devices' new tokens interned.
    public var state: State
    /// The tokens the plan covers: the changed devices' tokens before and after.
    public var scope: TokenSet
    /// The devices of the batch, and the token each has now (nil: it left).
    public var devices: [String: String?]
    /// Devices listed after the batch.
    public var listed: Int
}

/// Why a batch of changes is planned in full instead.
public struct PlanInFull: Error, Sendable, Equatable, CustomStringConvertible {
    /// What the batch touches that a batch cannot be planned from alone.
    public var description: String

    /// A reason.
    public init(_ description: String) { self.description = description }
}

extension WarmPlan {
    /// Plans the changes of `devices` (ids), of which `rows` holds those the inventory lists now, with
    /// their tokens and labels (a device of `devices` that `rows` lacks has left), read from the
    /// inventory source that `source` names as the place of its devices (nil: not checked). Throws
    /// `PlanInFull` when the batch must be planned in full.
    public func planChanges(
        devices ids: [String], rows: Inventory, source: String? = nil, planner: Planner, backend: BackendIdentity,
        now: Date, maxUnsubscribes: UnsubscribeLimit? = nil, topicRail: UnattendedRail? = nil
    ) throws(PlanInFull) -> ChangePlan {
        let changed = Set(ids)
        if let source {
            // A device another source lists would be a duplicate id in a whole read.
            for id in ids where tokenOf[id] == nil {
                guard let index = inventory.index(ofDevice: id) else { continue }
                let place = inventory.location(ofDevice: index).file
                if place != source { throw PlanInFull("device '\(id)' is listed by \(place)") }
            }
        }
        if let named = changed.intersection(namedDevices).sorted().first {
            throw PlanInFull("device '\(named)' is named by id in a manifest's device list")
        }
        for (index, id) in rows.deviceIDs.enumerated() {
            guard changed.contains(id) else { throw PlanInFull("device '\(id)' was read but not asked for") }
            if let holder = device(holding: rows.tokens[index]), !changed.contains(holder) {
                throw PlanInFull("device '\(id)' has the token device '\(holder)' has")
            }
        }
        var state = self.state
        // The batch's devices resolved on their own, their new tokens interned into state's table.
        var resolver = Resolver(manifests: manifests, inventory: rows, files: files)
        resolver.tokenFileBytes = tokenFileBytes
        let (mini, diagnostics) = state.interning { resolver.resolve(into: &$0) }
        let rowFiles = Set(rows.sources)
        if let problem = diagnostics.first(where: {
            $0.severity == .error && $0.location.map { rowFiles.contains($0.file) } == true
        }) {
            throw PlanInFull("a changed device has a problem: \(problem.message)")
        }
        var scopeIDs: [UInt32] = []
        var devices: [String: String?] = [:]
        for id in ids {
            if let old = token(ofDevice: id), let tokenID = state.tokens.id(old) { scopeIDs.append(tokenID) }
            devices[id] = .some(nil)
        }
        for (index, id) in rows.deviceIDs.enumerated() {
            scopeIDs.append(state.intern(rows.tokens[index]))
            devices[id] = rows.tokens[index]
        }
        let scope = TokenSet(scopeIDs)
        var patched = desired
        guard mini.topics.map(\.name) == desired.topics.map(\.name),
            mini.groups.map(\.name) == desired.groups.map(\.name),
            mini.audiences.map(\.name) == desired.audiences.map(\.name)
        else { throw PlanInFull("the manifests resolved differently") }
        for (group, kept) in zip(mini.groups + mini.audiences, desired.groups + desired.audiences) {
            if !group.members.intersection(scope).isEmpty || !kept.members.intersection(scope).isEmpty {
                throw PlanInFull("a changed device is in device group or audience '\(group.name)'")
            }
        }
        for (name, group) in state.groups where !group.members.intersection(scope).isEmpty {
            throw PlanInFull("a changed device is in device group or audience '\(name)'")
        }
        for index in patched.topics.indices {
            let now = mini.topics[index]
            var topic = patched.topics[index]
            topic.members = topic.members.replacing(scope, with: now.members.intersection(scope))
            for entry in topic.entries.indices {
                guard let ids = topic.entries[entry].ids else { continue }
                let fresh = now.entries.indices.contains(entry) ? now.entries[entry].ids ?? TokenSet() : TokenSet()
                topic.entries[entry].ids = ids.replacing(scope, with: fresh.intersection(scope))
            }
            if topic.members.isEmpty, !topic.allowEmpty {
                throw PlanInFull("topic '\(topic.name)' would have no members")
            }
            // A selector that matches no device is an error of a full plan: the batch cannot be
            // planned on its own when it leaves one so.
            for (entry, member) in topic.entries.enumerated() {
                guard case .selector = member.ref else { continue }
                // An entry's own members are kept when the topic has several (else they are the topic's).
                let matched = member.ids ?? (topic.entries.count == 1 ? topic.members : nil)
                if let matched, matched.isEmpty {
                    throw PlanInFull(
                        "the selector of topic '\(topic.name)' (member entry \(entry + 1)) would match no device")
                }
            }
            patched.topics[index] = topic
        }
        patched.knownTokens = desired.knownTokens.replacing(scope, with: mini.knownTokens.intersection(scope))
        let listedAfter = listed + rows.count - changed.count { token(ofDevice: $0) != nil }
        if let shrinkGuard, listedAfter < inventory.count {
            let share = ([shrinkGuard.share] + shrinkGuard.perSource.values).min() ?? shrinkGuard.share
            let lost = inventory.count - listedAfter
            if lost > shrinkGuard.minimum, Double(lost) > share * Double(inventory.count) {
                throw PlanInFull(
                    "\(PlanRenderer.counted(lost, "device")) left since the inventory was last read in full (of \(PlanRenderer.formatCount(inventory.count))), past max_shrink"
                )
            }
        }
        var loaded = LoadedManifests(
            manifests: manifests, inventory: rows, desired: patched, diagnostics: [],
            digest: "changes of \(ids.count) devices after \(digest)", entryDigests: [:])
        loaded.filesDigest = ""
        var plan = planner.plan(
            loaded: loaded, state: state, refresh: nil, backend: backend, now: now,
            targets: Targets(withheld: Set(held.map(\.subject))), maxUnsubscribes: maxUnsubscribes, scope: scope,
            topicRail: topicRail)
        // Its selection leaves them out, as the whole plan's did (state keeps what they were).
        if !held.isEmpty { plan.held = held }
        return ChangePlan(
            plan: plan, loaded: loaded, state: state, scope: scope, devices: devices, listed: listedAfter)
    }

    /// Takes on a batch that was applied: its devices' tokens, the patched desired state, and state
    /// as the apply left it.
    public mutating func commit(_ change: ChangePlan, state applied: State) {
        for (id, token) in change.devices {
            if let old = self.token(ofDevice: id), holderOf[old] ?? device(holding: old) == id {
                holderOf[old] = .some(nil)
            }
            tokenOf[id] = token
            if let token { holderOf[token] = id }
        }
        listed = change.listed
        desired = change.loaded.desired
        state = applied
    }
}
