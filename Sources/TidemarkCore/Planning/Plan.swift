import Foundation

/// One request's worth of work: a batch of ≤ 1000 tokens for a topic, or one device-group call.
public struct PlannedOperation: Sendable, Codable, Equatable {
    /// What an operation does: a topic batch, a device-group call, or a state-only audience step.
    public enum Kind: String, Sendable, Codable {
        case unsubscribe
        case subscribe
        case groupCreate = "group_create"
        case groupAdd = "group_add"
        case groupRemove = "group_remove"
        /// State only, no call to FCM: the audience's members become these tokens (created when new).
        case audienceSet = "audience_set"
        /// State only: the audience is forgotten.
        case audienceDelete = "audience_delete"
        /// State only: the FCM group the audience was converted from is forgotten (FCM turned
        /// device groups down, so it no longer exists).
        case audienceUnlink = "audience_unlink"
        /// State only: these memberships, which FCM already holds, become tidemark's own (a topic new
        /// to state, or declared again after it was released).
        case topicAdopt = "topic_adopt"
        /// State only: the topic is released (`removed:` with `unsubscribe: false`): state forgets it
        /// and its memberships stay as they are in FCM.
        case topicRelease = "topic_release"
        /// State only: the device group or audience is released: state forgets it, FCM keeps it.
        case groupRelease = "group_release"

        /// Runs in its group's sequence (device-group calls and the state-only group and audience steps).
        public var isGroup: Bool { isGroupCall || (isStateOnly && !isTopicStep) }
        /// A call to FCM's device-group API.
        public var isGroupCall: Bool { self == .groupCreate || self == .groupAdd || self == .groupRemove }
        /// Changes only tidemark's state, nothing is sent to FCM: an audience has no FCM object behind
        /// it, an adoption records what FCM holds, a release forgets.
        public var isStateOnly: Bool {
            switch self {
            case .audienceSet, .audienceDelete, .audienceUnlink, .topicAdopt, .topicRelease, .groupRelease: true
            case .subscribe, .unsubscribe, .groupCreate, .groupAdd, .groupRemove: false
            }
        }
        /// A state-only step of a topic (an adoption or a release).
        public var isTopicStep: Bool { self == .topicAdopt || self == .topicRelease }
        /// Says something of FCM's registrations that applying a saved plan reads again: every call to
        /// FCM, and an adoption (FCM holds these memberships).
        public var readsRegistrations: Bool { !isStateOnly || self == .topicAdopt }
        /// The changes that undo this one for the same token and target.
        public var opposites: [Kind] {
            switch self {
            case .subscribe: [.unsubscribe]
            case .unsubscribe: [.subscribe]
            case .groupCreate, .groupAdd: [.groupRemove]
            case .groupRemove: [.groupCreate, .groupAdd]
            case .audienceSet, .audienceDelete, .audienceUnlink, .topicAdopt, .topicRelease, .groupRelease: []
            }
        }
    }

    /// What this operation does.
    public var kind: Kind
    /// Topic name, or the group's `notification_key_name`.
    public var target: String
    /// The registration tokens it names, in order (≤ 1000 for a topic batch).
    public var tokens: [String]

    /// An operation of `kind` on `target` for `tokens`.
    public init(kind: Kind, target: String, tokens: [String]) {
        self.kind = kind
        self.target = target
        self.tokens = tokens
    }
}

