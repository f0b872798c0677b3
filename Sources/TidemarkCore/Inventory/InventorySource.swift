import Foundation

/// Where devices come from: a file, inline devices, a database, a command.
///
/// A source streams its devices into an `InventoryBuilder`, which checks each one (a valid token,
/// no device or token twice) and reports problems with their place; the source reports problems
/// of its own (a row it cannot parse) through the builder too, and throws only when it cannot be
/// read at all. Every source passes `TidemarkTesting.InventorySourceConformance`.
public protocol InventorySource: Sendable {
    /// How the source is named in messages, and its key in the manifests digest.
    var name: String { get }

    /// Streams every device into `builder`, and says which snapshot of the source it read.
    func load(into builder: inout InventoryBuilder) async throws -> InventorySnapshot

    /// Where the source is declared (tidemark.yaml's line), for messages; nil for manifests' files.
    var declaredAt: SourceLocation? { get }
}

extension InventorySource {
    /// Sources of the manifests are declared nowhere else.
    public var declaredAt: SourceLocation? { nil }
}

/// Which version of a source a load read: a saved plan made from another snapshot is stale.
public struct InventorySnapshot: Sendable, Equatable, Codable {
    /// A digest of what was read (a file's SHA-256, or `DeviceDigest` of a query's devices).
    public var identity: String
    /// Rows (devices) read, and how many of them a policy (`exclude_if`) left out; nil when not counted.
    public var rows: Int?
    /// Rows a policy (`exclude_if`) left out; nil when not counted.
    public var excluded: Int?

    /// A snapshot with a digest of what was read.
    public init(identity: String, rows: Int? = nil, excluded: Int? = nil) {
        self.identity = identity
        self.rows = rows
        self.excluded = excluded
    }
}

/// An order-independent digest of devices (a query without ORDER BY may return rows in any order):
/// each device's id, token and labels are hashed on their own and the hashes summed.
public struct DeviceDigest: Sendable {
    private var sum: (UInt64, UInt64) = (0, 0)
    private var mix: UInt64 = 0
    /// Devices added so far.
    public private(set) var count = 0

    /// A digest of no devices.
    public init() {}

    /// One 64-bit multiply-mix hash of a string's bytes, eight at a time.
    @inline(__always)
    private static func mix(_ state: inout UInt64, _ text: String) {
        var text = text
        text.withUTF8 { bytes in
            var i = 0
            let count = bytes.count
            while i + 8 <= count {
                let word = UnsafeRawPointer(bytes.baseAddress! + i).loadUnaligned(as: UInt64.self)
                state = (state ^ word) &* 0x9e37_79b9_7f4a_7c15
                state ^= state >> 29
                i += 8
            }
            var tail: UInt64 = UInt64(count) << 56
            var shift: UInt64 = 0
            while i < count {
                tail |= UInt64(bytes[i]) << shift
                shift += 8
                i += 1
            }
            state = (state ^ tail) &* 0xbf58_476d_1ce4_e5b9
            state ^= state >> 31
        }
    }

    @inline(__always)
    private static func finish(_ x: UInt64) -> UInt64 {
        var z = x &+ 0x9e37_79b9_7f4a_7c15
        z = (z ^ (z >> 30)) &* 0xbf58_476d_1ce4_e5b9
        z = (z ^ (z >> 27)) &* 0x94d0_49bb_1331_11eb
        return z ^ (z >> 31)
    }

    /// Adds one device; `labels` in a fixed order (by name).
    public mutating func add(id: String, token: String, labels: [(String, String)]) {
        add(id: id, token: token, values: labels.flatMap { [$0.0, $0.1] })
    }

    /// Adds one device whose label values come in a fixed column order.
    public mutating func add(id: String, token: String, values: [String]) {
        add(Self.hash(id: id, token: token, values: values.map { $0 }))
    }

    /// One device's hash, computed apart and added with `add(_:)`; values from `first` on are the
    /// labels (nil as empty). Concrete types, so that other modules call specialized code.
    public static func hash(id: String, token: String, values: [String?], from first: Int = 0) -> UInt64 {
        var a: UInt64 = 0xcbf2_9ce4_8422_2325
        var b: UInt64 = 0x8422_2325_cbf2_9ce4
        mix(&a, id)
        mix(&b, token)
        for index in first..<values.count { mix(&a, values[index] ?? "") }
        return finish(a ^ finish(b))
    }

