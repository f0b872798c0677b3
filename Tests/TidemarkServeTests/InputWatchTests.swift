import Foundation
import Synchronization
import Testing
import TidemarkCore
import TidemarkRuntime
import TidemarkTesting

@testable import TidemarkServe

/// Files and commands `serve` watches between reconciles: an edit of the manifests directory and a
/// change of what an `exec` source prints each start a reconcile at once, with an interval of an hour.
@Suite struct InputWatchTests {
    /// One device a line for an `exec` source, kind phone.
    static func jsonl(_ ids: [Int]) -> String {
        ids.map { #"{"id": "d\#($0)", "token": "\#(Fixtures.token($0))", "labels": {"kind": "phone"}}"# }
            .joined(separator: "\n") + "\n"
    }

    @Test func aFileEditAndACommandsNewOutputStartAReconcileEachAtOnce() async throws {
        let project = try ServeProject(
            extraSettings: """
                inventory:
                  - name: cmd
                    exec: {command: [cat, devices.jsonl], interval: 1s}
                """)
        defer { project.remove() }
        let commandOutput = project.root.appendingPathComponent("devices.jsonl")
        try Self.jsonl([100]).write(to: commandOutput, atomically: true, encoding: .utf8)
        try project.writeDevices([0, 1])
        let runtime = try project.runtime()
        let watched = WatchedInputs.of(runtime, git: false)
        #expect(watched.manifests == runtime.manifestsPath)
        #expect(watched.commands.map(\.name) == ["cmd"] && watched.commands.first?.interval == .seconds(1))
        #expect(WatchedInputs.of(runtime, git: true).manifests == nil, "git manifests are fetched on the schedule")
        var settings = ServeSettings()
        settings.interval = .seconds(3600)
        let lines = Mutex<[String]>([])
        let runner = WorkspaceRunner(
            status: Serve.initialStatus(runtime, settings: settings),
            reconciler: try project.reconciler { $0 = settings },
            ownership: .init(records: InMemoryStateStore(workspace: "default"), replica: "r1", poll: .milliseconds(50)),
            metrics: ServeMetrics(), watched: watched,
            log: ServeLog(lines: { line in lines.withLock { $0.append(line) } }))
        let running = Task { try await runner.run() }
        defer { running.cancel() }
        func count() -> Int { lines.withLock { $0.count { $0.hasPrefix("reconcile workspace=") } } }
        func settle(_ expected: Int) async throws {
            let start = ContinuousClock.now
            while count() < expected, ContinuousClock.now - start < .seconds(30) {
                try await Task.sleep(for: .milliseconds(20))
            }
        }
        try await settle(1)
        #expect(count() == 1 && runner.status.last?.subscribed == 3, "the first reconcile: d0, d1 and d100")
        // The watch takes its baseline on its first poll after the replica owns the workspace.
        try await Task.sleep(for: .milliseconds(1500))

        try project.writeDevices([0, 1, 2])
        try await settle(2)
        #expect(count() == 2 && runner.status.last?.subscribed == 1, "a manifest edit: d2 joins at once")
        #expect(
            lines.withLock {
                $0.contains {
                    $0.contains("reconcile started by the inventory: manifests: 'topics.yaml' changed")
                }
            }, "\(lines.withLock { $0 })")

        try Self.jsonl([100, 101]).write(to: commandOutput, atomically: true, encoding: .utf8)
        try await settle(3)
        #expect(count() == 3 && runner.status.last?.subscribed == 1, "the command's new output: d101 joins at once")
        #expect(
            lines.withLock {
                $0.contains {
                    $0.contains("reconcile started by the inventory: 'cmd': what its command prints changed")
                }
            })
        try await Task.sleep(for: .milliseconds(2500))
        #expect(count() == 3, "nothing changed since: no more reconciles (the interval is an hour)")
        running.cancel()
        _ = try? await running.value
    }

    @Test func aCommandThatFailsIsSaidOnceAndAgainWhenItRunsAgain() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("tm-watch-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let output = directory.appendingPathComponent("out.txt")
        let lines = Mutex<[String]>([])
        let woken = Mutex<[InventoryChange]>([])
        var follower = ChangeFollower(
            workspace: "w", timing: .live, log: ServeLog(lines: { line in lines.withLock { $0.append(line) } }))
        follower.poll = .milliseconds(50)
        let command = WatchedCommand(
            name: "cmd", interval: .milliseconds(100),
            runner: .init(command: ["cat", output.path], directory: directory.path, timeout: 10))
        let owning = OwnershipSignal()
        owning.set(true)
        let watching = Task {
            await follower.watchCommand(
                command, owning: owning, wake: { change in woken.withLock { $0.append(change) } })
        }
        defer { watching.cancel() }
        /// Waits up to 20 s (a loaded machine starts programs slowly) for `condition`.
        func until(_ condition: () -> Bool) async throws {
            let start = ContinuousClock.now
            while !condition(), ContinuousClock.now - start < .seconds(20) {
                try await Task.sleep(for: .milliseconds(20))
            }
        }
        try await until { lines.withLock { $0.contains { $0.contains("its command failed") } } }
        try await Task.sleep(for: .milliseconds(400))
        #expect(
            lines.withLock { $0.count { $0.contains("its command failed") } } == 1,
            "said once: \(lines.withLock { $0 })")
        try "a\n".write(to: output, atomically: true, encoding: .utf8)
        try await until { lines.withLock { $0.contains { $0.contains("its command runs again") } } }
        #expect(lines.withLock { $0.contains { $0.contains("its command runs again") } })
        #expect(woken.withLock { $0.isEmpty }, "the first output it prints is its baseline")
        try "b\n".write(to: output, atomically: true, encoding: .utf8)
        try await until { !woken.withLock { $0.isEmpty } }
        #expect(woken.withLock { $0 } == [.reread(source: "cmd", why: "what its command prints changed")])
        watching.cancel()
        await watching.value
    }

    @Test func inventoryFilesNamedOutsideTheManifestsDirectoryAreWatchedToo() throws {
        let root = FileManager.default.temporaryDirectory.appendingPathComponent("tm-watch-\(UUID().uuidString)")
        let manifests = root.appendingPathComponent("manifests")
        try FileManager.default.createDirectory(at: manifests, withIntermediateDirectories: true)
        try FileManager.default.createDirectory(
            at: root.appendingPathComponent("data"), withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: root) }
        try "inventory:\n  files: [../data/devices.csv, local.csv, 'exports/*.csv']\n".write(
            to: manifests.appendingPathComponent("inventory.yaml"), atomically: true, encoding: .utf8)
        try "device_id,token\n".write(
            to: root.appendingPathComponent("data/devices.csv"), atomically: true, encoding: .utf8)
        let outside = DirectoryStamps.namedOutside(manifests.path, manifests: ["inventory.yaml"])
        #expect(outside == [root.appendingPathComponent("data/devices.csv").standardizedFileURL.path])
        try "state".write(to: manifests.appendingPathComponent("state.db"), atomically: true, encoding: .utf8)
        let before = DirectoryStamps.read(manifests.path, extra: outside)
        #expect(before.files.keys.sorted() == [outside[0], "inventory.yaml"])
        try "device_id,token\nd1,x\n".write(
            to: root.appendingPathComponent("data/devices.csv"), atomically: true, encoding: .utf8)
        try "x".write(to: manifests.appendingPathComponent("local.csv"), atomically: true, encoding: .utf8)
        try "changed".write(to: manifests.appendingPathComponent("state.db"), atomically: true, encoding: .utf8)
        let after = DirectoryStamps.read(manifests.path, extra: outside)
        #expect(after.changed(from: before) == [outside[0], "local.csv"])
    }
}