/// Per-topic counts for the reader of a plan.
public struct TopicChange: Sendable, Codable, Equatable {
    /// The topic's name.
    public var topic: String
    /// The mode the manifests declare for it.
    public var mode: TopicMode
    /// Memberships the plan adds.
    public var subscribe: Int
    /// Memberships the plan removes.
    public var unsubscribe: Int
    /// True when the topic is no longer in the manifests; tidemark removes what it made.
    public var removedFromManifests: Bool
    /// What the reviewer should know: unregistered members skipped, protection, opt-outs.
    public var notes: [String]
    /// Why devices join and leave, by cause, largest first (absent in older plans).
    public var reasons: [ChangeReason]? = nil
    /// The mode the topic was last applied with, when the manifests change it (absent otherwise).
    public var previousMode: TopicMode? = nil
    /// The subscribers tidemark knew of before this plan (observed, after the refresh); absent in
    /// older plans.
    public var before: Int? = nil
    /// Of `unsubscribe`, the old tokens of devices whose token rotated: the device stays, under its
    /// new token (absent when none).
    public var rotated: Int? = nil
    /// The topic is protected (`protect: true`); absent otherwise.
    public var protected: Bool? = nil
    /// The topic's own `max_unsubscribes`, as written, when the manifests set one.
    public var maxUnsubscribes: String? = nil
    /// Memberships FCM already holds that the plan records as tidemark's own, sending nothing
    /// (absent when none).
    public var adopted: Int? = nil
    /// The topic is released (`removed:` with `unsubscribe: false`): nothing is sent and state forgets
    /// it (absent otherwise).
    public var released: Bool? = nil

    /// The share of its known subscribers past which removals from a topic are called out as
    /// destructive when the manifests set no `max_unsubscribes` for it.
    public static let reviewShare = 0.10

    /// The subscribers after the plan, when `before` is known.
    public var after: Int? { before.map { max(0, $0 + subscribe - unsubscribe) } }

    /// Members the topic loses for good: its removals but for rotated tokens.
    public var losses: Int { max(0, unsubscribe - (rotated ?? 0)) }

    /// The topic's own `max_unsubscribes` and the members it lets go of `before`, when the
    /// manifests set one: `losses` past `allowed` refuse the plan.
    public var ownRail: (limit: UnsubscribeLimit, allowed: Int)? {
        guard let written = maxUnsubscribes,
            let limit = try? UnsubscribeLimit(parsing: written, setting: "max_unsubscribes")
        else { return nil }
        return (limit, limit.allowed(of: before ?? 0))
    }

    /// Why the plan's removals from this topic deserve a reviewer's attention ("authoritative topic",
    /// "13% of its 500 subscribers, over the 10% that calls for review"), or nil when they do not:
    /// removals from an authoritative or protected topic or from one leaving the manifests, and
    /// removals past the topic's `max_unsubscribes` (or 10% of its subscribers). A rotation is never
    /// destructive: the device keeps its topics under its new token.
    public var destructiveReasons: [String] {
        let lost = losses
        guard lost > 0 else { return [] }
        var reasons: [String] = []
        if removedFromManifests { reasons.append("topic removed from the manifests") }
        if mode == .authoritative, !removedFromManifests { reasons.append("authoritative topic") }
        if protected == true { reasons.append("protected topic") }
        if !removedFromManifests, let before, before > 0 {
            let share = PlanRenderer.formatShare(Double(lost) / Double(before))
            let of = "\(share) of its \(PlanRenderer.counted(before, "subscriber"))"
            if let rail = ownRail {
                if lost > rail.allowed { reasons.append("\(of), over its max_unsubscribes \(rail.limit)") }
            } else if Double(lost) > Double(before) * Self.reviewShare {
                reasons.append("\(of), over the \(Int(Self.reviewShare * 100))% that calls for review")
            }
        }
        return reasons
    }
}

/// One cause of a topic's changes: "+120 by selector {locale: en-GB} at manifests/weather.yaml:14",
/// "−3 device left the inventory".
public struct ChangeReason: Sendable, Codable, Equatable {
    /// Whether devices join the topic or leave it.
    public enum Direction: String, Sendable, Codable {
        case join, leave
    }

    /// Whether these devices join or leave.
    public var direction: Direction
    /// How many devices.
    public var count: Int
    /// What caused it, without the location: "selector {locale: en-GB}", "device left the inventory".
    public var why: String
    /// Where in the manifests, "manifests/weather.yaml:14", when a member entry is the cause.
    public var at: String?

    /// A cause of `count` joins or leaves.
    public init(direction: Direction, count: Int, why: String, at: String? = nil) {
        self.direction = direction
        self.count = count
        self.why = why
        self.at = at
    }
}