    /// Adds one device by its `hash`.
    public mutating func add(_ h1: UInt64) {
        let h2 = Self.finish(h1 &+ 0x2545_f491_4f6c_dd1d)
        sum.0 &+= h1
        sum.1 &+= h2
        mix ^= Self.finish(h1 ^ 0x5555_5555_5555_5555)
        count += 1
    }

    /// The digest as text: the two sums, the mix and the count.
    public var hex: String {
        String(format: "%016llx%016llx%016llx-%d", sum.0, sum.1, mix, count)
    }
}

/// Builds an `Inventory` from any number of sources, checking every device on the way in.
public struct InventoryBuilder: Sendable {
    /// The devices added so far.
    public private(set) var inventory = Inventory()
    /// Problems found so far (see `finalDiagnostics` for the list with counts).
    public private(set) var diagnostics: [Diagnostic] = []
    /// The most devices the inventory may hold (`limits.devices`); past it, one error and no more devices.
    public var deviceLimit: Int
    /// Problems kept in full; past this many, the rest are only counted, so a file of garbage cannot
    /// fill memory with messages.
    public static let diagnosticLimit = 1000
    /// Problems of one kind (the same message but for its quoted values and numbers) listed in full;
    /// the rest of that kind are counted in one line, so a thousand rows with a null token read as 20
    /// lines and a count, not a thousand lines.
    public static let sameKindLimit = 20
    private var suppressed = 0
    /// Per kind of problem: how many were seen, and where the first one is.
    private var kinds: [String: (count: Int, first: SourceLocation?)] = [:]
    private var kindOrder: [String] = []
    private var overLimit = false
    /// Rows a policy (`exclude_if`) left out, over every source so far.
    public private(set) var excluded = 0

    /// Counts a row left out by policy.
    public mutating func countExcluded() { excluded += 1 }

    /// The strings of the last whole read that the devices added reuse (`StringReuse.current` when the
    /// builder was made).
    let reuse: StringReuse?

    /// A builder that refuses devices past `deviceLimit`; its devices keep the strings
    /// `StringReuse.current` has for their tokens.
    public init(deviceLimit: Int = .max) {
        self.deviceLimit = deviceLimit
        self.reuse = StringReuse.current
    }

    /// The diagnostics, with a line for each kind of problem past `sameKindLimit` counting the rest,
    /// and a last line counting those past `diagnosticLimit`.
    public var allDiagnostics: [Diagnostic] {
        var all = diagnostics
        for key in kindOrder {
            guard let kind = kinds[key], kind.count > Self.sameKindLimit else { continue }
            let more = kind.count - Self.sameKindLimit
            let first = kind.first.map { " as \($0)" } ?? " as above"
            all.append(
                .error(
                    "… and \(PlanRenderer.formatCount(more)) more row\(more == 1 ? "" : "s") with the same problem\(first), not listed."
                ))
        }
        if suppressed > 0 {
            all.append(
                .error(
                    "\(suppressed) more inventory problem\(suppressed == 1 ? "" : "s") like those above were not listed; fix these first."
                ))
        }
        return all
    }

    /// The kind of a problem: its message without quoted values, numbers and places.
    static func kind(of message: String) -> String {
        var key = ""
        var quoted = false
        for character in message {
            if character == "'" {
                quoted.toggle()
                key.append(character)
            } else if !quoted, !character.isNumber {
                key.append(character)
            }
        }
        return key
    }

    private mutating func report(_ diagnostic: Diagnostic) {
        let key = Self.kind(of: diagnostic.message)
        guard kinds[key] != nil || kindOrder.count < Self.diagnosticLimit else {
            // Kinds past the limit are not told apart (a file of garbage has as many as rows).
            if diagnostics.count < Self.diagnosticLimit { diagnostics.append(diagnostic) } else { suppressed += 1 }
            return
        }
        var kind = kinds[key] ?? (0, diagnostic.location)
        if kind.count == 0 { kindOrder.append(key) }
        kind.count += 1
        kinds[key] = kind
        guard kind.count <= Self.sameKindLimit else { return }
        if diagnostics.count < Self.diagnosticLimit { diagnostics.append(diagnostic) } else { suppressed += 1 }
    }

