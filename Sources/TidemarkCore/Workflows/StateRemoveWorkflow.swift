import Foundation

/// One topic, device group or audience that `tidemark state rm` forgot, and what stays in FCM.
public struct ReleasedEntry: Sendable, Equatable, Encodable {
    /// `topic:NAME`, `group:NAME` or `audience:NAME`.
    public var address: String
    /// The memberships tidemark made or adopted there (a group's or audience's members): they stay
    /// as they are in FCM; tidemark no longer manages them.
    public var managed: Int
    /// A topic's subscribers tidemark last saw (its members, for a group or audience).
    public var observed: Int

    /// What was released at `address`.
    public init(address: String, managed: Int, observed: Int) {
        self.address = address
        self.managed = managed
        self.observed = observed
    }
}

/// What `tidemark state rm` released.
public struct StateRemoveOutcome: Sendable {
    /// What was (or, on a dry run, would be) forgotten, in the order named.
    public var released: [ReleasedEntry]
    /// The serial written; nil on a dry run.
    public var serial: Int?
}

/// `tidemark state rm ADDRESS…`: forgets topics, device groups and audiences, sending nothing to FCM.
/// Their memberships stay as they are, and tidemark no longer manages them: a later plan neither
/// removes nor re-asserts them. A manifest that still declares one adopts it again at its next apply,
/// recording the memberships FCM holds and sending nothing for them.
///
/// Refused while an apply is unfinished (its journal decides what state holds), and, before anything
/// is written, when any address names what state does not hold. The caller holds the state lock
/// around `run` unless it is a dry run.
public struct StateRemoveWorkflow: Sendable {
    /// The state to release from.
    public var store: any StateStore
    /// The clock of the write.
    public var timing: Timing

    /// A release from `store`'s state.
    public init(store: any StateStore, timing: Timing = .live) {
        self.store = store
        self.timing = timing
    }

    /// Forgets `addresses` in one save (none with `dryRun`); each address once.
    public func run(_ addresses: [StateAddress], dryRun: Bool = false) async throws -> StateRemoveOutcome {
        if let pending = try await store.unfinishedApply() {
            throw WorkflowError.unfinished(pending, at: store.location)
        }
        var state = try await store.load() ?? State()
        let before = state
        var released: [ReleasedEntry] = []
        var misses: [(address: String, hint: String)] = []
        var seen = Set<StateAddress>()
        for address in addresses where seen.insert(address).inserted {
            switch state.release(address) {
            case .released(let entry): released.append(entry)
            case .missing(let hint): misses.append((address.description, hint))
            }
        }
        if !misses.isEmpty { throw WorkflowError.notInState(misses, location: store.location) }
        guard !dryRun else { return StateRemoveOutcome(released: released, serial: nil) }
        var write = StateWrite()
        write.includeTopicsAndGroups(before: before, after: state)
        let serial = try await store.save(&state, write, at: timing.unixTime())
        return StateRemoveOutcome(released: released, serial: serial)
    }
}

extension State {
    /// What `release` found at an address.
    public enum ReleaseResult: Sendable, Equatable {
        /// Forgotten; this is what it held.
        case released(ReleasedEntry)
        /// State holds nothing there; the hint says what it does hold nearby.
        case missing(hint: String)
    }

    /// What state keeps at `address` (a topic a refresh only saw included), counted as `state rm` and
    /// `state mv` report it; nil when it keeps nothing there.
    func entry(_ address: StateAddress) -> ReleasedEntry? {
        let name = address.description
        switch address.kind {
        case .topic:
            return topics[address.name].map {
                ReleasedEntry(address: name, managed: $0.managed.count, observed: $0.observed.count)
            }
        case .group, .audience:
            guard let group = groups[address.name], group.audience == (address.kind == .audience) else { return nil }
            return ReleasedEntry(address: name, managed: group.members.count, observed: group.members.count)
        }
    }

    /// Forgets the topic, device group or audience at `address`, leaving FCM as it is.
    public mutating func release(_ address: StateAddress) -> ReleaseResult {
        guard let entry = entry(address) else { return .missing(hint: hint(for: address)) }
        if address.kind == .topic { setTopic(address.name, nil) } else { setGroup(address.name, nil) }
        return .released(entry)
    }

    /// " (state holds it as audience:NAME)", " (closest: topic:weather)", or "".
    private func hint(for address: StateAddress) -> String {
        let name = address.name
        if let group = groups[name] {
            return " (state holds it as \(group.audience ? "audience" : "group"):\(name))"
        }
        if address.kind != .topic, topics[name] != nil { return " (state holds it as topic:\(name))" }
        let candidates: [String] =
            switch address.kind {
            case .topic: topics.keys.sorted()
            case .group: groups.filter { !$0.value.audience }.map(\.key).sorted()
            case .audience: groups.filter { $0.value.audience }.map(\.key).sorted()
            }
        guard let closest = nearest(name, in: candidates) else { return "" }
        return " (closest: \(address.kind.rawValue):\(closest))"
    }
}