/// Per-group change for the reader of a plan.
public struct GroupChange: Sendable, Codable, Equatable {
    /// What happens to the group.
    public enum Action: String, Sendable, Codable {
        case create, update, adopt, delete
        /// A device group becomes a tidemark audience; the FCM group is kept until retired.
        case convert
        /// The FCM group behind an audience is deleted (`retire_group_key: true`).
        case retire
        /// Released (`removed:` with `unsubscribe: false`): state forgets it; FCM keeps the group.
        case release
    }

    /// The group's (or audience's) name.
    public var group: String
    /// What happens to it.
    public var action: Action
    /// Members the plan adds.
    public var add: Int
    /// Members the plan removes.
    public var remove: Int
    /// What the reviewer should know about the change.
    public var notes: [String]
    /// True for a tidemark audience (a named set in state, no FCM group); absent for device groups.
    public var audience: Bool? = nil

    /// A group's change, as the plan shows it.
    public init(group: String, action: Action, add: Int, remove: Int, notes: [String], audience: Bool? = nil) {
        self.group = group
        self.action = action
        self.add = add
        self.remove = remove
        self.notes = notes
        self.audience = audience
    }
}

/// What a refresh saw that differs from state; recorded in the plan so `apply FILE` stores it too.
public struct Observations: Sendable, Codable, Equatable {
    /// One topic's memberships that differ from state.
    public struct TopicDelta: Sendable, Codable, Equatable {
        /// The topic's name.
        public var topic: String
        /// Tokens now seen subscribed that state did not show.
        public var subscribed: [String]
        /// Tokens state showed subscribed that are no longer.
        public var unsubscribed: [String]

        /// `topic`'s memberships seen `subscribed` and `unsubscribed` against state.
        public init(topic: String, subscribed: [String], unsubscribed: [String]) {
            self.topic = topic
            self.subscribed = subscribed
            self.unsubscribed = unsubscribed
        }
    }

    /// A group whose existence differs from what state knows.
    public struct GroupKey: Sendable, Codable, Equatable {
        /// The group's name.
        public var group: String
        /// The key found, or nil when the group no longer exists.
        public var key: String?

        /// `group` found with `key` (nil: gone).
        public init(group: String, key: String?) {
            self.group = group
            self.key = key
        }
    }

    /// When the refresh ran (seconds since 1970); nil for a plan made with `--no-refresh`.
    public var refreshedAt: Int64?
    /// Per topic, the memberships that differ from state.
    public var topics: [TopicDelta] = []
    /// Tokens FCM no longer knows.
    public var dead: [String] = []
    /// Tokens state had as dead that FCM knows again.
    public var revived: [String] = []
    /// Groups found, or found gone, against what state knows.
    public var groupKeys: [GroupKey] = []

    /// No observations yet; `refreshedAt` is when the refresh ran.
    public init(refreshedAt: Int64? = nil) { self.refreshedAt = refreshedAt }

    /// Whether the refresh found nothing that differs from state.
    public var isEmpty: Bool { topics.isEmpty && dead.isEmpty && revived.isEmpty && groupKeys.isEmpty }
}

/// A device whose token rotated: the old token leaves its topics and the new one joins them.
public struct Rotation: Sendable, Codable, Equatable {
    /// The inventory's device id.
    public var device: String
    /// The token state knew for the device.
    public var from: String
    /// The device's token now.
    public var to: String
    /// Topics the new token is subscribed to by this plan, and the old one unsubscribed from.
    public var subscribes: Int
    /// Topics the old token is unsubscribed from.
    public var unsubscribes: Int

    /// A rotation of `device` from one token to another.
    public init(device: String, from: String, to: String, subscribes: Int, unsubscribes: Int) {
        self.device = device
        self.from = from
        self.to = to
        self.subscribes = subscribes
        self.unsubscribes = unsubscribes
    }
}

/// A device that left the inventory: the token the plan removes, and the device id state knew for it.
public struct Departure: Sendable, Codable, Equatable {
    /// The inventory's device id, as state last knew it.
    public var device: String
    /// The token the plan removes.
    public var token: String

