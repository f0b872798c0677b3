import Foundation
import Logging
import NIOCore
import PostgresNIO
import TidemarkCore

/// Devices from the app's own token table: `postgres: {url_env: VAR, query: "select …"}` in
/// tidemark.yaml. The query runs in a read-only transaction through a server-side cursor, fetched in
/// pages, so a million rows stream through once and never sit in memory twice. Its columns map to
/// `device_id` (or `id`), `token`, and labels: every other column, or the `labels:` list.
public struct PostgresInventorySource: DeadTokenSink {
    /// How messages name the source.
    public var name: String
    /// The URL as given in the environment (never shown: messages use `PostgresURL.display`); nil
    /// when the variable `urlEnv` is not set.
    var url: String?
    /// The environment variable that held the URL, for messages.
    public var urlEnv: String
    /// The query; every row is a device.
    public var query: String
    /// The columns read as labels; nil: every column but the id and token.
    public var labels: [String]?
    /// Devices left out by `exclude_if`, as of the run.
    public var exclusion: ExclusionFilter?
    /// Where tidemark.yaml declares the source.
    public var declaredAt: SourceLocation?
    /// Whether reading no device at all is acceptable (`allow_empty: true`); otherwise it is an error.
    public var allowEmpty = false
    /// Rows per FETCH.
    public var pageSize = 20_000
    /// Where dead devices are reported back (`on_dead`): a statement run on the same database, or a program.
    public var onDead: DeadTokenHook?
    /// Where an `on_dead` program runs (the project directory), and how long one batch may take.
    public var hookDirectory: String?
    /// How long one batch of the `on_dead` program may take, in seconds.
    public var hookTimeout = ConfiguredSource.defaultTimeout

    /// A source running `query` on the database at `url` (from `urlEnv`).
    public init(
        name: String, url: String?, urlEnv: String = "the URL", query: String, labels: [String]? = nil,
        exclusion: ExclusionFilter? = nil, declaredAt: SourceLocation? = nil
    ) {
        self.name = name
        self.url = url
        self.urlEnv = urlEnv
        self.query = query
        self.labels = labels
        self.exclusion = exclusion
        self.declaredAt = declaredAt
    }

    static let logger = Logger(label: "tidemark.inventory.postgres")

    /// Whether `on_dead` is set.
    public var reportsDead: Bool { onDead != nil }

    /// Reports `devices` through `on_dead` (a statement on the same database, or a program), in batches.
    public func reportDead(_ devices: [DeadDevice], at time: Date) async throws -> (reported: Int, rowsChanged: Int?) {
        guard let onDead else { return (0, nil) }
        return try await DeadTokenReporter(
            sourceName: name, hook: onDead, url: url, urlEnv: urlEnv, directory: hookDirectory, timeout: hookTimeout
        ).report(devices, at: time)
    }

    /// The query without a trailing semicolon, ready to follow `DECLARE … CURSOR FOR`.
    var cursorQuery: String { Self.trimmed(query) }

    /// Runs the query through a cursor and adds every row; `DeviceDigest` of the rows is the snapshot.
    public func load(into builder: inout InventoryBuilder) async throws -> InventorySnapshot {
        try await load(filter: nil, into: &builder)
    }

    /// Adds the current rows of the devices `ids` only: the source's query with its rows filtered by
    /// device id (`device_id`, or `id`), so a device the query no longer returns (deleted, marked
    /// inactive) is not added. What a change read of `changes` or `listen` follows.
    public func load(devices ids: [String], into builder: inout InventoryBuilder) async throws -> InventorySnapshot {
        guard !ids.isEmpty else { return InventorySnapshot(identity: DeviceDigest().hex, rows: 0, excluded: 0) }
        do {
            return try await load(filter: ("device_id", ids), into: &builder)
        } catch let error as InventorySourceError where error.description.contains("tidemark_rows.device_id") {
            // The query names its device column `id`, as a whole read accepts too.
            return try await load(filter: ("id", ids), into: &builder)
        }
    }

    private func load(
        filter: (column: String, ids: [String])?, into builder: inout InventoryBuilder
    ) async throws -> InventorySnapshot {
        let (connection, parsed) = try await PostgresURL.connect(
            url, urlEnv: urlEnv, what: nil, id: 1, logger: Self.logger)
        do {
            let snapshot = try await read(connection, limit: parsed.timeout, filter: filter, into: &builder)
            try await connection.close()
            return snapshot
        } catch {
            try? await connection.close()
            if let known = error as? InventorySourceError { throw known }
            throw InventorySourceError(
                "the query failed on \(parsed.display): \(PostgresURL.explain(error))",
                kind: PostgresURL.kind(of: error))
        }
    }

