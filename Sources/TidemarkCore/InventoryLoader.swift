import Foundation

/// Reads inventory files (CSV with a header, or JSON lines) and inline devices into an `Inventory`.
public struct InventoryLoader {
    public init() {}

    /// Loads every inventory source of `manifests`; problems are reported, good rows still loaded.
    public func load(_ manifests: ManifestSet, files: FileSource) -> (Inventory, [Diagnostic]) {
        var inventory = Inventory()
        var diagnostics: [Diagnostic] = []
        for device in manifests.devices {
            let source = inventory.source(device.id.location.file)
            if let problem = FCMLimits.tokenProblem(device.token.value) {
                diagnostics.append(.error("token of device '\(device.id.value)' is not valid: \(problem).", at: device.token.location))
                continue
            }
            if let conflict = inventory.add(id: device.id.value, token: device.token.value,
                labels: device.labels.sorted { $0.key < $1.key }.map { ($0.key, $0.value) },
                source: source, line: device.id.location.line, column: device.id.location.column)
            {
                diagnostics.append(conflictDiagnostic(conflict, id: device.id.value, at: device.id.location, inventory))
            }
        }
        for file in manifests.inventoryFiles {
            let data: Data
            do {
                data = try files.read(file.value)
            } catch {
                diagnostics.append(.error("cannot read inventory file '\(file.value)': \(error); check the path, which is relative to the manifests directory.", at: file.location))
                continue
            }
            if file.value.hasSuffix(".csv") {
                diagnostics += loadCSV(data, file: files.displayPath(file.value), into: &inventory)
            } else if file.value.hasSuffix(".jsonl") || file.value.hasSuffix(".ndjson") {
                diagnostics += loadJSONLines(data, file: files.displayPath(file.value), into: &inventory)
            } else {
                diagnostics.append(.error("inventory file '\(file.value)' must end in .csv or .jsonl.", at: file.location))
            }
        }
        return (inventory, diagnostics)
    }

    private func conflictDiagnostic(_ conflict: Inventory.Conflict, id: String, at location: SourceLocation,
        _ inventory: Inventory) -> Diagnostic
    {
        switch conflict {
        case .duplicateID(let other):
            return .error("device id '\(id)' is declared twice; the other is at \(inventory.location(ofDevice: other)). Device ids must be unique.", at: location)
        case .duplicateToken(let other):
            return .error("device '\(id)' has the same token as device '\(inventory.deviceIDs[other])' at \(inventory.location(ofDevice: other)); a token belongs to one device.", at: location)
        }
    }

    /// CSV: a header row naming `device_id` (or `id`), `token`, and any label columns.
    func loadCSV(_ data: Data, file: String, into inventory: inout Inventory) -> [Diagnostic] {
        var diagnostics: [Diagnostic] = []
        let source = inventory.source(file)
        var reader = CSVReader(data)
        guard let header = reader.next() else {
            return [.error("inventory file is empty; it needs a header row such as 'device_id,token,platform'.", at: SourceLocation(file: file, line: 1, column: 1))]
        }
        let names = header.fields.map { $0.trimmingCharacters(in: .whitespaces) }
        guard let idColumn = names.firstIndex(where: { $0 == "device_id" || $0 == "id" }),
            let tokenColumn = names.firstIndex(of: "token")
        else {
            return [.error("the header row must name a 'device_id' and a 'token' column; found \(names.joined(separator: ",")).", at: SourceLocation(file: file, line: header.line, column: 1))]
        }
        let labelColumns = names.indices.filter { $0 != idColumn && $0 != tokenColumn && !names[$0].isEmpty }
        let slots = labelColumns.map { inventory.labelSlot(names[$0]) }
        inventory.reserveCapacity(inventory.count + data.count / 120)
        while let row = reader.next() {
            if let problem = row.problem {
                diagnostics.append(.error(problem, at: SourceLocation(file: file, line: row.line, column: 1)))
                continue
            }
            if row.fields.count == 1, row.fields[0].isEmpty { continue }
            guard row.fields.count == names.count else {
                diagnostics.append(.error("row has \(row.fields.count) fields but the header has \(names.count); quote values that contain commas.", at: SourceLocation(file: file, line: row.line, column: 1)))
                continue
            }
            let id = row.fields[idColumn]
            let token = row.fields[tokenColumn]
            if id.isEmpty {
                diagnostics.append(.error("row has an empty device_id.", at: SourceLocation(file: file, line: row.line, column: 1)))
                continue
            }
            if let problem = FCMLimits.tokenProblem(token) {
                diagnostics.append(.error("token of device '\(id)' is not valid: \(problem).", at: SourceLocation(file: file, line: row.line, column: 1)))
                continue
            }
            if let conflict = inventory.add(id: id, token: token,
                slots: zip(slots, labelColumns).lazy.map { ($0.0, row.fields[$0.1]) }, source: source, line: row.line)
            {
                diagnostics.append(conflictDiagnostic(conflict, id: id, at: SourceLocation(file: file, line: row.line, column: 1), inventory))
            }
        }
        return diagnostics
    }