    /// `device`'s token `token`.
    public init(device: String, token: String) {
        self.device = device
        self.token = token
    }
}

/// What one inventory source read for a plan: its name, how many devices, and a digest of them.
public struct InventoryRecord: Sendable, Codable, Equatable {
    /// The source's name in `tidemark.yaml` (or the inventory file).
    public var source: String
    /// A digest of what the source read (`InventorySnapshot.identity`).
    public var identity: String
    /// The devices it read, when counted.
    public var rows: Int?
    /// The devices `exclude_if` left out, when any.
    public var excluded: Int?

    /// The record of one source's read.
    public init(source: String, _ snapshot: InventorySnapshot) {
        self.source = source
        identity = snapshot.identity
        rows = snapshot.rows
        excluded = snapshot.excluded
    }

    /// The records of a load, by source name.
    public static func of(_ snapshots: [String: InventorySnapshot]) -> [InventoryRecord]? {
        snapshots.isEmpty ? nil : snapshots.sorted { $0.key < $1.key }.map { InventoryRecord(source: $0.key, $0.value) }
    }
}

/// A reviewable, replayable plan: operations in execution order plus what it was computed from.
public struct Plan: Sendable, Codable {
    /// The format this tidemark writes; a plan of a later format is refused.
    public static let currentFormatVersion = 1

    /// The format the plan was written in.
    public var formatVersion: Int
    /// The tidemark version that made it.
    public var tidemarkVersion: String
    /// When it was made.
    public var createdAt: Date
    /// The lineage of the state it was made from; a plan for another state is refused.
    public var lineage: String
    /// The state's serial when it was made.
    public var serial: Int
    /// A digest of what the manifests meant (`DesiredState.digest`); apply refuses a plan whose manifests changed.
    public var manifestsDigest: String
    /// The FCM project and backend it was made for.
    public var backend: BackendIdentity
    /// Whether it read FCM (false for `--no-refresh`).
    public var refreshed: Bool
    /// `--target` selectors of a partial plan; empty when it covers everything not excluded.
    public var targets: [String]
    /// `--exclude` selectors of a partial plan (absent in plans before it existed).
    public var excludes: [String]? = nil
    /// The operations, in the order apply runs them: removals, then additions, then each group's steps.
    public var operations: [PlannedOperation]
    /// Per-topic counts for the reviewer.
    public var topics: [TopicChange]
    /// Per-group changes for the reviewer.
    public var groups: [GroupChange]
    /// The warnings (and, for a plan that cannot be applied, the errors) planning found.
    public var diagnostics: [Diagnostic]
    /// What the refresh saw that differs from state; apply records it too.
    public var observations: Observations
    /// The versions (`State.versions`) of the topics and groups its operations touch, when planned: the
    /// plan stays valid while these do not move (absent in older plans, which need the same serial).
    public var versions: [String: Int]? = nil
    /// What each touched topic and group meant in the manifests (`LoadedManifests.entryDigests`): the plan
    /// stays valid while these do not change, whatever else the manifests gained (absent in older plans).
    public var desired: [String: String]? = nil
    /// Declared memberships left unsubscribed because devices opted out in the app (absent in older plans).
    public var optedOut: Int? = nil
    /// The requests its apply sends to FCM on the backend's transport (absent in older plans).
    public var requests: Int? = nil
    /// SHA-256 of the operations when the plan was made: a saved plan whose operations no longer match
    /// it was edited or damaged (absent in older plans).
    public var operationsDigestWhenMade: String? = nil
    /// What each inventory source read when the plan was made (absent in older plans).
    public var inventory: [InventoryRecord]? = nil
    /// Devices whose token changed since tidemark last saw them: their memberships move (absent when none).
    public var rotations: [Rotation]? = nil
    /// How far the refresh looked: the registrations read, of what fleet, and how long ago the rest
    /// were read (absent in older plans).
    public var coverage: RefreshCoverage? = nil
    /// The registrations of the sweep's slice that matched state when read: applying this plan records
    /// them as read (absent when the plan swept nothing).
    public var sweptMatching: [String]? = nil
    /// Made with `--drift-only`: it re-asserts what the last apply established, and this many changes
    /// the manifests and inventory call for wait for a normal apply (absent otherwise).
    public var driftOnly: DriftOnlyNote? = nil
    /// A plan read through another topic API than the configured one: how what it read compares with
    /// state (absent otherwise).
    public var shadowVerify: ShadowVerify? = nil
    /// Tokens the plan removes whose device left the inventory, with the device id state knew for
    /// each, so a reviewer sees which devices go (absent when none).
    public var departed: [Departure]? = nil
    /// SHA-256 of the manifest files as read (names and bytes): changes only when a manifest file
    /// does; the inventory has its own digests in `inventory` (absent in older plans).
    public var manifestFiles: String? = nil
    /// Requests the plan's refresh sent to FCM to read registrations and groups, when the backend
    /// counts them (absent otherwise).
    public var reads: Int? = nil
    /// A `tidemark state mv` journaled as an apply with no call to FCM: the move it is part of (absent
    /// for every plan `plan` makes). No apply runs it; the same `state mv` finishes it.
    public var move: StateMoveRecord? = nil
    /// The counts a script needs, set by `summarized()` where a plan is written as JSON (standard
    /// output, a saved plan); informational, recomputed rather than trusted.
    public var summary: PlanSummary? = nil
    /// Topics and groups a rail holds: in a plan made with `--skip-held` (and `serve`'s), they are
    /// left out and wait; in a plan the rails refuse, they are what `--skip-held` would leave out
    /// (absent when none).
    public var held: [HeldChange]? = nil
    /// In a plan the rails refuse only for some topics and groups: what would still be applied beside
    /// them (`--skip-held`, and `serve`); absent otherwise.
    public var beside: BesideHeld? = nil

