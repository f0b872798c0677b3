import Foundation

/// Devices declared inline in the manifests (`inventory.devices`).
public struct InlineInventorySource: InventorySource {
    /// The devices, as the manifests declare them.
    public var devices: [DeviceSpec]

    /// A source of `devices`.
    public init(_ devices: [DeviceSpec]) { self.devices = devices }

    /// How messages name it.
    public var name: String { "inline devices" }

    /// Adds every device, each located where the manifest declares it.
    public func load(into builder: inout InventoryBuilder) async throws -> InventorySnapshot {
        var handles: [String: InventoryBuilder.SourceHandle] = [:]
        for device in devices {
            let file = device.id.location.file
            let handle = handles[file] ?? builder.source(file)
            handles[file] = handle
            builder.add(
                id: device.id.value, token: device.token.value,
                labels: device.labels.sorted { $0.key < $1.key }.map { ($0.key, $0.value) }, from: handle,
                line: device.id.location.line, column: device.id.location.column, tokenAt: device.token.location)
        }
        // The manifests that declare them are in the digest already.
        return InventorySnapshot(identity: "")
    }
}

/// An inventory file, CSV or JSON lines, read through a `FileSource`.
public struct FileInventorySource: InventorySource {
    /// The path as the manifests name it (relative to the manifests directory, or absolute).
    public var path: String
    /// CSV or JSON lines.
    public var format: InventoryFormat
    /// Where the file is read from (confined to the project).
    public var files: any FileSource
    /// The largest file read (`limits.inventory_bytes`).
    public var maxBytes: Int

    /// A source of the file at `path` in `format`.
    public init(
        path: String, format: InventoryFormat, files: any FileSource, maxBytes: Int = InputLimits().inventoryBytes
    ) {
        self.path = path
        self.format = format
        self.files = files
        self.maxBytes = maxBytes
    }

    /// The path, as the manifests name it.
    public var name: String { path }

    /// Reads the file (gzip too) and adds its devices; its SHA-256 is the snapshot.
    public func load(into builder: inout InventoryBuilder) async throws -> InventorySnapshot {
        PhaseTrace.mark("inventory \(path): reading")
        var data = try files.read(path, atMost: maxBytes, setting: "inventory_bytes")
        PhaseTrace.mark("inventory \(path): read \(data.count) bytes")
        let display = files.displayPath(path)
        // gzip by name or by content: a .csv.gz export, or a compressed file someone named .csv.
        var decompressed = false
        if path.hasSuffix(".gz") || Gzip.isCompressed(data) {
            data = try Gzip.decompress(data, atMost: maxBytes, setting: "inventory_bytes")
            decompressed = true
        }
        // Another encoding, an archive or a binary file is named for what it is, not quoted byte by byte.
        if let problem = InputFile.notTextProblem(data, decompressed: decompressed) {
            throw problem
        }
        let before = builder.inventory.count
        // The file's digest (its identity in a saved plan) is taken beside the parse, on the other core.
        let bytes = data
        async let digest = { SHA256Digest.hex(bytes) }()
        switch format {
        case .csv: Self.loadCSV(data, file: display, into: &builder)
        case .jsonl: Self.loadJSONLines(data, file: display, into: &builder)
        }
        PhaseTrace.mark("inventory \(path): parsed")
        let identity = await digest
        PhaseTrace.mark("inventory \(path): hashed")
        return InventorySnapshot(identity: identity, rows: builder.inventory.count - before)
    }

    /// Newlines in `data`: the rows to reserve room for (a guess from the size wasted a third more).
    static func lineCount(_ bytes: UnsafeBufferPointer<UInt8>) -> Int {
        guard let base = bytes.baseAddress else { return 0 }
        var p = UnsafeRawPointer(base)
        let end = p + bytes.count
        var lines = 0
        while p < end, let hit = memchr(p, 0x0A, end - p) {
            lines += 1
            p = UnsafeRawPointer(hit) + 1
        }
        return lines + 1
    }

    /// The rows to reserve room for: no more than the lines, the devices the limit leaves room for, or
    /// the rows `bytes` can hold (a device row is at least 25 bytes: an id, a comma, a 22-character
    /// token, a newline), so that a file of a billion blank lines reserves little.
    static func reservation(lines: Int, bytes: Int, room: Int) -> Int {
        max(0, min(lines, bytes / 25 + 1, room))
    }