    /// The largest value of `changes.cursor` the changes query returns now (nil when it returns no
    /// row), on a connection of its own; `PostgresChangeReader` keeps one for a follower.
    public func currentCursor(_ changes: PostgresSourceSettings.Changes) async throws -> String? {
        try await PostgresChangeReader(self).once { try await $0.currentCursor(changes) }
    }

    /// The devices whose rows changed after `cursor`, at most `limit` (see `PostgresChangeReader`).
    public func changedDevices(
        _ changes: PostgresSourceSettings.Changes, after cursor: String?, limit: Int
    ) async throws -> (ids: [String], cursor: String?) {
        try await PostgresChangeReader(self).once { try await $0.changedDevices(changes, after: cursor, limit: limit) }
    }

    /// Whether the changes query's cursor now stops before `cursor` (see `PostgresChangeReader`).
    public func cursorWentBack(_ changes: PostgresSourceSettings.Changes, from cursor: String) async throws -> Bool {
        try await PostgresChangeReader(self).once { try await $0.cursorWentBack(changes, from: cursor) }
    }

    /// Opens a connection of its own that listens on `channel` and gives `consume` the notifications;
    /// the connection is closed when `consume` returns or throws, or the task is cancelled. Throws
    /// when the connection cannot be made or is lost (the sequence then ends with the error).
    public func listen(
        on channel: String, _ consume: @Sendable (PostgresNotificationSequence) async throws -> Void
    ) async throws {
        let (connection, parsed) = try await PostgresURL.connect(
            url, urlEnv: urlEnv, what: nil, id: 2, logger: Self.logger)
        do {
            try await withTaskCancellationHandler {
                try await connection.listen(on: channel) { notifications in try await consume(notifications) }
            } onCancel: {
                let closing: EventLoopFuture<Void> = connection.close()
                _ = closing
            }
            try? await connection.close()
        } catch {
            try? await connection.close()
            if Task.isCancelled || error is CancellationError { return }
            throw InventorySourceError("LISTEN \(channel) on \(parsed.display): \(PostgresURL.explain(error))")
        }
    }

    /// `query` without surrounding space or a trailing semicolon, ready to be a subquery.
    static func trimmed(_ query: String) -> String {
        var text = query.trimmingCharacters(in: .whitespacesAndNewlines)
        while text.hasSuffix(";") { text = String(text.dropLast()).trimmingCharacters(in: .whitespacesAndNewlines) }
        return text
    }

    /// Which column is which, from the first row.
    struct Layout: Sendable {
        var columns: Int
        var id: Int
        var token: Int
        var exclusion: Int?
        /// Label columns, in column order, and their names.
        var labels: [Int]
        var labelNames: [String]
    }

