import Foundation

/// A topic as the manifests want it, with members resolved to token ids.
public struct DesiredTopic: Sendable {
    /// The topic's name.
    public var name: String
    /// Authoritative or additive.
    public var mode: TopicMode
    /// Whether it never loses members without `--allow-protected`.
    public var protect: Bool
    /// Whether it may resolve to no members.
    public var allowEmpty: Bool
    /// The most members a plan may take from it (`max_unsubscribes`), when the manifests set it.
    public var maxUnsubscribes: UnsubscribeLimit? = nil
    /// What a device that unsubscribed itself gets (the mode's default unless the manifest says).
    public var optOuts: OptOutPolicy
    /// The declared members, as token ids.
    public var members: TokenSet
    /// Where the topic is declared; nil for topics made in code.
    public var location: SourceLocation?
    /// The member entries the members came from, in manifest order: why each device is declared.
    public var entries: [MemberEntry]

    /// A desired topic; `optOuts` nil means the mode's default.
    public init(
        name: String, mode: TopicMode = .additive, protect: Bool = false, allowEmpty: Bool = false,
        optOuts: OptOutPolicy? = nil, members: TokenSet, location: SourceLocation? = nil,
        entries: [MemberEntry] = []
    ) {
        self.entries = entries
        self.name = name
        self.optOuts = optOuts ?? mode.defaultOptOuts
        self.mode = mode
        self.protect = protect
        self.allowEmpty = allowEmpty
        self.members = members
        self.location = location
    }
}

/// One member entry of a topic (a selector, a device list, tokens, a token file) and the devices it
/// names; `ids` is nil when it is the topic's only entry (then it names all the members).
public struct MemberEntry: Sendable {
    /// The entry as the manifest wrote it.
    public var ref: MemberRef
    /// The members it names; nil when it is the topic's only entry.
    public var ids: TokenSet?

    /// An entry and the members it names.
    public init(ref: MemberRef, ids: TokenSet?) {
        self.ref = ref
        self.ids = ids
    }
}

/// A device group as the manifests want it.
public struct DesiredGroup: Sendable {
    /// The group's (or audience's) name.
    public var name: String
    /// Whether it never loses members without `--allow-protected`.
    public var protect: Bool
    /// The declared members, as token ids.
    public var members: TokenSet
    /// Where it is declared; nil for groups made in code.
    public var location: SourceLocation?
    /// Audiences only: the FCM group this audience was converted from may be deleted.
    public var retireGroupKey: Bool

    /// A desired group or audience.
    public init(
        name: String, protect: Bool = false, members: TokenSet, location: SourceLocation? = nil,
        retireGroupKey: Bool = false
    ) {
        self.name = name
        self.protect = protect
        self.members = members
        self.location = location
        self.retireGroupKey = retireGroupKey
    }
}

/// A `removed:` entry with `unsubscribe: false`: what it releases, and where it was written.
public struct DesiredRelease: Sendable, Equatable {
    /// The topic, group or audience released.
    public var address: StateAddress
    /// Where the entry is; nil for releases made in code.
    public var location: SourceLocation?

    /// A release of `address`.
    public init(_ address: StateAddress, at location: SourceLocation? = nil) {
        self.address = address
        self.location = location
    }
}

/// Everything the manifests declare, resolved against the inventory; ids are in the shared `TokenTable`.
public struct DesiredState: Sendable {
    /// Sorted by name.
    public var topics: [DesiredTopic]
    /// Sorted by name.
    public var groups: [DesiredGroup]
    /// tidemark audiences (named sets in state, no FCM group), sorted by name; they share the
    /// groups' namespace in state and in targets (`group:NAME`).
    public var audiences: [DesiredGroup]
    /// Tokens of the inventory and tokens named directly by manifests.
    public var knownTokens: TokenSet
    /// What `removed:` entries release with `unsubscribe: false`: state forgets them and nothing is
    /// sent to FCM (an entry with `unsubscribe: true` means what deleting the declaration means).
    public var released: [DesiredRelease] = []

    /// Whether a `removed:` entry releases `address` (there are a handful at most: a scan).
    public func releases(_ address: StateAddress) -> Bool { released.contains { $0.address == address } }

    /// The desired state; topics, groups and audiences are kept sorted by name.
    public init(
        topics: [DesiredTopic], groups: [DesiredGroup], audiences: [DesiredGroup] = [], knownTokens: TokenSet
    ) {
        self.topics = topics.sorted { $0.name < $1.name }
        self.groups = groups.sorted { $0.name < $1.name }
        self.audiences = audiences.sorted { $0.name < $1.name }
        self.knownTokens = knownTokens
    }
}

