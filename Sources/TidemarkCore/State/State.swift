import Foundation

/// What tidemark remembers of a topic: the memberships it made and those it last saw.
public struct TopicState: Sendable, Equatable {
    /// Authoritative (tidemark removes anyone undeclared) or additive (only its own).
    public var mode: TopicMode
    /// A protected topic never loses members without `--allow-protected`.
    public var protect: Bool
    /// Memberships tidemark made or adopted; an additive topic removes these when no longer declared.
    public var managed: TokenSet
    /// Memberships seen by the last refresh or made by the last apply.
    public var observed: TokenSet
    /// Devices seen to unsubscribe themselves (outside tidemark) and not seen subscribed since: a topic
    /// with `opt_outs: respect` leaves them alone.
    public var optedOut: TokenSet

    /// A topic's state; empty sets by default.
    public init(
        mode: TopicMode = .additive, protect: Bool = false, managed: TokenSet = TokenSet(),
        observed: TokenSet = TokenSet(), optedOut: TokenSet = TokenSet()
    ) {
        self.mode = mode
        self.protect = protect
        self.managed = managed
        self.observed = observed
        self.optedOut = optedOut
    }
}

/// What tidemark remembers of a device group, or of an audience (a named set of devices with no
/// FCM group behind it, which shares the groups' names).
public struct GroupState: Sendable, Equatable {
    /// The notification key FCM returned; nil when the group is not known to exist. For an audience:
    /// the FCM group it was converted from, while that group lives (until retired or turned down).
    public var key: String?
    /// A protected group never loses members without `--allow-protected`.
    public var protect: Bool
    /// A device group: the members tidemark made. An audience: its members (and, while `key` is
    /// set, the FCM group's, which tidemark keeps in step until the group is retired).
    public var members: TokenSet
    /// A tidemark audience rather than an FCM device group.
    public var audience: Bool
    /// Every token FCM's export call listed for the group (members the app added included), when
    /// `groups export` last read it; nil when never exported.
    public var exported: TokenSet?
    /// When `exported` was read (seconds since 1970); 0 when never.
    public var exportedAt: Int64

    /// A group's (or audience's) state.
    public init(
        key: String?, protect: Bool = false, members: TokenSet = TokenSet(), audience: Bool = false,
        exported: TokenSet? = nil, exportedAt: Int64 = 0
    ) {
        self.key = key
        self.protect = protect
        self.members = members
        self.audience = audience
        self.exported = exported
        self.exportedAt = exportedAt
    }
}

/// tidemark's state: identity, managed and observed memberships, groups, token liveness.
///
/// Token ids index `tokens`; the planner interns the manifests' tokens into the same table.
public struct State: Sendable {
    /// Fixed for the life of a state; a plan from another lineage is refused.
    public var lineage: String
    /// Bumped on every write; a saved plan records the serial it was made from.
    public var serial: Int
    /// Every token state knows, interned: the ids its sets hold.
    public var tokens: TokenTable
    /// Seconds since 1970 when each token was last seen by a refresh or an apply; 0 = never.
    public var seenAt: [Int64]
    /// The inventory's device id of each token, as the last apply saw it ("" when unknown): how a
    /// token that left the inventory is recognised as a device's earlier token (a rotation).
    public var deviceIDs: [String] = []
    /// When each token stopped being declared (seconds since 1970; 0 while declared or never noted):
    /// `prune` forgets a token that left long enough ago.
    public var leftAt: [Int64] = []
    /// Tokens FCM reported as unregistered (NOT_FOUND).
    public var dead: TokenSet
    /// The topics tidemark manages, by name.
    public var topics: [String: TopicState]
    /// The device groups and audiences tidemark manages, by name.
    public var groups: [String: GroupState]
    /// The FCM project and backend this state belongs to (recorded by the first write); a run against
    /// another is refused.
    public var backend: BackendIdentity?
    /// The serial at which each topic and group last changed, by `State.versionKey`: a saved plan stays
    /// valid while the serial moved only in topics and groups it does not touch.
    public var versions: [String: Int] = [:]
    /// The devices each inventory source read (after `exclude_if`) when the last apply finished, by
    /// source name: what the shrink guard compares the next read with.
    public var inventoryRows: [String: Int] = [:]