    /// A plan as the planner makes it; the optional parts are set afterwards.
    public init(
        formatVersion: Int = Plan.currentFormatVersion, tidemarkVersion: String, createdAt: Date,
        lineage: String, serial: Int, manifestsDigest: String, backend: BackendIdentity, refreshed: Bool,
        targets: [String] = [], operations: [PlannedOperation], topics: [TopicChange], groups: [GroupChange],
        diagnostics: [Diagnostic], observations: Observations
    ) {
        self.formatVersion = formatVersion
        self.tidemarkVersion = tidemarkVersion
        self.createdAt = createdAt
        self.lineage = lineage
        self.serial = serial
        self.manifestsDigest = manifestsDigest
        self.backend = backend
        self.refreshed = refreshed
        self.targets = targets
        self.operations = operations
        self.topics = topics
        self.groups = groups
        self.diagnostics = diagnostics
        self.observations = observations
    }

    /// Whether applying it changes anything in FCM or state.
    public var hasChanges: Bool { !operations.isEmpty }

    /// The plan's `--target` / `--exclude` selection.
    public var selection: Targets {
        get throws(TargetError) {
            var selection = try Targets(include: targets, exclude: excludes ?? [])
            // A plan made beside held topics leaves them out; a refused plan names them but covers them.
            if !diagnostics.hasErrors, let held { selection.withheld = Set(held.map(\.subject)) }
            return selection
        }
    }

    /// "only topic:weather-*; excluding …", for the partial-plan banner.
    public var selectionSummary: String {
        (try? selection.summary) ?? targets.joined(separator: ", ")
    }

    /// True when the plan covers only some topics and groups.
    public var isPartial: Bool { !targets.isEmpty || !(excludes ?? []).isEmpty }

    /// The topics, device groups and audiences its operations change, as its verdict counts them.
    public var changedCounts: (topics: Int, groups: Int, audiences: Int) {
        let audienceNames = Set(groups.filter { $0.audience == true }.map(\.group))
        let topics = Set(operations.filter { !$0.kind.isGroup }.map(\.target)).count
        let groups = Set(operations.filter { $0.kind.isGroup }.map(\.target)).subtracting(audienceNames).count
        return (topics, groups, audienceNames.count)
    }