extension DesiredState {
    /// Order-free fingerprints of token sets, over a shared cache of per-token hashes.
    struct SetHasher {
        let table: TokenTable
        var tokenHash: [UInt64]

        init(_ table: TokenTable) {
            self.table = table
            tokenHash = [UInt64](repeating: 0, count: table.count)
        }

        mutating func hash(_ id: UInt32) -> UInt64 {
            if tokenHash[Int(id)] == 0 {
                // Eight bytes a step, with a fixed seed: the same on every run and machine.
                var h = StringIndex.hash(table[id], seed: 0x7469_6465_6D61_726B)
                // Mixed, so that sums of related tokens do not cancel; never 0 (0 means "not yet").
                h ^= h >> 33
                h = h &* 0xff51_afd7_ed55_8ccd
                h ^= h >> 33
                tokenHash[Int(id)] = h | 1
            }
            return tokenHash[Int(id)]
        }

        mutating func combine(_ set: TokenSet) -> String {
            var sum: UInt64 = 0
            var mixed: UInt64 = 0
            for id in set {
                let h = hash(id)
                sum = sum &+ h
                mixed = mixed &+ (h &* h | 1)
            }
            return "\(set.count):\(String(sum, radix: 16)):\(String(mixed, radix: 16))"
        }
    }

    /// What each topic and group means, by `State.versionKey`: its settings and resolved members (and,
    /// for an authoritative topic, the devices tidemark knows, which decide what it removes), over
    /// `hasher`'s cache, `known` being the fingerprint of `knownTokens`.
    private func entryDigests(_ hasher: inout SetHasher, known: String) -> [String: String] {
        var result: [String: String] = [:]
        for topic in topics {
            let optOuts = topic.optOuts == topic.mode.defaultOptOuts ? "" : topic.optOuts.rawValue
            let line =
                "topic\u{0}\(topic.name)\u{0}\(topic.mode.rawValue)\u{0}\(topic.protect)\u{0}\(topic.allowEmpty)\u{0}\(optOuts)\u{0}\(hasher.combine(topic.members))\u{0}\(topic.mode == .authoritative ? known : "")"
            result[State.versionKey(.topic, topic.name)] = SHA256Digest.hex(Data(line.utf8))
        }
        for group in groups {
            let line = "group\u{0}\(group.name)\u{0}\(group.protect)\u{0}\(hasher.combine(group.members))"
            result[State.versionKey(.group, group.name)] = SHA256Digest.hex(Data(line.utf8))
        }
        for address in released.map(\.address) {
            let key = State.versionKey(address.kind == .topic ? .topic : .group, address.name)
            result[key] = SHA256Digest.hex(Data("released\u{0}\(address)".utf8))
        }
        for audience in audiences {
            let line =
                "audience\u{0}\(audience.name)\u{0}\(audience.protect)\u{0}\(audience.retireGroupKey)\u{0}\(hasher.combine(audience.members))"
            result[State.versionKey(.group, audience.name)] = SHA256Digest.hex(Data(line.utf8))
        }
        return result
    }

    /// A digest of what the manifests mean: topics and groups with their settings and resolved members,
    /// and the devices tidemark knows. Comments, formatting, file layout and inventory columns no
    /// selector uses leave it unchanged, so a saved plan goes stale only when the desired state moved.
    ///
    /// Members are combined as sums of per-token hashes (order-free, linear in the memberships): this
    /// detects change, it is not a defence against forgery (apply re-derives a saved plan's operations).
    public func digest(tokens table: TokenTable) -> String { digests(tokens: table).digest }

    /// `digest` and `entryDigests` at once, hashing each token once.
    public func digests(tokens table: TokenTable) -> (digest: String, entries: [String: String]) {
        var hasher = SetHasher(table)
        let known = hasher.combine(knownTokens)
        let entries = entryDigests(&hasher, known: known)
        var digest = SHA256Digest()
        digest.update("tidemark-desired-state 3\n")
        for (key, value) in entries.sorted(by: { $0.key < $1.key }) {
            digest.update("\(key)\u{0}\(value)\n")
        }
        digest.update("known\u{0}\(known)\n")
        // Only when there are any, so that manifests without 'removed:' keep the digests they had.
        for address in released.map(\.address.description).sorted() { digest.update("released\u{0}\(address)\n") }
        return (digest.finalize(), entries)
    }
}
