import Foundation
import Synchronization
import Testing
import TidemarkCore
import TidemarkRuntime
import TidemarkTesting

@testable import TidemarkServe

/// A table of devices kept in memory, named in tidemark.yaml (`memory: {table: NAME}`), whose rows
/// carry a sequence number that grows with each change: an inventory source kind added from outside,
/// with a change feed of its own, registered with one call.
final class MemoryTable: Sendable {
    struct Row: Sendable {
        var id: String
        var token: String
        var kind: String
        var sequence: Int
    }

    private static let tables = Mutex<[String: MemoryTable]>([:])
    private let rows = Mutex<[String: Row]>([:])
    private let sequence = Mutex(0)

    static func named(_ name: String) -> MemoryTable {
        tables.withLock { tables in
            if let table = tables[name] { return table }
            let table = MemoryTable()
            tables[name] = table
            return table
        }
    }

    /// Inserts or updates a device; its row's sequence number grows.
    func put(_ id: String, token: String, kind: String) {
        let next = sequence.withLock {
            $0 += 1
            return $0
        }
        rows.withLock { $0[id] = Row(id: id, token: token, kind: kind, sequence: next) }
    }

    var all: [Row] { rows.withLock { $0.values.sorted { $0.id < $1.id } } }
    var last: Int { sequence.withLock { $0 } }

    func add(_ rows: [Row], name: String, into builder: inout InventoryBuilder) {
        let source = builder.source("memory: \(name)")
        for (line, row) in rows.enumerated() {
            builder.add(id: row.id, token: row.token, labels: [("kind", row.kind)], from: source, line: line + 1)
        }
    }
}

struct MemorySource: InventorySource {
    var name: String
    var table: MemoryTable

    func load(into builder: inout InventoryBuilder) async throws -> InventorySnapshot {
        table.add(table.all, name: name, into: &builder)
        return InventorySnapshot(identity: "memory \(table.last)")
    }
}

/// The table's feed: a cursor over the sequence numbers.
struct MemoryFeed: ChangeFeed {
    var source: String
    var table: MemoryTable
    var tableName: String

    var resync: Duration { .seconds(3600) }
    var settingsHint: String { "'memory.table'" }
    var identity: String { "memory \(source) \(tableName)" }
    var cursorName: String? { "'sequence'" }
    var listenName: String? { nil }

    struct Cursor: ChangeCursor {
        var table: MemoryTable
        func current() async throws -> String? { String(table.last) }
        func changed(after cursor: String?, limit: Int) async throws -> (ids: [String], cursor: String?) {
            let from = cursor.flatMap(Int.init) ?? 0
            let rows = table.all.filter { $0.sequence > from }.sorted { $0.sequence < $1.sequence }.prefix(limit)
            return (rows.map(\.id), rows.last.map { String($0.sequence) } ?? cursor)
        }
        func wentBack(from cursor: String) async throws -> Bool { table.last < (Int(cursor) ?? 0) }
        func close() async {}
    }

    func cursor() -> (any ChangeCursor)? { Cursor(table: table) }
    func listen(connected: @escaping @Sendable () -> Void, each: @escaping @Sendable (String) -> Bool) async throws {}
    func readDevices(_ ids: [String], into builder: inout InventoryBuilder) async throws {
        let wanted = Set(ids)
        table.add(table.all.filter { wanted.contains($0.id) }, name: source, into: &builder)
    }
}

extension Registries {
    /// tidemark's own, with the `memory` kind and its feed.
    static var withMemory: Registries {
        var registries = Registries.standard
        registries.sources.register(
            .strings("memory"), as: StringSourceSettings.self,
            { settings, spec, _ in MemorySource(name: spec.name, table: .named(settings.values["table"] ?? "")) },
            follow: { settings, spec, _ in
                let name = settings.values["table"] ?? ""
                return MemoryFeed(source: spec.name, table: .named(name), tableName: name)
            })
        return registries
    }
}

/// Following changes is a capability of a source kind, declared through its registry entry: a kind
/// added from outside (a test target) with its own feed is followed by `serve` as PostgreSQL is.
struct ExtensionFeedTests {
    @Test func aSourceKindAddedFromOutsideIsFollowedThroughItsOwnFeed() async throws {
        let name = "table-\(UUID().uuidString)"
        let table = MemoryTable.named(name)
        table.put("d1", token: Fixtures.token(1), kind: "phone")
        let project = try ServeProject(
            extraSettings: "inventory:\n  - name: mem\n    memory: {table: \(name)}\n")
        defer { project.remove() }
        try (ServeProject.phones + "\n").write(
            to: project.root.appendingPathComponent("manifests/topics.yaml"), atomically: true, encoding: .utf8)
        let flags = project.flags
        let registries = Registries.withMemory
        let load: @Sendable () throws -> Runtime = { try Runtime.load(flags, environment: [:], registries: registries) }
        let runtime = try load()
        let followed = FollowedSource.of(runtime)
        #expect(followed.map(\.name) == ["mem"])
        #expect(
            Serve.followingLine(workspace: "default", followed).contains(
                "inventory source 'mem' (rows past its cursor 'sequence' every 1s)"))

        var settings = ServeSettings()
        settings.interval = .seconds(3600)
        var reconciler = Reconciler(runtime: runtime, settings: settings)
        reconciler.followsChanges = true
        let lines = Mutex<[String]>([])
        let runner = WorkspaceRunner(
            status: Serve.initialStatus(runtime, settings: settings), reconciler: reconciler,
            ownership: .init(records: InMemoryStateStore(workspace: "default"), replica: "r1", poll: .milliseconds(50)),
            metrics: ServeMetrics(), followed: followed,
            log: ServeLog(lines: { line in lines.withLock { $0.append(line) } }))
        let running = Task { try await runner.run() }
        defer { running.cancel() }
        func story() -> String { lines.withLock { $0.joined(separator: "\n") } }
        func members() async throws -> Int {
            let runtime = try load()
            return try await runtime.withBackend(output: SilentOutput()) { backend in
                try await backend.refresh([1, 2].map { Fixtures.token($0) }).filter { status in
                    if case .active(let topics) = status { topics.contains("phones") } else { false }
                }.count
            }
        }
        func until(_ what: String, _ condition: () async throws -> Bool) async throws {
            let end = ContinuousClock.now + .seconds(60)
            while try await !condition() {
                guard ContinuousClock.now < end else {
                    Issue.record("\(what) within 60 s\n\(story())")
                    return
                }
                try await Task.sleep(for: .milliseconds(50))
            }
        }
        try await until("the first reconcile") { runner.status.phase == .ready }
        #expect(try await members() == 1)
        // Its watches have their starting point before the first reconcile: a row added now is a change.
        table.put("d2", token: Fixtures.token(2), kind: "phone")
        try await until("the new device joined") { try await members() == 2 }
        #expect(
            lines.withLock {
                $0.contains { $0.contains("reconcile started by the inventory: 1 device change in 'mem'") }
            },
            "\(story())")
        // A batch of the one changed device, read through the feed (its result is counted a moment after
        // the backend has it).
        try await until("a batch of the changed device") { runner.status.last?.changedDevices == 1 }
        running.cancel()
        _ = try? await running.value
    }
}