    /// CSV: a header row naming `device_id` (or `id`), `token`, and any label columns. With `exclusion`,
    /// its column is read as a time and not kept as a label; `rowsAreLines: false` names rows by number
    /// (a command's output) rather than by file line.
    public static func loadCSV(
        _ data: Data, file: String, into builder: inout InventoryBuilder, exclusion: ExclusionFilter? = nil,
        rowsAreLines: Bool = true
    ) {
        data.withUnsafeBytes { raw in
            loadCSV(
                raw.bindMemory(to: UInt8.self), file: file, into: &builder, exclusion: exclusion,
                rowsAreLines: rowsAreLines)
        }
    }

    static func loadCSV(
        _ bytes: UnsafeBufferPointer<UInt8>, file: String, into builder: inout InventoryBuilder,
        exclusion: ExclusionFilter?, rowsAreLines: Bool
    ) {
        let source = builder.source(file)
        let column = rowsAreLines ? 1 : 0
        // A UTF-8 byte order mark, as spreadsheet exports write, is not part of the first column's name.
        let bytes = bytes.starts(with: InputFile.utf8BOM) ? UnsafeBufferPointer(rebasing: bytes[3...]) : bytes
        // A header is a line of column names: one with no line break in its first 64 KiB is not one,
        // and is not parsed (a gigabyte without a newline would be split into fields first).
        let headerLimit = 64 << 10
        if bytes.count > headerLimit, let base = bytes.baseAddress,
            memchr(base, Int32(UInt8(ascii: "\n")), headerLimit) == nil
        {
            builder.error(
                "the first line is longer than 64 KiB (\(PlanRenderer.formatCount(bytes.count)) bytes with no line break in its first 64 KiB), so it is no header row; the file needs one such as 'device_id,token,platform'.",
                at: SourceLocation(file: file, line: 1, column: 1))
            return
        }
        var reader = CSVReader(bytes)
        guard let header = reader.next() else {
            builder.error(
                "inventory file is empty; it needs a header row such as 'device_id,token,platform'.",
                at: SourceLocation(file: file, line: 1, column: 1))
            return
        }
        let names = header.fields.map { $0.trimmingCharacters(in: .whitespaces) }
        let found = names.joined(separator: ",")
        let shownHeader = found.count > 200 ? found.prefix(200) + "…" : found
        guard let idColumn = names.firstIndex(where: { $0 == "device_id" || $0 == "id" }),
            let tokenColumn = names.firstIndex(of: "token")
        else {
            builder.error(
                "the header row must name a 'device_id' and a 'token' column; found \(shownHeader.escapedOnOneLine).",
                at: SourceLocation(file: file, line: header.line, column: 1))
            return
        }
        let excludedColumn = exclusion.flatMap { rule in names.firstIndex(of: rule.rule.column) }
        if let exclusion, excludedColumn == nil {
            builder.error(
                "exclude_if reads the column '\(exclusion.rule.column)', which the header does not have; found \(shownHeader.escapedOnOneLine).",
                at: SourceLocation(file: file, line: header.line, column: column))
            return
        }
        let labelColumns = names.indices.filter {
            $0 != idColumn && $0 != tokenColumn && $0 != excludedColumn && !names[$0].isEmpty
        }
        let slots = labelColumns.map { builder.labelSlot(names[$0]) }
        let labels = zip(slots, labelColumns).map { (slot: $0.0, field: $0.1) }
        builder.reserveCapacity(
            Self.reservation(
                lines: Self.lineCount(bytes), bytes: bytes.count, room: builder.deviceLimit - builder.inventory.count))
        var number = 0
        /// A row read as strings: one with quotes, or any row when a policy reads a column.
        func add(_ fields: [String], line: Int) {
            let location = SourceLocation(file: file, line: rowsAreLines ? line : number, column: column)
            if fields.count == 1, fields[0].isEmpty { return }
            guard fields.count == names.count else {
                builder.error(
                    "row has \(fields.count) fields but the header has \(names.count); quote values that contain commas.",
                    at: location)
                return
            }
            if let exclusion, let excludedColumn,
                exclusion.excludes(fields[excludedColumn], device: fields[idColumn], at: location, into: &builder)
            {
                return
            }
            builder.add(
                id: fields[idColumn], token: fields[tokenColumn],
                slots: labels.lazy.map { ($0.slot, fields[$0.field]) }, from: source, line: location.line,
                column: column)
        }
        // Rows without quotes are read one ahead: the index slots the next row's id and token will
        // probe are loaded while this row is added (at a million devices each probe misses the cache).
        var current: [Range<Int>] = []
        var ahead: [Range<Int>] = []
        current.reserveCapacity(names.count + 1)
        ahead.reserveCapacity(names.count + 1)
        var currentLine = reader.nextPlain(&current)
        var currentHash: UInt64?
        while true {
            if let line = currentLine {
                let aheadLine = reader.nextPlain(&ahead)
                var aheadHash: UInt64?
                if aheadLine != nil, ahead.count == names.count {
                    aheadHash = builder.prefetch(
                        id: UnsafeBufferPointer(rebasing: bytes[ahead[idColumn]]),
                        token: UnsafeBufferPointer(rebasing: bytes[ahead[tokenColumn]]))
                }
                number += 1
                if current.count == 1, current[0].isEmpty {
                    // A blank line: nothing to read.
                } else if exclusion != nil || current.count != names.count {
                    add(
                        current.map { String(decoding: UnsafeBufferPointer(rebasing: bytes[$0]), as: UTF8.self) },
                        line: line)
                } else {
                    builder.add(
                        id: UnsafeBufferPointer(rebasing: bytes[current[idColumn]]),
                        token: UnsafeBufferPointer(rebasing: bytes[current[tokenColumn]]), tokenHash: currentHash,
                        row: bytes, fields: current, labels: labels, from: source,
                        line: rowsAreLines ? line : number, column: column)
                }
                swap(&current, &ahead)
                currentLine = aheadLine
                currentHash = aheadHash
            } else if let row = reader.next() {
                // A row with quotes (or one that is not valid CSV).
                number += 1
                if let problem = row.problem {
                    builder.error(
                        problem, at: SourceLocation(file: file, line: rowsAreLines ? row.line : number, column: column))
                } else {
                    add(row.fields, line: row.line)
                }
                currentLine = reader.nextPlain(&current)
                currentHash = nil
            } else {
                break
            }
        }
    }

