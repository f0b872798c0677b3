/// The devices tidemark knows by a stable id, stored column-wise to stay small at a million rows.
public struct Inventory: Sendable {
    /// Each device's id, by index.
    public private(set) var deviceIDs: [String] = []
    /// Each device's token, by index.
    public private(set) var tokens: [String] = []
    /// Label names, and for each name its distinct values.
    public private(set) var labelKeys: [String] = []
    private var keyIndex: [String: Int] = [:]
    private var labelValues: [[String]] = []
    /// Per label, each value's position in `labelValues` (a value's number is its position + 1).
    private var valueIndex: [StringIndex] = []
    /// Per label name, per device: 0 when the device has no such label, else the value's index + 1.
    private var columns: [[UInt32]] = []
    /// Where each device was declared: index into `sources` and line.
    public private(set) var sources: [String] = []
    private var sourceOfDevice: [UInt16] = []
    private var lineOfDevice: [UInt32] = []
    private var columnOfDevice: [UInt32] = []
    private var indexByID = StringIndex()
    private var indexByToken = StringIndex()

    /// An empty inventory.
    public init() {}

    /// How many devices it holds.
    public var count: Int { deviceIDs.count }

    /// The index of the device with id `id`, if listed.
    public func index(ofDevice id: String) -> Int? { indexByID.find(id, in: deviceIDs) }
    /// The index of the device with `token`, if listed.
    public func index(ofToken token: String) -> Int? { indexByToken.find(token, in: tokens) }

    /// Where the device at `index` was read: file, line and column.
    public func location(ofDevice index: Int) -> SourceLocation {
        SourceLocation(
            file: sources[Int(sourceOfDevice[index])], line: Int(lineOfDevice[index]),
            column: Int(columnOfDevice[index]))
    }

    /// The value of label `key` of the device at `index`; nil when it has none.
    public func label(_ key: String, ofDevice index: Int) -> String? {
        guard let k = keyIndex[key] else { return nil }
        let v = columns[k][index]
        return v == 0 ? nil : labelValues[k][Int(v - 1)]
    }

    /// The distinct values label `key` takes, in the order first seen.
    public func values(ofLabel key: String) -> [String] { keyIndex[key].map { labelValues[$0] } ?? [] }

    mutating func source(_ file: String) -> UInt16 {
        if let i = sources.firstIndex(of: file) { return UInt16(i) }
        sources.append(file)
        return UInt16(sources.count - 1)
    }

    mutating func reserveCapacity(_ n: Int) {
        deviceIDs.reserveCapacity(n)
        tokens.reserveCapacity(n)
        indexByID.reserveCapacity(n, keys: deviceIDs)
        indexByToken.reserveCapacity(n, keys: tokens)
        sourceOfDevice.reserveCapacity(n)
        lineOfDevice.reserveCapacity(n)
        columnOfDevice.reserveCapacity(n)
    }

    /// Adds a device; returns the index of an earlier device with the same id or token when there is one.
    mutating func add(
        id: String, token: String, labels: some Sequence<(String, String)>, source: UInt16, line: Int,
        column: Int = 1
    ) -> Conflict? {
        var slots: [(Int, String)] = []
        for (key, value) in labels { slots.append((labelSlot(key), value)) }
        return add(id: id, token: token, slots: slots, source: source, line: line, column: column, reuse: nil)
    }

    /// The column of a label name, created when new; lets bulk loaders resolve names once per file.
    mutating func labelSlot(_ key: String) -> Int {
        if let existing = keyIndex[key] { return existing }
        let k = labelKeys.count
        labelKeys.append(key)
        keyIndex[key] = k
        labelValues.append([])
        valueIndex.append(StringIndex())
        columns.append([UInt32](repeating: 0, count: deviceIDs.count))
        return k
    }

    /// Adds a device with labels given by column (from `labelSlot`); its token and id are the strings
    /// `reuse` keeps when it has the same.
    mutating func add(
        id: String, token: String, slots: some Sequence<(Int, String)>, source: UInt16, line: Int,
        column: Int = 1, reuse: StringReuse?
    ) -> Conflict? {
        let conflict = StringIndex.withBytes(token) { bytes in
            append(
                id: id, token: bytes, tokenHash: StringIndex.hash(bytes: bytes), made: { token }, source: source,
                line: line, column: column, reuse: reuse)
        }
        if conflict != nil { return conflict }
        for (slot, value) in slots where !value.isEmpty {
            setLabel(slot, value, device: deviceIDs.count - 1)
        }
        return nil
    }

    /// `add` for a row read from raw bytes (a CSV line without quotes): the token, already checked as
    /// a shape FCM issues (so ASCII), and ASCII label values are hashed and looked up in place; strings
    /// are made only for what is kept. `fields` are byte ranges of `row`; `labels` pairs a label's slot
    /// with its field.
    mutating func add(
        id: String, token: UnsafeBufferPointer<UInt8>, tokenHash: UInt64?, row: UnsafeBufferPointer<UInt8>,
        fields: [Range<Int>], labels: [(slot: Int, field: Int)], source: UInt16, line: Int, column: Int,
        reuse: StringReuse?
    ) -> Conflict? {
        if let conflict = append(
            id: id, token: token, tokenHash: tokenHash ?? StringIndex.hash(bytes: token),
            made: { String(decoding: token, as: UTF8.self) }, source: source, line: line, column: column,
            reuse: reuse)
        {
            return conflict
        }
        let index = deviceIDs.count - 1
        for (slot, field) in labels {
            let value = UnsafeBufferPointer(rebasing: row[fields[field]])
            if value.isEmpty { continue }
            if Self.isASCII(value) {
                setLabel(slot, bytes: value, device: index)
            } else {
                // Bytes that are not ASCII may not be UTF-8: the string made of them (repaired) is the key.
                setLabel(slot, String(decoding: value, as: UTF8.self), device: index)
            }
        }
        return nil
    }

