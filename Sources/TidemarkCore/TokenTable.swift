/// Interns registration tokens as dense integer ids, so sets of members are arrays of `UInt32`.
///
/// At a million devices and five million memberships, strings in every set would cost gigabytes;
/// ids keep the planner's working set small and its set operations linear merges.
public struct TokenTable: Sendable {
    public private(set) var tokens: [String] = []
    private var ids: [String: UInt32] = [:]

    public init() {}

    public var count: Int { tokens.count }

    public mutating func reserveCapacity(_ n: Int) {
        tokens.reserveCapacity(n)
        ids.reserveCapacity(n)
    }

    /// The id of `token`, adding it when new.
    @discardableResult
    public mutating func intern(_ token: String) -> UInt32 {
        if let id = ids[token] { return id }
        let id = UInt32(tokens.count)
        tokens.append(token)
        ids[token] = id
        return id
    }

    public func id(_ token: String) -> UInt32? { ids[token] }

    public subscript(id: UInt32) -> String { tokens[Int(id)] }
}