    /// Whether `json` has a comma right before a `}` or `]` (outside strings): JSON forbids it, though
    /// Foundation's parser lets it pass.
    static func hasTrailingComma(_ json: some Collection<UInt8>) -> Bool {
        var inString = false
        var escaped = false
        var afterComma = false
        for byte in json {
            if inString {
                if escaped {
                    escaped = false
                } else if byte == UInt8(ascii: "\\") {
                    escaped = true
                } else if byte == UInt8(ascii: "\"") {
                    inString = false
                }
                continue
            }
            switch byte {
            case UInt8(ascii: "\""):
                inString = true
                afterComma = false
            case UInt8(ascii: ","): afterComma = true
            case UInt8(ascii: "}"), UInt8(ascii: "]"):
                if afterComma { return true }
            case UInt8(ascii: " "), UInt8(ascii: "\t"), UInt8(ascii: "\r"), UInt8(ascii: "\n"): break
            default: afterComma = false
            }
        }
        return false
    }

    /// JSON lines: one object a line, `{"id": …, "token": …, "labels": {…}}`; with `exclusion`, its
    /// column is a label (or a top-level key) read as a time and not kept.
    /// The longest device line a JSON-lines inventory may have.
    static let maxJSONLineBytes = 1 << 20

    /// Adds the devices of JSON-lines `data` (read from `file`) to `builder`; `rowsAreLines` false when a program printed them, so messages name rows, not lines.
    public static func loadJSONLines(
        _ data: Data, file: String, into builder: inout InventoryBuilder, exclusion: ExclusionFilter? = nil,
        rowsAreLines: Bool = true
    ) {
        let source = builder.source(file)
        let column = rowsAreLines ? 1 : 0
        var number = 0
        // Lines are found one at a time, never split into an array first: a gigabyte of newlines is a
        // billion lines, and an array of them would take tens of gigabytes.
        var lines = NonEmptyLines(data)
        while let (line, slice) = lines.next() {
            let trimmed = slice.drop { $0 == UInt8(ascii: " ") || $0 == UInt8(ascii: "\t") }
            if trimmed.isEmpty || (trimmed.count == 1 && trimmed.first == UInt8(ascii: "\r")) { continue }
            number += 1
            let location = SourceLocation(file: file, line: rowsAreLines ? line : number, column: column)
            guard slice.count <= Self.maxJSONLineBytes else {
                // Not handed to the JSON parser: a device line is a few hundred bytes.
                builder.error(
                    "line is \(PlanRenderer.formatCount(slice.count)) bytes long; a device line is at most 1 MiB (one device's id, token and labels).",
                    at: location)
                continue
            }
            // A byte order mark before the first line is not part of it.
            let slice = line == 1 && slice.starts(with: InputFile.utf8BOM) ? slice.dropFirst(3) : slice
            if Self.hasTrailingComma(slice) {
                builder.error(
                    "line has a comma before a closing brace or bracket, which JSON does not allow; remove it.",
                    at: location)
                continue
            }
            guard let object = (try? JSONSerialization.jsonObject(with: Data(slice))) as? [String: Any] else {
                builder.error(
                    "line is not a JSON object; each line must look like {\"id\": \"…\", \"token\": \"…\", \"labels\": {…}}.",
                    at: location)
                continue
            }
            let known = ["id", "device_id", "token", "labels"] + (exclusion.map { [$0.rule.column] } ?? [])
            let unknown = object.keys.filter { !known.contains($0) }.sorted()
            if let key = unknown.first {
                builder.error("unknown key '\(key)'; a device line has id, token and labels.", at: location)
                continue
            }
            guard let id = (object["id"] ?? object["device_id"]) as? String, !id.isEmpty,
                let token = object["token"] as? String
            else {
                builder.error("a device line needs string 'id' and 'token' fields.", at: location)
                continue
            }
            var labels: [(String, String)] = []
            if let raw = object["labels"] {
                guard let map = raw as? [String: Any] else {
                    builder.error("'labels' of device '\(id)' must be an object of strings.", at: location)
                    continue
                }
                for (key, value) in map.sorted(by: { $0.key < $1.key }) where key != exclusion?.rule.column {
                    if let s = value as? String {
                        labels.append((key, s))
                    } else if let n = value as? NSNumber {
                        labels.append((key, n.stringValue))
                    } else {
                        builder.error("label '\(key)' of device '\(id)' must be a string.", at: location)
                    }
                }
            }
            if let exclusion {
                let seen = object[exclusion.rule.column] ?? (object["labels"] as? [String: Any])?[exclusion.rule.column]
                let text = (seen as? String) ?? (seen as? NSNumber)?.stringValue ?? ""
                if exclusion.excludes(text, device: id, at: location, into: &builder) { continue }
            }
            builder.add(id: id, token: token, labels: labels, from: source, line: location.line, column: column)
        }
    }
}