    /// Indexes and appends a device, without labels, unless its id or token is known (that conflict is
    /// returned). One probe each: the id's free slot is filled only once the token is known to be new.
    /// `made` makes the token's string, only when the device is kept and `reuse` has no string for it.
    private mutating func append(
        id: String, token: UnsafeBufferPointer<UInt8>, tokenHash: UInt64, made: () -> String, source: UInt16,
        line: Int, column: Int, reuse: StringReuse?
    ) -> Conflict? {
        let index = deviceIDs.count
        let idSlot = indexByID.probe(id, in: deviceIDs)
        if case .found(let existing) = idSlot { return .duplicateID(existing) }
        let tokenSlot = indexByToken.probe(bytes: token, hash: tokenHash, in: tokens)
        if case .found(let existing) = tokenSlot { return .duplicateToken(existing) }
        indexByToken.fill(tokenSlot, position: index)
        indexByID.fill(idSlot, position: index)
        if let reuse, let kept = reuse.token(bytes: token, hash: tokenHash) {
            deviceIDs.append(reuse.deviceID(id, ofToken: kept.id))
            tokens.append(kept.token)
        } else {
            deviceIDs.append(id)
            tokens.append(made())
        }
        sourceOfDevice.append(source)
        lineOfDevice.append(UInt32(line))
        columnOfDevice.append(UInt32(column))
        for k in columns.indices { columns[k].append(0) }
        return nil
    }

    /// Makes each token the string `reuse` keeps with the same bytes, where it keeps one: a reading kept
    /// in memory then holds one string per token, not one in state and another here.
    mutating func shareTokens(with reuse: StringReuse) {
        for i in tokens.indices { tokens[i] = reuse.token(tokens[i]) }
    }

    /// Starts loading the index slots a later `add` of this id and token probes first.
    /// Returns the token's hash, for that `add`.
    func prefetch(id: UnsafeBufferPointer<UInt8>, token: UnsafeBufferPointer<UInt8>) -> UInt64 {
        indexByID.prefetch(hash: StringIndex.hash(bytes: id))
        let hash = StringIndex.hash(bytes: token)
        indexByToken.prefetch(hash: hash)
        return hash
    }

    /// Whether every byte is below 0x80: such bytes are their own string's UTF-8, as hashed and compared.
    static func isASCII(_ bytes: UnsafeBufferPointer<UInt8>) -> Bool {
        var i = 0
        let n = bytes.count
        while i + 8 <= n {
            if UnsafeRawPointer(bytes.baseAddress! + i).loadUnaligned(as: UInt64.self) & 0x8080_8080_8080_8080 != 0 {
                return false
            }
            i += 8
        }
        while i < n {
            if bytes[i] >= 0x80 { return false }
            i += 1
        }
        return true
    }

    private mutating func setLabel(_ k: Int, bytes value: UnsafeBufferPointer<UInt8>, device: Int) {
        let v: UInt32
        let probe = valueIndex[k].probe(bytes: value, hash: StringIndex.hash(bytes: value), in: labelValues[k])
        if case .found(let existing) = probe {
            v = UInt32(existing + 1)
        } else {
            valueIndex[k].fill(probe, position: labelValues[k].count)
            labelValues[k].append(String(decoding: value, as: UTF8.self))
            v = UInt32(labelValues[k].count)
        }
        columns[k][device] = v
    }

    enum Conflict {
        case duplicateID(Int)
        case duplicateToken(Int)
    }

    private mutating func setLabel(_ k: Int, _ value: String, device: Int) {
        StringIndex.withBytes(value) { setLabel(k, bytes: $0, device: device) }
    }

    /// Device indices per value of one label (index = value index), built in one pass over the column.
    func postings(forLabel key: String) -> [[Int32]]? {
        guard let k = keyIndex[key] else { return nil }
        var lists = [[Int32]](repeating: [], count: labelValues[k].count)
        for (device, v) in columns[k].enumerated() where v != 0 {
            lists[Int(v - 1)].append(Int32(device))
        }
        return lists
    }

    func valueNumber(_ key: String, _ value: String) -> Int? {
        guard let k = keyIndex[key] else { return nil }
        return valueIndex[k].find(value, in: labelValues[k])
    }
}

extension Inventory {
    /// Names a token's device for human output ("device d42"), when the inventory knows it.
    public var deviceNamer: @Sendable (String) -> String? {
        let inventory = self
        return { token in inventory.index(ofToken: token).map { "device \(inventory.deviceIDs[$0])" } }
    }

    /// Names the device of a token as `Redaction.redact` shows it (a sealed plan read without its key).
    public var redactedDeviceNamer: @Sendable (String) -> String? {
        var devices: [String: String] = [:]
        devices.reserveCapacity(tokens.count)
        for (index, token) in tokens.enumerated() { devices[Redaction.redact(token)] = deviceIDs[index] }
        let named = devices
        return { redacted in named[redacted].map { "device \($0)" } }
    }
}