    /// A handle for one source's devices.
    public struct SourceHandle: Sendable, Equatable {
        let index: UInt16
        /// The source's name as messages show it.
        public let file: String
    }

    /// Registers a source (a file name, or a description such as `postgres: fcm_tokens`).
    public mutating func source(_ file: String) -> SourceHandle {
        SourceHandle(index: inventory.source(file), file: file)
    }

    /// The column of a label name; resolve names once per source, then add devices by slot.
    public mutating func labelSlot(_ name: String) -> Int { inventory.labelSlot(name) }

    /// Makes room for `devices` more devices.
    public mutating func reserveCapacity(_ devices: Int) { inventory.reserveCapacity(inventory.count + devices) }

    /// Adds a device with labels by name; returns false (with a diagnostic) when it is refused.
    /// `tokenAt` places a token's problem where the token is written, when that is not the device's place.
    @discardableResult
    public mutating func add(
        id: String, token: String, labels: [(String, String)], from source: SourceHandle, line: Int,
        column: Int = 1, tokenAt: SourceLocation? = nil
    ) -> Bool {
        // A refused device adds no label column.
        let location = SourceLocation(file: source.file, line: line, column: column)
        guard accepts(id: id, token: token, at: location, tokenAt: tokenAt) else { return false }
        let slots = labels.map { (labelSlot($0.0), $0.1) }
        return add(id: id, token: token, slots: slots, from: source, line: line, column: column, checked: true)
    }

    /// Adds a device with labels by slot from an array; returns false (with a diagnostic) when it is
    /// refused. Not generic, so that callers in other modules (database sources) run code specialized
    /// here rather than the unspecialized generic path, which hashes through runtime metadata.
    @discardableResult
    public mutating func add(
        id: String, token: String, slots: [(Int, String)], from source: SourceHandle, line: Int, column: Int = 1
    ) -> Bool {
        add(id: id, token: token, slots: slots, from: source, line: line, column: column, checked: false)
    }

    /// Adds a device with labels by slot; returns false (with a diagnostic) when it is refused.
    @discardableResult
    public mutating func add(
        id: String, token: String, slots: some Sequence<(Int, String)>, from source: SourceHandle,
        line: Int, column: Int = 1
    ) -> Bool {
        add(id: id, token: token, slots: slots, from: source, line: line, column: column, checked: false)
    }

    /// Adds a device read as raw bytes (a CSV row without quotes; see `Inventory.add(id:token:row:…)`);
    /// returns false (with a diagnostic) when it is refused. A row that is refused goes through the
    /// string path, so its message is the same whichever way it was read.
    @discardableResult
    mutating func add(
        id: UnsafeBufferPointer<UInt8>, token: UnsafeBufferPointer<UInt8>, tokenHash: UInt64? = nil,
        row: UnsafeBufferPointer<UInt8>, fields: [Range<Int>], labels: [(slot: Int, field: Int)],
        from source: SourceHandle, line: Int, column: Int
    ) -> Bool {
        let deviceID = String(decoding: id, as: UTF8.self)
        guard !id.isEmpty, FCMLimits.shape(token) == .valid, inventory.count < deviceLimit else {
            let slots = labels.map {
                ($0.slot, String(decoding: UnsafeBufferPointer(rebasing: row[fields[$0.field]]), as: UTF8.self))
            }
            return add(
                id: deviceID, token: String(decoding: token, as: UTF8.self), slots: slots, from: source, line: line,
                column: column, checked: false)
        }
        let conflict = inventory.add(
            id: deviceID, token: token, tokenHash: tokenHash, row: row, fields: fields, labels: labels,
            source: source.index, line: line, column: column, reuse: reuse)
        guard let conflict else { return true }
        reportConflict(conflict, id: deviceID, at: SourceLocation(file: source.file, line: line, column: column))
        return false
    }

    /// Starts loading what adding this id and token will probe (see `Inventory.prefetch`).
    func prefetch(id: UnsafeBufferPointer<UInt8>, token: UnsafeBufferPointer<UInt8>) -> UInt64 {
        inventory.prefetch(id: id, token: token)
    }

