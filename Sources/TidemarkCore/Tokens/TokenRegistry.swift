/// Something tokens are interned into: a bare `TokenTable` (resolving manifests alone), a
/// `TokenRegistry`, or a `State` (resolving manifests into the ids state already uses).
public protocol TokenInterning {
    /// How many tokens are interned (the next id).
    var count: Int { get }
    /// The interned tokens, to read (a copy shares the storage until either changes).
    var table: TokenTable { get }
    /// The id of `token`, or nil when it is not interned.
    func id(_ token: String) -> UInt32?
    /// The token with `id` (which must be interned).
    func token(_ id: UInt32) -> String
    /// The id of `token`, adding it when new.
    @discardableResult mutating func intern(_ token: String) -> UInt32
    /// Makes room for `n` tokens in all, so interning that many grows nothing.
    mutating func reserveCapacity(_ n: Int)
}

extension TokenTable: TokenInterning {
    /// The token with `id`.
    public func token(_ id: UInt32) -> String { self[id] }
    /// The table itself.
    public var table: TokenTable { self }
}

/// State's token table and what it keeps per token. Interning a token gives it a row in every
/// column, so the columns always have the table's length and nothing has to grow them afterwards.
///
/// Tokens are only ever added (ids stay valid for every `TokenSet` that holds them); `State.removing`
/// builds a new registry when it forgets tokens.
public struct TokenRegistry: Sendable, TokenInterning {
    /// The tokens, interned.
    public private(set) var table = TokenTable()
    /// Seconds since 1970 when each token was last seen by a refresh or an apply; 0 = never.
    public private(set) var seenAt: [Int64] = []
    /// The inventory's device id of each token, as the last apply saw it ("" when unknown): how a
    /// token that left the inventory is recognised as a device's earlier token (a rotation).
    public private(set) var deviceIDs: [String] = []
    /// When each token stopped being declared (seconds since 1970; 0 while declared or never noted):
    /// `prune` forgets a token that left long enough ago.
    public private(set) var leftAt: [Int64] = []

    /// An empty registry.
    public init() {}

    /// A registry as a store holds it: tokens by id (0, 1, 2, …) and their columns. A column shorter
    /// than `tokens` (a file written before it existed) is filled with "never" and "unknown".
    ///
    /// Throws `RepeatedToken` when a token appears twice.
    public init(
        tokens: [String], seenAt: [Int64] = [], deviceIDs: [String] = [], leftAt: [Int64] = []
    ) throws(RepeatedToken) {
        precondition(
            seenAt.count <= tokens.count && deviceIDs.count <= tokens.count && leftAt.count <= tokens.count,
            "a token column is longer than the token table")
        if let offset = table.appendNew(tokens) {
            throw RepeatedToken(id: offset, earlier: table.id(tokens[offset]))
        }
        self.seenAt = seenAt
        self.deviceIDs = deviceIDs
        self.leftAt = leftAt
        fillColumns()
    }

    /// The first of `tokens` (by id) that is not a registration ID FCM could have issued, and why:
    /// a store holding one was edited or damaged, and nothing may be planned from it (a malformed
    /// token read as a device's would be planned as a rotation).
    public static func firstMalformed(_ tokens: [String]) -> (id: Int, problem: String)? {
        for (id, token) in tokens.enumerated() {
            if let problem = FCMLimits.tokenProblem(token) { return (id, problem) }
        }
        return nil
    }

    /// A token that appears twice in what a store holds.
    public struct RepeatedToken: Error, Sendable {
        /// The id of the second appearance.
        public var id: Int
        /// The id of the first.
        public var earlier: UInt32?
    }

    /// How many tokens are interned (the next id).
    public var count: Int { table.count }
    /// The tokens, by id.
    public var tokens: [String] { table.tokens }
    /// The token with `id`.
    public subscript(id: UInt32) -> String { table[id] }
    /// The token with `id`.
    public func token(_ id: UInt32) -> String { table[id] }
    /// The id of `token`, or nil when it is not interned.
    public func id(_ token: String) -> UInt32? { table.id(token) }

    /// Makes room for `n` tokens in all, in the table and every column.
    public mutating func reserveCapacity(_ n: Int) {
        table.reserveCapacity(n)
        seenAt.reserveCapacity(n)
        deviceIDs.reserveCapacity(n)
        leftAt.reserveCapacity(n)
    }

    /// The id of `token`, adding it (never seen, no device, not departed) when new.
    @discardableResult
    public mutating func intern(_ token: String) -> UInt32 {
        let id = table.intern(token)
        if Int(id) == seenAt.count {
            seenAt.append(0)
            deviceIDs.append("")
            leftAt.append(0)
        }
        return id
    }

    /// Records that `id` was seen at `at` (seconds since 1970; 0 = never).
    public mutating func setSeen(_ id: UInt32, at: Int64) { seenAt[Int(id)] = at }

    /// Records the device `id` belongs to ("" when unknown).
    public mutating func setDeviceID(_ id: UInt32, _ deviceID: String) { deviceIDs[Int(id)] = deviceID }

    /// Records when `id` stopped being declared (0: declared again).
    public mutating func setLeft(_ id: UInt32, at: Int64) { leftAt[Int(id)] = at }

    /// The device id of a token, when known.
    public func deviceID(of id: UInt32) -> String? { deviceIDs[Int(id)].isEmpty ? nil : deviceIDs[Int(id)] }

    /// Fills short columns. A column already long enough is not touched: appending even nothing would
    /// copy a million-row array the caller still shares.
    private mutating func fillColumns() {
        let n = table.count
        if seenAt.count < n { seenAt.append(contentsOf: repeatElement(0, count: n - seenAt.count)) }
        if deviceIDs.count < n { deviceIDs.append(contentsOf: repeatElement("", count: n - deviceIDs.count)) }
        if leftAt.count < n { leftAt.append(contentsOf: repeatElement(0, count: n - leftAt.count)) }
    }
}
