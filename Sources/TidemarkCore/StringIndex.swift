/// An index from strings to their positions in an array the caller keeps: open addressing over one
/// `[UInt64]` of (hash, position) slots, at most half full (so at most 2^31 slots' worth of keys).
///
/// At a million registration tokens of 150+ bytes, `[String: Int]` spends most of its time in SipHash
/// and in the string comparisons of its probes; this hashes eight bytes a step, keeps 32 bits of each
/// hash in its slot so a probe compares strings only on a likely match, and stores no second copy
/// of the keys. Seeded per process, so crafted inputs cannot aim for collisions across runs.
struct StringIndex: Sendable {
    /// 0 when empty; else the key's hash in the high 32 bits and its position + 1 in the low 32.
    private var slots: [UInt64] = []
    private var mask = 0
    private(set) var count = 0

    private static let seed: UInt64 = UInt64.random(in: 1...UInt64.max)

    init(capacity: Int = 0) {
        if capacity > 0 { resize(Self.slotCount(for: capacity)) }
    }

    private static func slotCount(for n: Int) -> Int {
        var size = 16
        while size < n * 2 { size <<= 1 }
        return size
    }

    mutating func reserveCapacity(_ n: Int, keys: [String]) {
        if slots.count < n * 2 { rehash(Self.slotCount(for: n), keys: keys) }
    }

    /// The position of `key` in `keys`, when indexed.
    func find(_ key: String, in keys: [String]) -> Int? {
        guard !slots.isEmpty else { return nil }
        let tag = Self.hash(key) >> 32
        var i = Int(tag) & mask
        while true {
            let slot = slots[i]
            if slot == 0 { return nil }
            if slot >> 32 == tag {
                let position = Int(slot & 0xFFFF_FFFF) - 1
                if keys[position] == key { return position }
            }
            i = (i + 1) & mask
        }
    }

    /// Where a probe for a key ended: at the key, or at the free slot it would take.
    enum Probe {
        case found(Int)
        case free(slot: Int, tag: UInt64)
    }

    /// Looks `key` up, making room first, so that `fill` can index it at the free slot found without
    /// probing again. Nothing else may change this index between the two.
    mutating func probe(_ key: String, in keys: [String]) -> Probe {
        if (count + 1) * 2 > slots.count { rehash(Self.slotCount(for: max(count + 1, slots.count)), keys: keys) }
        let tag = Self.hash(key) >> 32
        var i = Int(tag) & mask
        while true {
            let slot = slots[i]
            if slot == 0 { return .free(slot: i, tag: tag) }
            if slot >> 32 == tag {
                let existing = Int(slot & 0xFFFF_FFFF) - 1
                if keys[existing] == key { return .found(existing) }
            }
            i = (i + 1) & mask
        }
    }

    /// Indexes the key of a `probe` that found it absent at `position`.
    mutating func fill(_ probe: Probe, position: Int) {
        guard case .free(let i, let tag) = probe else { return }
        slots[i] = tag << 32 | UInt64(position + 1)
        count += 1
    }

    /// Indexes `key` at `position` unless it is indexed already; returns the earlier position then.
    /// `keys` must hold every position indexed so far (the new one need not be there yet).
    mutating func insert(_ key: String, at position: Int, keys: [String]) -> Int? {
        if (count + 1) * 2 > slots.count { rehash(Self.slotCount(for: max(count + 1, slots.count)), keys: keys) }
        let tag = Self.hash(key) >> 32
        var i = Int(tag) & mask
        while true {
            let slot = slots[i]
            if slot == 0 {
                slots[i] = tag << 32 | UInt64(position + 1)
                count += 1
                return nil
            }
            if slot >> 32 == tag {
                let existing = Int(slot & 0xFFFF_FFFF) - 1
                if keys[existing] == key { return existing }
            }
            i = (i + 1) & mask
        }
    }

    private mutating func resize(_ size: Int) {
        slots = [UInt64](repeating: 0, count: size)
        mask = size - 1
    }

    /// Moves every slot to a table of `size`: a slot's home is its hash's high 32 bits (what it
    /// keeps), so no key is read or hashed again.
    private mutating func rehash(_ size: Int, keys: [String]) {
        let old = slots
        resize(size)
        for slot in old where slot != 0 {
            var i = Int(slot >> 32) & mask
            while slots[i] != 0 { i = (i + 1) & mask }
            slots[i] = slot
        }
    }

    /// A 64-bit hash of the UTF-8 bytes, eight at a time, seeded per process.
    static func hash(_ key: String) -> UInt64 { hash(key, seed: seed) }

    /// The same hash with a given seed: stable across runs (for digests) with a fixed one.
    static func hash(_ key: String, seed: UInt64) -> UInt64 {
        if let h = key.utf8.withContiguousStorageIfAvailable({ hash(bytes: UnsafeRawBufferPointer($0), seed: seed) }) {
            return h
        }
        return Array(key.utf8).withUnsafeBytes { hash(bytes: $0, seed: seed) }
    }

    static func hash(bytes: UnsafeRawBufferPointer, seed: UInt64) -> UInt64 {
        var h = seed ^ (UInt64(bytes.count) &* 0x9E37_79B9_7F4A_7C15)
        var offset = 0
        let n = bytes.count
        while offset + 8 <= n {
            let word = bytes.loadUnaligned(fromByteOffset: offset, as: UInt64.self)
            h = (h ^ word) &* 0x9E37_79B9_7F4A_7C15
            h ^= h >> 29
            offset += 8
        }
        if offset < n {
            var tail: UInt64 = 0
            for k in offset..<n { tail |= UInt64(bytes[k]) << (UInt64(k - offset) * 8) }
            h = (h ^ tail) &* 0x9E37_79B9_7F4A_7C15
            h ^= h >> 29
        }
        return mix(h)
    }

    /// SplitMix64's finaliser.
    @inline(__always) static func mix(_ value: UInt64) -> UInt64 {
        var z = value
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
