import CShims
import Foundation

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

    static let seed: UInt64 = UInt64.random(in: 1...UInt64.max)

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
        Self.withBytes(key) {
            find(bytes: $0, hash: Self.hash(bytes: $0), in: keys)
        }
    }

    /// `find` for a key given as its UTF-8 bytes and `hash(bytes:)` of them, so that a reader of raw
    /// input makes no string for a key it only looks up.
    func find(bytes key: UnsafeBufferPointer<UInt8>, hash: UInt64, in keys: [String]) -> Int? {
        guard !slots.isEmpty else { return nil }
        let tag = hash >> 32
        var i = Int(tag) & mask
        while true {
            let slot = slots[i]
            if slot == 0 { return nil }
            if slot >> 32 == tag {
                let position = Int(slot & 0xFFFF_FFFF) - 1
                if Self.equal(keys[position], key) { return position }
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
        Self.withBytes(key) {
            probe(bytes: $0, hash: Self.hash(bytes: $0), in: keys)
        }
    }

    /// `probe` for a key given as its UTF-8 bytes and `hash(bytes:)` of them.
    mutating func probe(bytes key: UnsafeBufferPointer<UInt8>, hash: UInt64, in keys: [String]) -> Probe {
        if (count + 1) * 2 > slots.count { rehash(Self.slotCount(for: max(count + 1, slots.count)), keys: keys) }
        let tag = hash >> 32
        var i = Int(tag) & mask
        while true {
            let slot = slots[i]
            if slot == 0 { return .free(slot: i, tag: tag) }
            if slot >> 32 == tag {
                let existing = Int(slot & 0xFFFF_FFFF) - 1
                if Self.equal(keys[existing], key) { return .found(existing) }
            }
            i = (i + 1) & mask
        }
    }

    /// Starts loading the slot where a probe for a key of this `hash(bytes:)` begins, so that a probe
    /// made a little later does not wait on memory (at a million keys the slots are 16 MB).
    @inline(__always)
    func prefetch(hash: UInt64) {
        guard !slots.isEmpty else { return }
        slots.withUnsafeBufferPointer { tidemark_prefetch($0.baseAddress! + (Int(hash >> 32) & mask)) }
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
        switch probe(key, in: keys) {
        case .found(let existing): return existing
        case let free:
            fill(free, position: position)
            return nil
        }
    }

    /// Whether `key` holds exactly `bytes` (keys are compared as UTF-8, as they are hashed).
    @inline(__always)
    static func equal(_ key: String, _ bytes: UnsafeBufferPointer<UInt8>) -> Bool {
        withBytes(key) { stored in
            stored.count == bytes.count
                && (stored.count == 0 || memcmp(stored.baseAddress!, bytes.baseAddress!, stored.count) == 0)
        }
    }

    /// Calls `body` with the UTF-8 bytes of `key` (in place for native strings).
    @inline(__always)
    static func withBytes<R>(_ key: String, _ body: (UnsafeBufferPointer<UInt8>) -> R) -> R {
        if let result = key.utf8.withContiguousStorageIfAvailable(body) { return result }
        return Array(key.utf8).withUnsafeBufferPointer(body)
    }

    private mutating func resize(_ size: Int) {
        slots = Self.zeroedSlots(size)
        mask = size - 1
    }

    /// `size` empty slots. A large table asks the kernel for huge pages first: its probes land at
    /// random, and with 4 KiB pages nearly each one also misses the TLB.
    private static func zeroedSlots(_ size: Int) -> [UInt64] {
        let bytes = size * MemoryLayout<UInt64>.stride
        guard bytes >= 4 << 20 else { return [UInt64](repeating: 0, count: size) }
        return [UInt64](unsafeUninitializedCapacity: size) { buffer, initialized in
            let start = UInt(bitPattern: buffer.baseAddress!)
            let huge: UInt = 2 << 20
            let alignedStart = (start + huge - 1) & ~(huge - 1)
            let alignedEnd = (start + UInt(bytes)) & ~(huge - 1)
            if alignedEnd > alignedStart {
                _ = madvise(
                    UnsafeMutableRawPointer(bitPattern: alignedStart), Int(alignedEnd - alignedStart), MADV_HUGEPAGE)
            }
            memset(buffer.baseAddress!, 0, bytes)
            initialized = size
        }
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
        withBytes(key) { hash(bytes: UnsafeRawBufferPointer($0), seed: seed) }
    }

    /// The hash `find(bytes:hash:in:)` and its kin take: this process's seed over `bytes`.
    static func hash(bytes: UnsafeBufferPointer<UInt8>) -> UInt64 {
        hash(bytes: UnsafeRawBufferPointer(bytes), seed: seed)
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