    /// Reads the query's rows through a cursor, each statement and page within `limit`.
    private func read(
        _ c: PostgresConnection, limit: Duration, filter: (column: String, ids: [String])?,
        into builder: inout InventoryBuilder
    ) async throws -> InventorySnapshot {
        var bindings = PostgresBindings()
        if let filter { bindings.append(filter.ids) }
        let binds = bindings
        let cursorQuery =
            filter.map {
                "SELECT * FROM (\(self.cursorQuery)) tidemark_rows WHERE tidemark_rows.\($0.column)::text = ANY($1)"
            } ?? self.cursorQuery
        // Read-only: even a query with a side effect cannot write; plan jobs should also use a read-only role.
        // The planner's estimate sizes the inventory's tables once, instead of growing them page by page.
        let estimate = try await PostgresURL.bounded(c, limit) {
            try await c.query("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", logger: Self.logger).collect()
            let estimate = filter == nil ? try await Self.estimatedRows(c, cursorQuery) : nil
            try await c.query(
                PostgresQuery(
                    unsafeSQL: "DECLARE tidemark_inventory NO SCROLL CURSOR FOR \(cursorQuery)", binds: binds),
                logger: Self.logger
            ).collect()
            return estimate
        }
        let file = ConfiguredSource.display(name)
        let source = builder.source(file)
        var digest = DeviceDigest()
        var number = 0
        let before = (builder.inventory.count, builder.excluded)
        // Half again as many: the estimate can be low, and a roomier table probes less.
        if let estimate { builder.reserveCapacity(min(estimate + estimate / 2, builder.deviceLimit, 50_000_000)) }
        let pageSize = pageSize
        @Sendable func fetch() async throws -> [PostgresRow] {
            try await PostgresURL.bounded(c, limit) {
                try await c.query(
                    "FETCH FORWARD \(unescaped: String(pageSize)) FROM tidemark_inventory", logger: Self.logger
                )
                .collect()
            }
        }
        // The next page is fetched in a child task (the server runs the query, the connection's thread
        // decodes it) while this one's devices are added; one fetch at a time, in order.
        try await withThrowingTaskGroup(of: [PostgresRow].self) { pages in
            pages.addTask { try await fetch() }
            defer { pages.cancelAll() }
            var layout: Layout?
            // Where each column's text goes: 0 id, 1 token, 2 exclusion, 3 + k label k, -1 unused.
            var target: [Int] = []
            var labelSlots: [Int] = []
            var values: [String?] = []
            var slots: [(Int, String)] = []
            while let rows = try await pages.next() {
                if rows.count == pageSize { pages.addTask { try await fetch() } }
                for row in rows {
                    number += 1
                    if layout == nil {
                        let found = try self.layout(row)
                        layout = found
                        target = [Int](repeating: -1, count: found.columns)
                        target[found.id] = 0
                        target[found.token] = 1
                        if let e = found.exclusion { target[e] = 2 }
                        for (k, column) in found.labels.enumerated() { target[column] = 3 + k }
                        labelSlots = found.labelNames.map { builder.labelSlot($0) }
                        values = [String?](repeating: nil, count: 3 + found.labels.count)
                    }
                    for k in values.indices { values[k] = nil }
                    var problem: String?
                    var column = 0
                    for cell in row {
                        let slot = column < target.count ? target[column] : -1
                        column += 1
                        guard slot >= 0 else { continue }
                        do {
                            values[slot] = try Self.text(cell)
                        } catch let error as InventorySourceError {
                            problem = error.description
                        }
                    }
                    let location = SourceLocation(file: file, line: number, column: 0)
                    if let problem {
                        builder.error(problem, at: location)
                        continue
                    }
                    guard let id = values[0], !id.isEmpty else {
                        builder.error(
                            "device_id is null or empty; the query must return one for every row.", at: location)
                        continue
                    }
                    guard let token = values[1] else {
                        builder.error(
                            "token of device '\(id)' is null; filter such rows out in the query (where token is not null).",
                            at: location)
                        continue
                    }
                    if let exclusion, exclusion.excludes(values[2] ?? "", device: id, at: location, into: &builder) {
                        continue
                    }
                    slots.removeAll(keepingCapacity: true)
                    for (k, slot) in labelSlots.enumerated() {
                        if let value = values[3 + k], !value.isEmpty { slots.append((slot, value)) }
                    }
                    if builder.add(id: id, token: token, slots: slots, from: source, line: number, column: 0) {
                        digest.add(DeviceDigest.hash(id: id, token: token, values: values, from: 3))
                    }
                }
            }
        }
        if number == 0, !allowEmpty, filter == nil {
            throw InventorySourceError.empty("the query returned no rows")
        }
        try await c.query("CLOSE tidemark_inventory", logger: Self.logger).collect()
        try await c.query("COMMIT", logger: Self.logger).collect()
        return InventorySnapshot(
            identity: digest.hex, rows: builder.inventory.count - before.0, excluded: builder.excluded - before.1)
    }

    /// The planner's row estimate for `query` (EXPLAIN, which runs nothing); nil when it gives none.
    static func estimatedRows(_ c: PostgresConnection, _ query: String) async throws -> Int? {
        let rows = try await c.query("EXPLAIN (FORMAT JSON) \(unescaped: query)", logger: logger).collect()
        guard let cell = rows.first?.first(where: { _ in true }), let text = try? Self.text(cell) else { return nil }
        guard let range = text.range(of: "\"Plan Rows\": ") else { return nil }
        let digits = text[range.upperBound...].prefix { $0.isNumber }
        return Int(digits)
    }

