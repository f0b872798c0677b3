/// Interns registration tokens as dense integer ids, so sets of members are arrays of `UInt32`.
///
/// At a million devices and five million memberships, strings in every set would cost gigabytes;
/// ids keep the planner's working set small and its set operations linear merges.
public struct TokenTable: Sendable {
    /// The tokens, by id.
    public private(set) var tokens: [String] = []
    private var index = StringIndex()

    /// An empty table.
    public init() {}

    /// How many tokens the table holds (the next id).
    public var count: Int { tokens.count }

    /// Makes room for `n` tokens, so interning a million grows nothing.
    public mutating func reserveCapacity(_ n: Int) {
        tokens.reserveCapacity(n)
        index.reserveCapacity(n, keys: tokens)
    }

    /// The id of `token`, adding it when new.
    @discardableResult
    public mutating func intern(_ token: String) -> UInt32 {
        let position = tokens.count
        if let existing = index.insert(token, at: position, keys: tokens) { return UInt32(existing) }
        tokens.append(token)
        return UInt32(position)
    }

    /// Adds `more` (none of which may be known yet) with the ids that follow, in order; returns the
    /// offset in `more` of the first token already known or repeated, adding nothing from there on.
    /// Made for loading a million tokens: each probe's slot is loaded a few tokens ahead.
    public mutating func appendNew(_ more: [String]) -> Int? {
        let base = tokens.count
        reserveCapacity(base + more.count)
        let lookahead = 8
        var hashes = [UInt64](repeating: 0, count: lookahead)
        func hash(_ i: Int) -> UInt64 { StringIndex.hash(more[i]) }
        for i in 0..<min(lookahead, more.count) {
            hashes[i] = hash(i)
            index.prefetch(hash: hashes[i])
        }
        tokens.append(contentsOf: more)
        for i in more.indices {
            let h = hashes[i % lookahead]
            if i + lookahead < more.count {
                let next = hash(i + lookahead)
                hashes[i % lookahead] = next
                index.prefetch(hash: next)
            }
            let probe = StringIndex.withBytes(more[i]) { index.probe(bytes: $0, hash: h, in: tokens) }
            if case .found = probe {
                tokens.removeSubrange((base + i)...)
                return i
            }
            index.fill(probe, position: base + i)
        }
        return nil
    }

    /// The id of `token`, or nil when it is not interned.
    public func id(_ token: String) -> UInt32? { index.find(token, in: tokens).map { UInt32($0) } }

    /// The id of the token with these bytes (hashed as `StringIndex.hash(bytes:)`); nil when none is.
    func find(bytes: UnsafeBufferPointer<UInt8>, hash: UInt64) -> Int? {
        index.find(bytes: bytes, hash: hash, in: tokens)
    }

    /// The token with `id`.
    public subscript(id: UInt32) -> String { tokens[Int(id)] }
}
