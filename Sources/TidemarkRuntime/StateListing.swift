import Foundation
import TidemarkCore

/// What `tidemark state list` shows: the topics and groups state holds, with counts, and the latest
/// applies (`--format json` prints it as it is).
public struct StateListing: Sendable, Encodable {
    /// A topic in state.
    public struct Topic: Sendable, Encodable {
        /// Its name.
        public var name: String
        /// `authoritative` or `additive`.
        public var mode: String
        /// Whether it is protected.
        public var protect: Bool
        /// Memberships tidemark made.
        public var managed: Int
        /// Memberships last seen in FCM.
        public var observed: Int
    }
    /// A device group or an audience in state.
    public struct Group: Sendable, Encodable {
        /// Its name.
        public var name: String
        /// "group" (an FCM device group) or "audience" (a named set in state).
        public var kind: String
        /// Whether FCM has it (a key is known).
        public var exists: Bool
        /// Whether it is protected.
        public var protect: Bool
        /// Its members.
        public var members: Int
        /// Tokens exported from FCM, when it was exported.
        public var exported: Int?
        /// When it was exported (seconds since 1970).
        public var exportedAt: Int64?
    }
    /// One of the latest applies.
    public struct Apply: Sendable, Encodable {
        /// Its id.
        public var id: String
        /// `running`, `finished`… or `interrupted` (running while nothing holds the lock: killed).
        public var status: String
        /// When it started (seconds since 1970).
        public var startedAt: Int64
        /// Its operations.
        public var operations: Int
        /// Those done.
        public var done: Int
    }
    /// State's lineage.
    public var lineage: String
    /// State's serial.
    public var serial: Int
    /// Tokens state knows.
    public var tokens: Int
    /// Of those, dead.
    public var dead: Int
    /// The topics, by name.
    public var topics: [Topic]
    /// The groups and audiences, by name.
    public var groups: [Group]
    /// The latest applies, newest first.
    public var applies: [Apply]

    /// The listing of `state` with its latest `applies`; `locked`: something holds the state lock.
    public init(_ state: State, applies: [ApplyRecord], locked: Bool) {
        lineage = state.lineage
        serial = state.serial
        tokens = state.tokens.count
        dead = state.dead.count
        topics = state.topics.keys.sorted().map { name in
            let t = state.topics[name]!
            return Topic(
                name: name, mode: t.mode.rawValue, protect: t.protect, managed: t.managed.count,
                observed: t.observed.count)
        }
        groups = state.groups.keys.sorted().map { name in
            let g = state.groups[name]!
            return Group(
                name: name, kind: g.audience ? "audience" : "group", exists: g.key != nil, protect: g.protect,
                members: g.members.count, exported: g.exported?.count,
                exportedAt: g.exported == nil ? nil : g.exportedAt)
        }
        self.applies = applies.map {
            Apply(
                id: $0.id, status: $0.status == .running && !locked ? "interrupted" : $0.status.rawValue,
                startedAt: $0.startedAt, operations: $0.operations, done: $0.done)
        }
    }
}

extension Runtime {
    /// The refusal of a command that shows what state holds, when there is none yet.
    private var noState: RuntimeError {
        RuntimeError("there is no state at \(stateDisplay) yet; 'tidemark apply' or 'tidemark import' creates it.")
    }

    /// What `tidemark state list` shows of this runtime's state: its topics and groups and the latest
    /// `limit` applies. Throws when there is no state yet, saying what creates it.
    public func stateListing(applies limit: Int = 10) async throws -> StateListing {
        let store = stateStore()
        guard let state = try await store.load() else { throw noState }
        let applies = try await store.applies(limit: limit)
        // A run still "running" while nothing holds the lock was killed: the listing says so.
        let locked = try await store.lockHolder() != nil
        return StateListing(state, applies: applies, locked: locked)
    }
}

/// What `tidemark state lock` says: whether a run holds the state lock, and which (`--format json`
/// prints it as it is).
public struct StateLockReport: Sendable, Encodable {
    /// The state, as shown (never a password).
    public var state: String
    /// Whether a run holds the lock.
    public var locked: Bool
    /// Who holds it.
    public var holder: LockHolder?
    /// The lease's id, for a store that keeps leases.
    public var lease: String?
    /// When the lease expires unless renewed.
    public var expires: Date?
    /// Whether state exists (read only when asked for, or when the lock is free).
    public var exists: Bool
}

extension Runtime {
    /// Whether a run holds this runtime's state lock, and which. A lock can be held before the state
    /// exists (a first apply takes it, then refreshes): state is loaded to say whether it exists only
    /// when the lock is free, or when `checkingExistence` (loading it is the whole state).
    public func lockReport(checkingExistence: Bool) async throws -> StateLockReport {
        let store = stateStore()
        let shown = stateDisplay
        func exists() async throws -> Bool { checkingExistence ? try await store.load() != nil : false }
        if let leases = store as? any LeaseKeeping, let lease = try await leases.lease() {
            return StateLockReport(
                state: shown, locked: true, holder: lease.holder, lease: lease.id, expires: lease.expires,
                exists: try await exists())
        }
        if let holder = try await store.lockHolder() {
            return StateLockReport(state: shown, locked: true, holder: holder, exists: try await exists())
        }
        return StateLockReport(state: shown, locked: false, exists: try await store.load() != nil)
    }
}

/// One topic or group of state, as `tidemark state show` names it, with what names its members: the
/// state it came from and the inventory of the manifests (empty when they cannot be read).
public struct StateEntry: Sendable {
    /// What state holds under the name.
    public enum Kind: Sendable {
        /// A topic.
        case topic(TopicState)
        /// A device group or an audience.
        case group(GroupState)
    }

    /// Its name, without `topic:` or `group:`.
    public var name: String
    /// The topic or group.
    public var kind: Kind
    /// The state it was read from (its tokens and device ids name the members).
    public var state: State
    /// The inventory's devices, for the members' device ids.
    public var inventory: Inventory

    /// The device of `token`: from the inventory, else from what state remembers of `id`.
    public func device(ofToken token: String, id: UInt32) -> String? {
        inventory.index(ofToken: token).map { inventory.deviceIDs[$0] } ?? state.deviceID(of: id)
    }
}

extension Runtime {
    /// The topic or group `name` names in state: `topic:NAME`, `group:NAME`, or a bare name (a topic
    /// first, then a group). Refused when state does not exist or holds no such entry.
    public func stateEntry(_ name: String) async throws -> StateEntry {
        guard var state = try await stateStore().load() else { throw noState }
        let manifests = manifestSource()
        let loaded = await state.interning { await manifests.load(into: &$0) }
        let kind = name.hasPrefix("group:") ? "group" : name.hasPrefix("topic:") ? "topic" : nil
        let bare = kind.map { String(name.dropFirst($0.count + 1)) } ?? name
        if kind != "group", let topic = state.topics[bare] {
            return StateEntry(name: bare, kind: .topic(topic), state: state, inventory: loaded.inventory)
        }
        if kind != "topic", let group = state.groups[bare] {
            return StateEntry(name: bare, kind: .group(group), state: state, inventory: loaded.inventory)
        }
        throw RuntimeError(
            "state has no \(kind ?? "topic or group") named '\(bare)'; 'tidemark state list' shows what it has.")
    }
}