    /// Finds the columns in the first row; a missing one is refused naming what was found.
    func layout(_ row: PostgresRow) throws -> Layout {
        let names = row.map(\.columnName)
        func refuse(_ problem: String) -> InventorySourceError {
            InventorySourceError(
                "\(problem); the query returns \(names.joined(separator: ", ")). Fix the query in tidemark.yaml.")
        }
        guard let idColumn = names.firstIndex(of: "device_id") ?? names.firstIndex(of: "id") else {
            throw refuse("the query returns no 'device_id' column (alias one: select user_device_id as device_id …)")
        }
        guard let tokenColumn = names.firstIndex(of: "token") else {
            throw refuse("the query returns no 'token' column (alias one: select fcm_token as token …)")
        }
        let excluded = exclusion.map { $0.rule.column }
        if let excluded, !names.contains(excluded) {
            throw refuse("exclude_if reads the column '\(excluded)', which the query does not return")
        }
        if let labels {
            for label in labels where !names.contains(label) {
                throw refuse("'labels' names the column '\(label)', which the query does not return")
            }
        }
        if Set(names).count != names.count {
            let twice = Dictionary(grouping: names, by: { $0 }).filter { $0.value.count > 1 }.keys.sorted()
            throw refuse("the column \(twice.joined(separator: ", ")) appears twice; alias one of them")
        }
        let labelColumns = names.indices.filter { i in
            i != idColumn && i != tokenColumn && names[i] != excluded && (labels?.contains(names[i]) ?? true)
        }
        return Layout(
            columns: names.count, id: idColumn, token: tokenColumn,
            exclusion: excluded.flatMap { names.firstIndex(of: $0) },
            labels: labelColumns, labelNames: labelColumns.map { names[$0] })
    }

    /// A cell as text: strings as they are, numbers, booleans, UUIDs and times in a plain form
    /// (times as epoch seconds, which `exclude_if` reads); any other type must be cast in the query.
    static func text(_ cell: PostgresCell) throws(InventorySourceError) -> String? {
        guard let bytes = cell.bytes else { return nil }
        do {
            if cell.format == .text { return String(buffer: bytes) }
            switch cell.dataType {
            case .text, .varchar, .bpchar, .name:
                return String(buffer: bytes)
            case .int2, .int4, .int8:
                return String(try cell.decode(Int.self))
            case .bool:
                return try cell.decode(Bool.self) ? "true" : "false"
            case .uuid:
                return try cell.decode(UUID.self).uuidString.lowercased()
            case .timestamp, .timestamptz, .date:
                return String(Int64(try cell.decode(Date.self).timeIntervalSince1970.rounded(.down)))
            case .float4, .float8:
                return String(try cell.decode(Double.self))
            case .numeric:
                return try cell.decode(String.self)
            case .bytea:
                // Bytes, not text: read as text they would be whatever bytes happen to be printable.
                throw InventorySourceError(
                    "column '\(cell.columnName)' is bytea (bytes, not text); convert it in the query, such as convert_from(\(cell.columnName), 'UTF8') or encode(\(cell.columnName), 'hex')."
                )
            default:
                // An enum or citext arrives as its text; anything else is refused.
                let text = String(buffer: bytes)
                if !text.isEmpty, text.utf8.allSatisfy({ $0 >= 0x20 }),
                    text.unicodeScalars.allSatisfy({ $0 != "\u{FFFD}" })
                {
                    return text
                }
                throw InventorySourceError(
                    "column '\(cell.columnName)' has a type tidemark does not read (oid \(cell.dataType.rawValue)); cast it in the query (\(cell.columnName)::text)."
                )
            }
        } catch let error as InventorySourceError {
            throw error
        } catch {
            throw InventorySourceError(
                "column '\(cell.columnName)' could not be read (\(cell.dataType)); cast it in the query (\(cell.columnName)::text)."
            )
        }
    }
}

/// Text sent without a type, so the server gives it the type its place in the statement needs (a
/// cursor value compared with a `timestamptz` or a `bigint` column).
struct UntypedText: PostgresNonThrowingEncodable {
    var text: String

    init(_ text: String) { self.text = text }

    static var psqlType: PostgresDataType { .null }
    static var psqlFormat: PostgresFormat { .text }

    func encode<JSONEncoder: PostgresJSONEncoder>(
        into byteBuffer: inout ByteBuffer, context: PostgresEncodingContext<JSONEncoder>
    ) {
        byteBuffer.writeString(text)
    }
}