    /// `inventoryRows` as stored: JSON with sorted keys, empty when there are none.
    public var inventoryRowsText: String {
        guard !inventoryRows.isEmpty,
            let data = try? JSONSerialization.data(withJSONObject: inventoryRows, options: [.sortedKeys])
        else { return "" }
        return String(decoding: data, as: UTF8.self)
    }

    /// Reads `inventoryRowsText`; nil when it is not what tidemark writes.
    public static func inventoryRows(from text: String) -> [String: Int]? {
        if text.isEmpty { return [:] }
        guard let object = try? JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any] else {
            return nil
        }
        var rows: [String: Int] = [:]
        for (key, value) in object {
            guard let number = value as? NSNumber, let count = Int(exactly: number.doubleValue), count >= 0 else {
                return nil
            }
            rows[key] = count
        }
        return rows
    }

    /// The key of a topic's or group's version.
    public static func versionKey(_ kind: Targets.Kind, _ name: String) -> String { "\(kind.rawValue):\(name)" }

    /// A state that was never saved has an empty lineage; the first save gives it one (drawn from
    /// the injected `Timing`, so nothing here draws randomness).
    public init(
        lineage: String = "", serial: Int = 0, tokens: TokenTable = TokenTable(),
        seenAt: [Int64] = [], dead: TokenSet = TokenSet(), topics: [String: TopicState] = [:],
        groups: [String: GroupState] = [:]
    ) {
        self.lineage = lineage
        self.serial = serial
        self.tokens = tokens
        self.seenAt = seenAt
        self.dead = dead
        self.topics = topics
        self.groups = groups
    }

    /// Keeps `seenAt` as long as the token table after new tokens were interned.
    public mutating func growToTable() {
        if seenAt.count < tokens.count {
            seenAt.append(contentsOf: repeatElement(0, count: tokens.count - seenAt.count))
        }
        if deviceIDs.count < tokens.count {
            deviceIDs.append(contentsOf: repeatElement("", count: tokens.count - deviceIDs.count))
        }
        if leftAt.count < tokens.count {
            leftAt.append(contentsOf: repeatElement(0, count: tokens.count - leftAt.count))
        }
    }

    /// Notes which tokens stopped (or started again) being declared; returns the tokens whose
    /// `leftAt` changed (to be written). Proportional to the churn in writes, not to the fleet.
    public mutating func noteDepartures(declared: TokenSet, at now: Int64) -> [UInt32] {
        growToTable()
        var changed: [UInt32] = []
        var next = declared.makeIterator()
        var upcoming = next.next()
        for index in 0..<tokens.count {
            let id = UInt32(index)
            while let d = upcoming, d < id { upcoming = next.next() }
            let isDeclared = upcoming == id
            if isDeclared, leftAt[index] != 0 {
                leftAt[index] = 0
                changed.append(id)
            } else if !isDeclared, leftAt[index] == 0 {
                leftAt[index] = now
                changed.append(id)
            }
        }
        return changed
    }

    /// The device id of a token, when known.
    public func deviceID(of id: UInt32) -> String? {
        Int(id) < deviceIDs.count && !deviceIDs[Int(id)].isEmpty ? deviceIDs[Int(id)] : nil
    }

    /// Records which device each of the inventory's tokens belongs to; returns the tokens whose device
    /// id changed (to be written). Tokens are interned when new.
    public mutating func recordDevices(_ inventory: Inventory) -> [UInt32] {
        var changed: [UInt32] = []
        for (index, token) in inventory.tokens.enumerated() {
            let id = tokens.intern(token)
            growToTable()
            if deviceIDs[Int(id)] != inventory.deviceIDs[index] {
                deviceIDs[Int(id)] = inventory.deviceIDs[index]
                changed.append(id)
            }
        }
        return changed
    }

    /// Memberships tidemark knows of: observed subscriptions over every topic.
    public var observedMembershipCount: Int { topics.values.reduce(0) { $0 + $1.observed.count } }

    /// The topics each token is observed in, counted; used for the 2000-topic cap.
    func observedTopicCounts() -> [UInt16] {
        var counts = [UInt16](repeating: 0, count: tokens.count)
        for topic in topics.values {
            for id in topic.observed where Int(id) < counts.count { counts[Int(id)] &+= 1 }
        }
        return counts
    }
}
