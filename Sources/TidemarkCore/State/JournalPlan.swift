import Foundation

/// The journal's copy of a plan, as state stores keep it: the plan's JSON without its operations'
/// tokens, followed by each operation's tokens as ids of the state's token table, which the same
/// transaction writes. At a million devices a plan's tokens are tens of megabytes of JSON that every
/// apply would encode and commit before its first change; as ids they are four bytes each.
///
/// Layout: `magic`, the JSON's length (UInt32, little-endian), the JSON, then per operation its token
/// count and token ids (UInt32, little-endian). A copy that does not start with `magic` is a whole
/// plan in JSON, as journals written before this form hold. Older tidemarks cannot read the compact
/// form, and say the journal's plan cannot be read rather than resuming something else.
public enum JournalPlan {
    static let magic = Array("tidemark-journal-plan-1\n".utf8)

    /// What went wrong reading a journal's plan.
    public struct Damaged: TidemarkError {
        /// `journal_damaged`.
        public var reason: FailureReason { "journal_damaged" }

        /// What is wrong with the journal's plan.
        public var description: String
    }

    /// The compact form of `plan`, or nil when a token of it has no id in `tokens` (the caller keeps
    /// the whole JSON then).
    public static func encode(_ plan: Plan, tokens: TokenTable) throws -> Data? {
        var ids: [[UInt32]] = []
        ids.reserveCapacity(plan.operations.count)
        for op in plan.operations {
            var row: [UInt32] = []
            row.reserveCapacity(op.tokens.count)
            for token in op.tokens {
                guard let id = tokens.id(token) else { return nil }
                row.append(id)
            }
            ids.append(row)
        }
        var bare = plan
        for index in bare.operations.indices { bare.operations[index].tokens = [] }
        let json = try Plan.encoder(pretty: false).encode(bare)
        var data = Data(capacity: magic.count + 4 + json.count + ids.reduce(0) { $0 + 4 + 4 * $1.count })
        data.append(contentsOf: magic)
        append(UInt32(json.count), to: &data)
        data.append(json)
        for row in ids {
            append(UInt32(row.count), to: &data)
            row.withUnsafeBytes { raw in
                // Little-endian on every platform tidemark builds for; written byte by byte elsewhere.
                if UInt32(1).littleEndian == 1 {
                    data.append(contentsOf: raw)
                } else {
                    for id in row { append(id, to: &data) }
                }
            }
        }
        return data
    }

    /// Whether `data` is in the compact form (else it is a whole plan in JSON).
    public static func isCompact(_ data: Data) -> Bool { data.starts(with: magic) }

    /// A journal's plan as read, before its token ids are looked up.
    public struct Parsed: Sendable {
        /// The plan, its operations' tokens still to be looked up when `ids` is set.
        public var plan: Plan
        /// Each operation's token ids; nil for a whole plan in JSON.
        var ids: [[UInt32]]?
        /// The ids to look up, each once, in order.
        public var wanted: [UInt32]
    }

    /// Reads a journal's plan in either form; `tokens` gives the token of each id the compact form
    /// names (each id once).
    public static func decode(_ data: Data, tokens: ([UInt32]) throws -> [UInt32: String]) throws -> Plan {
        let parsed = try parse(data)
        return try resolve(parsed, tokens: parsed.wanted.isEmpty ? [:] : tokens(parsed.wanted))
    }

    /// The first half of `decode`: the plan, and the token ids it names.
    public static func parse(_ data: Data) throws -> Parsed {
        guard isCompact(data) else {
            return Parsed(plan: try Plan.decoder().decode(Plan.self, from: data), ids: nil, wanted: [])
        }
        let bytes = [UInt8](data)
        var offset = magic.count
        func word() throws -> UInt32 {
            guard offset + 4 <= bytes.count else { throw Damaged(description: "it ends early") }
            defer { offset += 4 }
            return UInt32(bytes[offset]) | UInt32(bytes[offset + 1]) << 8 | UInt32(bytes[offset + 2]) << 16
                | UInt32(bytes[offset + 3]) << 24
        }
        let length = Int(try word())
        guard offset + length <= bytes.count else { throw Damaged(description: "it ends early") }
        let plan = try Plan.decoder().decode(Plan.self, from: Data(bytes[offset..<offset + length]))
        offset += length
        var ids: [[UInt32]] = []
        ids.reserveCapacity(plan.operations.count)
        var wanted = Set<UInt32>()
        for _ in plan.operations {
            let count = Int(try word())
            guard count <= (bytes.count - offset) / 4 else { throw Damaged(description: "it ends early") }
            var row: [UInt32] = []
            row.reserveCapacity(count)
            for _ in 0..<count {
                let id = try word()
                row.append(id)
                wanted.insert(id)
            }
            ids.append(row)
        }
        guard offset == bytes.count else { throw Damaged(description: "it has bytes after its last operation") }
        return Parsed(plan: plan, ids: ids, wanted: wanted.sorted())
    }

    /// The second half of `decode`: the plan with each operation's tokens, from `tokens` by id.
    public static func resolve(_ parsed: Parsed, tokens: [UInt32: String]) throws -> Plan {
        var plan = parsed.plan
        guard let ids = parsed.ids else { return plan }
        for (index, row) in ids.enumerated() {
            plan.operations[index].tokens = try row.map { id in
                guard let token = tokens[id] else {
                    throw Damaged(description: "operation \(index) names token id \(id), which state does not hold")
                }
                return token
            }
        }
        return plan
    }

    private static func append(_ value: UInt32, to data: inout Data) {
        withUnsafeBytes(of: value.littleEndian) { data.append(contentsOf: $0) }
    }
}

/// The registrations a saved plan's sweep read and found matching state, and when: applying the plan
/// records them as read then, so the sweep moves on without reading them twice.
public struct SweptRegistrations: Sendable {
    /// The registrations found matching, as ids of state's table.
    public var ids: TokenSet
    /// When they were read (seconds since 1970).
    public var at: Int64

    /// nil when the plan swept nothing; tokens state does not know are ignored.
    init?(plan: Plan, state: State) {
        guard let tokens = plan.sweptMatching, !tokens.isEmpty, let at = plan.coverage?.at else { return nil }
        ids = TokenSet(tokens.compactMap { state.tokens.id($0) })
        self.at = at
    }
}
