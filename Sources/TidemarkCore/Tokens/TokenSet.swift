/// A set of token ids kept as a sorted array without duplicates.
///
/// Union, intersection and difference are linear merges; membership is a binary search.
public struct TokenSet: Sendable, Equatable, Sequence {
    /// The ids, sorted, without duplicates.
    public private(set) var ids: [UInt32]

    /// The empty set.
    public init() { ids = [] }

    /// From ids in any order, possibly repeated.
    public init(_ ids: some Sequence<UInt32>) {
        var array = Array(ids)
        // Often already in order (devices resolved in the order state met them): checked in one pass.
        if zip(array, array.dropFirst()).allSatisfy({ $0 < $1 }) {
            self.ids = array
            return
        }
        array.sort()
        var write = 0
        for read in array.indices where read == 0 || array[read] != array[read - 1] {
            array[write] = array[read]
            write += 1
        }
        array.removeLast(array.count - write)
        self.ids = array
    }

    /// From ids already sorted and unique; checked in debug builds.
    public init(sorted ids: [UInt32]) {
        assert(zip(ids, ids.dropFirst()).allSatisfy { $0 < $1 })
        self.ids = ids
    }

    /// How many ids the set holds.
    public var count: Int { ids.count }
    /// Whether the set holds no id.
    public var isEmpty: Bool { ids.isEmpty }
    /// The ids in ascending order.
    public func makeIterator() -> IndexingIterator<[UInt32]> { ids.makeIterator() }

    /// Whether `id` is in the set (a binary search).
    public func contains(_ id: UInt32) -> Bool {
        var low = 0
        var high = ids.count
        while low < high {
            let mid = (low + high) / 2
            if ids[mid] < id { low = mid + 1 } else { high = mid }
        }
        return low < ids.count && ids[low] == id
    }

    /// The ids in either set (a linear merge).
    public func union(_ other: TokenSet) -> TokenSet {
        if other.isEmpty { return self }
        if isEmpty { return other }
        var result: [UInt32] = []
        result.reserveCapacity(ids.count + other.ids.count)
        var i = 0
        var j = 0
        let a = ids
        let b = other.ids
        while i < a.count, j < b.count {
            if a[i] < b[j] {
                result.append(a[i])
                i += 1
            } else if a[i] > b[j] {
                result.append(b[j])
                j += 1
            } else {
                result.append(a[i])
                i += 1
                j += 1
            }
        }
        result.append(contentsOf: a[i...])
        result.append(contentsOf: b[j...])
        return TokenSet(sorted: result)
    }

    /// The ids in both sets. When one set is far smaller than the other (the devices of a change
    /// against a topic), each of its ids is looked up instead of merging the two.
    public func intersection(_ other: TokenSet) -> TokenSet {
        if ids.count > 32 * other.ids.count { return TokenSet(sorted: other.ids.filter { contains($0) }) }
        if other.ids.count > 32 * ids.count { return TokenSet(sorted: ids.filter { other.contains($0) }) }
        return TokenSet(sorted: Self.intersection(ids, other.ids))
    }

    /// This set with the ids of `removing` taken out and those of `adding` put in. A few ids are
    /// moved in place (a binary search each); many are merged.
    public func replacing(_ removing: TokenSet, with adding: TokenSet) -> TokenSet {
        guard 32 * (removing.count + adding.count) < ids.count else {
            return subtracting(removing).union(adding)
        }
        var result = ids
        for id in removing {
            let at = Self.position(of: id, in: result)
            if at < result.count, result[at] == id { result.remove(at: at) }
        }
        for id in adding {
            let at = Self.position(of: id, in: result)
            if at == result.count || result[at] != id { result.insert(id, at: at) }
        }
        return TokenSet(sorted: result)
    }

    /// Where `id` is, or would be inserted, in the ascending `ids`.
    private static func position(of id: UInt32, in ids: [UInt32]) -> Int {
        var low = 0
        var high = ids.count
        while low < high {
            let mid = (low + high) / 2
            if ids[mid] < id { low = mid + 1 } else { high = mid }
        }
        return low
    }

    /// The values in both of two ascending arrays, ascending (one merge pass).
    static func intersection<T: Comparable>(_ a: [T], _ b: [T]) -> [T] {
        var result: [T] = []
        var i = 0
        var j = 0
        while i < a.count, j < b.count {
            if a[i] < b[j] {
                i += 1
            } else if a[i] > b[j] {
                j += 1
            } else {
                result.append(a[i])
                i += 1
                j += 1
            }
        }
        return result
    }

    /// The ids in this set and not in `other`.
    public func subtracting(_ other: TokenSet) -> TokenSet {
        if other.isEmpty || isEmpty { return self }
        var result: [UInt32] = []
        result.reserveCapacity(ids.count)
        var i = 0
        var j = 0
        let a = ids
        let b = other.ids
        while i < a.count {
            if j >= b.count || a[i] < b[j] {
                result.append(a[i])
                i += 1
            } else if a[i] > b[j] {
                j += 1
            } else {
                i += 1
                j += 1
            }
        }
        return TokenSet(sorted: result)
    }

    /// Adds the ids of `other`.
    public mutating func formUnion(_ other: TokenSet) { self = union(other) }
    /// Removes the ids of `other`.
    public mutating func subtract(_ other: TokenSet) { self = subtracting(other) }

    /// The union of many sets, merged pairwise so the cost stays near n log k.
    public static func union(of sets: [TokenSet]) -> TokenSet {
        var layer = sets.filter { !$0.isEmpty }
        if layer.isEmpty { return TokenSet() }
        while layer.count > 1 {
            var next: [TokenSet] = []
            next.reserveCapacity((layer.count + 1) / 2)
            var index = 0
            while index + 1 < layer.count {
                next.append(layer[index].union(layer[index + 1]))
                index += 2
            }
            if index < layer.count { next.append(layer[index]) }
            layer = next
        }
        return layer[0]
    }
}
