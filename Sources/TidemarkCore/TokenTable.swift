/// Interns registration tokens as dense integer ids, so sets of members are arrays of `UInt32`.
///
/// At a million devices and five million memberships, strings in every set would cost gigabytes;
/// ids keep the planner's working set small and its set operations linear merges.
public struct TokenTable: Sendable {
    public private(set) var tokens: [String] = []
    private var index = StringIndex()

    public init() {}

    public var count: Int { tokens.count }

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

    public func id(_ token: String) -> UInt32? { index.find(token, in: tokens).map { UInt32($0) } }

    public subscript(id: UInt32) -> String { tokens[Int(id)] }
}
