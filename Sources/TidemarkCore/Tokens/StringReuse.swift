/// The registration tokens and device ids the last whole read kept, for the next whole read to reuse
/// where it reads the same ones.
///
/// `serve` keeps a whole read in memory until the next one (its warm plan). A whole read makes every
/// token and device id it keeps anew, a million strings of 150-odd bytes, and allocates them while the
/// previous reading and the read's own short-lived buffers still hold the heap: once the old reading
/// is freed, the new one's strings are spread over pages the allocator cannot give back, and the
/// resident size steps up with every resync. Reusing the kept strings, the read's new allocations are
/// the changed tokens and short-lived buffers only, so what a resync frees goes back to the system;
/// and state and inventory then share one string for each token instead of holding one each.
///
/// Set for a whole read with `StringReuse.$current.withValue(_:operation:)`; the state stores and the
/// inventory read it when they start loading. A string is reused only when it is the same bytes.
public struct StringReuse: Sendable {
    /// The tokens and devices of the last whole read's state.
    let registry: TokenRegistry

    /// The strings `registry` (state's tokens and their devices, as the last whole read left them) holds.
    public init(_ registry: TokenRegistry) { self.registry = registry }

    /// The strings a whole read in this task may reuse; nil outside `serve`'s whole reads.
    @TaskLocal public static var current: StringReuse?

    /// `token`, or the kept string with the same bytes; `id` is where state stored it (ids are stable, so
    /// that is looked at first, before the token's hash).
    public func token(_ token: String, id: Int) -> String {
        if id >= 0, id < registry.count {
            let kept = registry.table.tokens[id]
            if Self.same(kept, token) { return kept }
        }
        return self.token(token)
    }

    /// `token`, or the kept string with the same bytes.
    public func token(_ token: String) -> String {
        registry.table.id(token).map { registry.table[$0] } ?? token
    }

    /// The kept token with these bytes (hashed as `StringIndex.hash(bytes:)`), and its id; nil when none is.
    func token(bytes: UnsafeBufferPointer<UInt8>, hash: UInt64) -> (token: String, id: Int)? {
        registry.table.find(bytes: bytes, hash: hash).map { (registry.table.tokens[$0], $0) }
    }

    /// `deviceID`, or the kept string with the same bytes when it is the device state recorded for the
    /// token with `id`.
    public func deviceID(_ deviceID: String, ofToken id: Int) -> String {
        guard id >= 0, id < registry.count else { return deviceID }
        let kept = registry.deviceIDs[id]
        return Self.same(kept, deviceID) ? kept : deviceID
    }

    /// Whether the two strings are the same bytes (`==` also equates other spellings of the same text,
    /// such as a letter with its accent composed or apart, which an id or token must not be taken for).
    static func same(_ a: String, _ b: String) -> Bool {
        StringIndex.withBytes(b) { StringIndex.equal(a, $0) }
    }
}