    /// A device needs an id and a token FCM could have issued.
    private mutating func accepts(
        id: String, token: String, at location: SourceLocation, tokenAt: SourceLocation?
    )
        -> Bool
    {
        if id.isEmpty {
            report(.error("row has an empty device_id.", at: location))
            return false
        }
        if let problem = FCMLimits.tokenProblem(token) {
            report(.error("token of device '\(id)' is not valid: \(problem).", at: tokenAt ?? location))
            return false
        }
        return true
    }

    private mutating func add(
        id: String, token: String, slots: some Sequence<(Int, String)>, from source: SourceHandle,
        line: Int, column: Int, checked: Bool
    ) -> Bool {
        let location = SourceLocation(file: source.file, line: line, column: column)
        if !checked, !accepts(id: id, token: token, at: location, tokenAt: nil) { return false }
        guard inventory.count < deviceLimit else {
            if !overLimit {
                overLimit = true
                report(
                    .error(
                        "the inventory holds more than \(deviceLimit) devices; if it is meant to be this large, raise limits.devices in tidemark.yaml.",
                        at: location))
            }
            return false
        }
        guard
            let conflict = inventory.add(
                id: id, token: token, slots: slots, source: source.index, line: line, column: column, reuse: reuse)
        else { return true }
        reportConflict(conflict, id: id, at: location)
        return false
    }

    private mutating func reportConflict(_ conflict: Inventory.Conflict, id: String, at location: SourceLocation) {
        switch conflict {
        case .duplicateID(let other):
            report(
                .error(
                    "device id '\(id)' is declared twice; the other is at \(inventory.location(ofDevice: other)). Device ids must be unique.",
                    at: location))
        case .duplicateToken(let other):
            report(
                .error(
                    "device '\(id)' has the same token as device '\(inventory.deviceIDs[other])' at \(inventory.location(ofDevice: other)); a token belongs to one device.",
                    at: location))
        }
    }

    /// Reports a problem of a source's own, such as a row it cannot parse.
    public mutating func error(_ message: String, at location: SourceLocation) {
        report(.error(message, at: location))
    }
}

/// Why a source could not be read at all, in one line (the loader adds the source's name and place).
public struct InventorySourceError: TidemarkError {
    /// What kind of failure: each has its own `reason`, which `serve`'s status, events and alerts use.
    public enum Kind: String, Sendable, CaseIterable {
        /// The source's server could not be reached, or ended the connection (`inventory_unreachable`).
        case unreachable = "inventory_unreachable"
        /// The source did not answer in time (`inventory_timeout`).
        case timedOut = "inventory_timeout"
        /// The source read no device and may not be empty (`inventory_empty`).
        case empty = "inventory_empty"
        /// Anything else: a query or command that failed, output that is not devices (`inventory_failed`).
        case failed = "inventory_failed"
    }

    /// What kind of failure.
    public var kind: Kind
    /// `inventory_unreachable`, `inventory_timeout`, `inventory_empty` or `inventory_failed`.
    public var reason: FailureReason { FailureReason(rawValue: kind.rawValue) }

    /// The reason, as a sentence.
    public var description: String
    /// An error of `kind` saying `description`.
    public init(_ description: String, kind: Kind = .failed) {
        self.description = description
        self.kind = kind
    }

    /// A configured source read no device: refused, since a broken query or export would otherwise
    /// look like every device leaving.
    public static func empty(_ what: String) -> InventorySourceError {
        InventorySourceError(
            "\(what); a source that reads nothing would make every device look gone (and its memberships removed). If it is meant to be empty, set 'allow_empty: true' on it in tidemark.yaml",
            kind: .empty)
    }
}

/// An inventory source that takes back the devices FCM reported dead (its `on_dead` hook in
/// tidemark.yaml), so the app stops sending to them. `DeadTokenWriteBack` hands each sink its own
/// devices: those whose `DeadDevice.source` is `ConfiguredSource.display(name)`.
public protocol DeadTokenSink: InventorySource {
    /// Whether the source was told where to report (an `on_dead` hook); one that was not is skipped.
    var reportsDead: Bool { get }

    /// Reports `devices`, all of them this source's; returns how many were reported and, when the
    /// hook can tell, how many of its rows changed. Must be idempotent: a failure part-way is reported
    /// again by the next apply, since the source still lists those devices.
    func reportDead(_ devices: [DeadDevice], at time: Date) async throws -> (reported: Int, rowsChanged: Int?)
}