/// The lines of `data` that are not empty, with their 1-based numbers, found as they are asked for:
/// runs of empty lines are skipped in one pass over their bytes.
struct NonEmptyLines {
    private let data: Data
    private var offset = 0
    private var line = 0

    init(_ data: Data) { self.data = data }

    /// The next line that is not empty (without its "\n"), or nil at the end.
    mutating func next() -> (line: Int, slice: Data)? {
        let count = data.count
        guard offset < count else { return nil }
        let (skipped, start, end) = data.withUnsafeBytes { raw -> (Int, Int, Int) in
            let bytes = raw.bindMemory(to: UInt8.self)
            var start = offset
            var skipped = 0
            while start < count, bytes[start] == UInt8(ascii: "\n") {
                start += 1
                skipped += 1
            }
            guard start < count, let base = bytes.baseAddress else { return (skipped, count, count) }
            let found = memchr(base + start, Int32(UInt8(ascii: "\n")), count - start)
            let end = found.map { UnsafeRawPointer($0).assumingMemoryBound(to: UInt8.self) - base } ?? count
            return (skipped, start, end)
        }
        line += skipped
        offset = end + 1
        guard start < count else { return nil }
        line += 1
        let base = data.startIndex
        return (line, data[(base + start)..<(base + end)])
    }
}

/// An `ExclusionRule` at one moment: whether a row is left out, counting it in the builder.
public struct ExclusionFilter: Sendable {
    /// The rule.
    public var rule: ExclusionRule
    /// Seconds since 1970.
    public var now: Int64

    /// The rule as of `now`.
    public init(_ rule: ExclusionRule, now: Int64) {
        self.rule = rule
        self.now = now
    }

    /// True when the row is left out (counted); a value that is not a time is reported and the row
    /// left out too, since keeping it could subscribe a token the policy means to drop.
    public func excludes(
        _ value: String, device: String, at location: SourceLocation, into builder: inout InventoryBuilder
    ) -> Bool {
        switch rule.verdict(value, now: now) {
        case .keep: return false
        case .exclude:
            builder.countExcluded()
            return true
        case .unreadable:
            builder.error(
                "\(rule.column) '\(value.prefix(40))' of device '\(device)' is not a time; exclude_if reads dates such as 2026-05-01, 2026-05-01T10:00:00Z or epoch seconds or milliseconds.",
                at: location)
            return true
        case .implausible(let seconds):
            let date = ISO8601DateFormatter().string(from: Date(timeIntervalSince1970: TimeInterval(seconds)))
            builder.error(
                "\(rule.column) '\(value.prefix(40))' of device '\(device)' reads as \(date), which is not a time a device was seen (before 2008 or in the future); write epoch seconds or milliseconds, or a date such as 2026-05-01, so that exclude_if does not leave out devices by a wrong clock.",
                at: location)
            return true
        }
    }
}