    /// JSON lines: one object a line, `{"id": …, "token": …, "labels": {…}}`.
    func loadJSONLines(_ data: Data, file: String, into inventory: inout Inventory) -> [Diagnostic] {
        var diagnostics: [Diagnostic] = []
        let source = inventory.source(file)
        var line = 0
        for slice in data.split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: false) {
            line += 1
            let trimmed = slice.drop { $0 == UInt8(ascii: " ") || $0 == UInt8(ascii: "\t") }
            if trimmed.isEmpty || trimmed == Data([UInt8(ascii: "\r")]) { continue }
            let location = SourceLocation(file: file, line: line, column: 1)
            guard let object = (try? JSONSerialization.jsonObject(with: Data(slice))) as? [String: Any] else {
                diagnostics.append(.error("line is not a JSON object; each line must look like {\"id\": \"…\", \"token\": \"…\", \"labels\": {…}}.", at: location))
                continue
            }
            let unknown = object.keys.filter { !["id", "device_id", "token", "labels"].contains($0) }.sorted()
            if let key = unknown.first {
                diagnostics.append(.error("unknown key '\(key)'; a device line has id, token and labels.", at: location))
                continue
            }
            guard let id = (object["id"] ?? object["device_id"]) as? String, !id.isEmpty,
                let token = object["token"] as? String
            else {
                diagnostics.append(.error("a device line needs string 'id' and 'token' fields.", at: location))
                continue
            }
            if let problem = FCMLimits.tokenProblem(token) {
                diagnostics.append(.error("token of device '\(id)' is not valid: \(problem).", at: location))
                continue
            }
            var labels: [(String, String)] = []
            if let raw = object["labels"] {
                guard let map = raw as? [String: Any] else {
                    diagnostics.append(.error("'labels' of device '\(id)' must be an object of strings.", at: location))
                    continue
                }
                for (key, value) in map.sorted(by: { $0.key < $1.key }) {
                    if let s = value as? String { labels.append((key, s)) } else if let n = value as? NSNumber {
                        labels.append((key, n.stringValue))
                    } else {
                        diagnostics.append(.error("label '\(key)' of device '\(id)' must be a string.", at: location))
                    }
                }
            }
            if let conflict = inventory.add(id: id, token: token, labels: labels, source: source, line: line) {
                diagnostics.append(conflictDiagnostic(conflict, id: id, at: location, inventory))
            }
        }
        return diagnostics
    }
}

/// A small RFC 4180 reader over bytes: quoted fields, doubled quotes, CRLF.
struct CSVReader {
    struct Row {
        var fields: [String]
        var line: Int
        var problem: String?
    }

    private let bytes: [UInt8]
    private var position = 0
    private var line = 1

    init(_ data: Data) { bytes = [UInt8](data) }

    mutating func next() -> Row? {
        guard position < bytes.count else { return nil }
        return bytes.withUnsafeBufferPointer { buffer in nextRow(buffer) }
    }

    private mutating func nextRow(_ buffer: UnsafeBufferPointer<UInt8>) -> Row {
        let startLine = line
        var fields: [String] = []
        fields.reserveCapacity(8)
        while true {
            // Fast path: an unquoted field is a slice up to the next comma or newline.
            if position < buffer.count, buffer[position] != UInt8(ascii: "\"") {
                let start = position
                while position < buffer.count {
                    let byte = buffer[position]
                    if byte == UInt8(ascii: ",") || byte == UInt8(ascii: "\n") { break }
                    position += 1
                }
                var end = position
                if end > start, buffer[end - 1] == UInt8(ascii: "\r") { end -= 1 }
                fields.append(String(decoding: UnsafeBufferPointer(rebasing: buffer[start..<end]), as: UTF8.self))
            } else if position < buffer.count {
                position += 1
                var field: [UInt8] = []
                var closed = false
                while position < buffer.count {
                    let byte = buffer[position]
                    position += 1
                    if byte == UInt8(ascii: "\"") {
                        if position < buffer.count, buffer[position] == UInt8(ascii: "\"") {
                            field.append(byte)
                            position += 1
                        } else {
                            closed = true
                            break
                        }
                    } else {
                        if byte == UInt8(ascii: "\n") { line += 1 }
                        field.append(byte)
                    }
                }
                fields.append(String(decoding: field, as: UTF8.self))
                if !closed {
                    return Row(fields: fields, line: startLine, problem: "a quoted field is not closed; add the closing '\"'.")
                }
                while position < buffer.count, buffer[position] != UInt8(ascii: ","), buffer[position] != UInt8(ascii: "\n") {
                    position += 1
                }
            } else {
                fields.append("")
            }
            if position >= buffer.count { return Row(fields: fields, line: startLine) }
            let separator = buffer[position]
            position += 1
            if separator == UInt8(ascii: "\n") {
                line += 1
                return Row(fields: fields, line: startLine)
            }
        }
    }
}
