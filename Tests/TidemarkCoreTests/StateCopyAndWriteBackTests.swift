import Foundation
import Synchronization
import Testing
import TidemarkCore
import TidemarkTesting

/// The two workflows that moved out of the CLI: copying a state between stores, and writing dead
/// devices back to a file and to the sources that listed them.
@Suite struct StateCopyAndWriteBackTests {
    static let holder = StateStoreConformance.holder

    static func saved(
        _ store: InMemoryStateStore, serial: Int, lineage: String = StateStoreConformance.lineage
    )
        async throws
    {
        var state = StateStoreConformance.sample(tokens: 20, lineage: lineage)
        for _ in 0..<serial { try await store.save(&state, StateStoreConformance.writeAll(state), at: 1) }
    }

    @Test func aCopyKeepsLineageAndSerialAndNeedsAnEmptyTarget() async throws {
        let (source, target) = (InMemoryStateStore(location: "a"), InMemoryStateStore(location: "b"))
        try await Self.saved(source, serial: 3)
        let timing = ManualClock().timing
        let copied = try await StateCopyWorkflow(from: source, to: target, timing: timing).run(
            .emptyTarget, holder: Self.holder)
        #expect(copied.serial == 3)
        let written = try #require(try await target.load())
        #expect(written.serial == 3)
        #expect(written.lineage == StateStoreConformance.lineage)
        #expect(written.tokens.count == 20)
        // Both locks were let go.
        #expect(try await source.lockHolder() == nil)
        #expect(try await target.lockHolder() == nil)
        let error = await #expect(throws: StateCopyWorkflow.Refusal.self) {
            try await StateCopyWorkflow(from: source, to: target, timing: timing).run(.emptyTarget, holder: Self.holder)
        }
        #expect(error?.description.hasPrefix("b already holds a state (lineage 0f3e8a52, serial 3)") == true)
        let empty = await #expect(throws: StateCopyWorkflow.Refusal.self) {
            try await StateCopyWorkflow(from: InMemoryStateStore(location: "c"), to: target, timing: timing).run(
                .emptyTarget, holder: Self.holder)
        }
        #expect(empty?.description == "there is no state at c to copy.")
    }

    @Test func aPushNeedsTheSameLineageAtANewerSerial() async throws {
        let timing = ManualClock().timing
        let (older, newer) = (InMemoryStateStore(location: "old.db"), InMemoryStateStore(location: "server"))
        try await Self.saved(older, serial: 2)
        try await Self.saved(newer, serial: 4)
        let stale = await #expect(throws: StateCopyWorkflow.Refusal.self) {
            try await StateCopyWorkflow(from: older, to: newer, timing: timing).run(
                .newerThanTarget, holder: Self.holder)
        }
        #expect(stale?.description == "old.db is at serial 2, not newer than server at serial 4; nothing was pushed.")
        #expect(try await newer.load()?.serial == 4)
        let foreign = InMemoryStateStore(location: "other.db")
        try await Self.saved(foreign, serial: 9, lineage: "9a9a9a9a-0000-0000-0000-000000000000")
        let other = await #expect(throws: StateCopyWorkflow.Refusal.self) {
            try await StateCopyWorkflow(from: foreign, to: newer, timing: timing).run(
                .newerThanTarget, holder: Self.holder)
        }
        #expect(other?.description.contains("is another state (lineage 9a9a9a9a)") == true)
        let ahead = InMemoryStateStore(location: "ahead.db")
        try await Self.saved(ahead, serial: 5)
        _ = try await StateCopyWorkflow(from: ahead, to: newer, timing: timing).run(
            .newerThanTarget, holder: Self.holder)
        #expect(try await newer.load()?.serial == 5)
    }

    /// The device ids a sink was given.
    final class Received: Sendable {
        private let ids = Mutex<[String]>([])
        func add(_ more: [String]) { ids.withLock { $0 += more } }
        var all: [String] { ids.withLock { $0 } }
    }

    /// A sink that records what it was given, or fails.
    struct RecordingSink: DeadTokenSink {
        var name: String
        var reportsDead = true
        var fails = false
        let got = Received()

        func load(into builder: inout InventoryBuilder) async throws -> InventorySnapshot {
            InventorySnapshot(identity: "none")
        }

        func reportDead(_ devices: [DeadDevice], at time: Date) async throws -> (reported: Int, rowsChanged: Int?) {
            struct HookFailed: Error, CustomStringConvertible {
                var description: String { "on_dead of 'broken' exited with status 3" }
            }
            if fails { throw HookFailed() }
            got.add(devices.map(\.deviceID))
            return (devices.count, 1)
        }
    }

    @Test func deadDevicesGoToTheFileAndEachToItsOwnSource() async throws {
        let a = RecordingSink(name: "app-db")
        let silent = RecordingSink(name: "no-hook", reportsDead: false)
        let broken = RecordingSink(name: "broken", fails: true)
        let dead = [
            DeadDevice(deviceID: "d1", token: Fixtures.token(1), source: ConfiguredSource.display("app-db")),
            DeadDevice(deviceID: "d2", token: Fixtures.token(2), source: ConfiguredSource.display("no-hook")),
            DeadDevice(deviceID: "d3", token: Fixtures.token(3), source: ConfiguredSource.display("broken")),
            DeadDevice(deviceID: "d4", token: Fixtures.token(4), source: "manifests/devices.csv"),
        ]
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("dead-\(UUID().uuidString).ndjson")
            .path
        defer { try? FileManager.default.removeItem(atPath: file) }
        let report = try await DeadTokenWriteBack(sinks: [a, silent, broken], timing: ManualClock().timing).run(
            dead, file: file)
        #expect(report.dead == 4)
        #expect(a.got.all == ["d1"])
        #expect(silent.got.all.isEmpty)
        #expect(report.reported.map(\.source) == ["app-db"])
        #expect(report.failures == ["on_dead of 'broken' exited with status 3"])
        let lines = try String(contentsOfFile: file, encoding: .utf8).split(separator: "\n")
        #expect(lines.count == 4)
        let mode = try FileManager.default.attributesOfItem(atPath: file)[.posixPermissions] as? Int
        #expect(mode == 0o600)
        // A file that cannot be written stops the write-back before any hook runs.
        let nowhere = RecordingSink(name: "app-db")
        await #expect(throws: DeadTokenWriteBack.FileError.self) {
            try await DeadTokenWriteBack(sinks: [nowhere], timing: ManualClock().timing).run(
                dead, file: "/nonexistent-dir/dead.ndjson")
        }
        #expect(nowhere.got.all.isEmpty)
    }
}