    /// Of its unsubscriptions, the old tokens of rotated devices (their memberships move to the new
    /// token; nothing is lost).
    public var rotatedUnsubscribeCount: Int { topics.reduce(0) { $0 + ($1.rotated ?? 0) } }

    /// Memberships its subscribe batches add.
    public var subscribeCount: Int { operations.filter { $0.kind == .subscribe }.reduce(0) { $0 + $1.tokens.count } }
    /// Memberships its unsubscribe batches remove.
    public var unsubscribeCount: Int {
        operations.filter { $0.kind == .unsubscribe }.reduce(0) { $0 + $1.tokens.count }
    }

    /// The topic operations of one kind and topic in as few batches of `batchSize` as their tokens
    /// fill (at the first one's place), each token once: the shape every plan tidemark makes has. A
    /// saved plan written another way (a million one-token operations) then costs what the same
    /// changes planned fresh cost, since each operation is journaled on its own. Group calls and
    /// audience steps stay as they are: their order is their meaning. Unchanged (the same array) when
    /// every topic and kind already has no more batches than its tokens need.
    public static func coalesced(
        _ operations: [PlannedOperation], batchSize: Int = FCMLimits.maxBatchTokens
    ) -> [PlannedOperation] {
        struct Key: Hashable {
            var kind: PlannedOperation.Kind
            var target: String
        }
        var first: [Key: Int] = [:]
        var batches: [Key: (operations: Int, tokens: Int)] = [:]
        for (index, op) in operations.enumerated() where !op.kind.isGroup && !op.kind.isStateOnly {
            let key = Key(kind: op.kind, target: op.target)
            if first[key] == nil { first[key] = index }
            batches[key, default: (0, 0)].operations += 1
            batches[key, default: (0, 0)].tokens += op.tokens.count
        }
        let size = max(1, batchSize)
        guard batches.values.contains(where: { $0.operations > max(1, ($0.tokens + size - 1) / size) }) else {
            return operations
        }
        var tokens: [Int: [String]] = [:]
        var seen: [Int: Set<String>] = [:]
        for op in operations where !op.kind.isGroup && !op.kind.isStateOnly {
            let at = first[Key(kind: op.kind, target: op.target)]!
            for token in op.tokens where seen[at, default: []].insert(token).inserted {
                tokens[at, default: []].append(token)
            }
        }
        return operations.enumerated().flatMap { index, op -> [PlannedOperation] in
            if op.kind.isGroup || op.kind.isStateOnly { return [op] }
            guard let merged = tokens[index] else { return [] }
            return stride(from: 0, to: merged.count, by: size).map {
                PlannedOperation(
                    kind: op.kind, target: op.target, tokens: Array(merged[$0..<min($0 + size, merged.count)]))
            }
        }
    }

    /// A digest of the operations, to tell whether two plans would do the same thing.
    public var operationsDigest: String {
        var digest = SHA256Digest()
        for op in operations {
            digest.update(op.kind.rawValue)
            digest.update([0])
            digest.update(op.target)
            for token in op.tokens {
                digest.update([0])
                digest.update(token)
            }
            digest.update([1])
        }
        return digest.finalize()
    }
}

extension Plan {
    /// The JSON encoder of saved plans: snake_case keys, ISO 8601 dates; sorted keys, pretty by default.
    public static func encoder(pretty: Bool = true) -> JSONEncoder {
        let encoder = JSONEncoder()
        encoder.keyEncodingStrategy = .convertToSnakeCase
        encoder.dateEncodingStrategy = .iso8601
        encoder.outputFormatting = pretty ? [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes] : [.sortedKeys]
        return encoder
    }

    /// The JSON decoder of saved plans (`encoder`'s counterpart).
    public static func decoder() -> JSONDecoder {
        let decoder = JSONDecoder()
        decoder.keyDecodingStrategy = .convertFromSnakeCase
        decoder.dateDecodingStrategy = .iso8601
        return decoder
    }
}
