import Foundation
import ServiceLifecycle
import Synchronization
import TidemarkCore
import TidemarkRuntime
import UnixSignals

/// The workspaces `serve` reconciles, one runner each, as one service: a reload adds runners for
/// workspaces new to tidemark.yaml, gives the others their new settings, and retires those no longer
/// listed (each after its current round, giving its claim up).
final class WorkspaceFleet: Service, Sendable {
    /// A runner, and how it takes reloaded settings.
    typealias Made = (runner: WorkspaceRunner, update: @Sendable (Serve.Planned) -> Void)

    private struct Member: Sendable {
        var entry: String?
        /// Its state and workspace, as shown: the store its claims and records live in.
        var state: String
        var runner: WorkspaceRunner
        var update: @Sendable (Serve.Planned) -> Void
    }

    private let members: Mutex<[Member]>
    private let make: @Sendable (Serve.Planned) -> Made
    private let log: ServeLog
    private let started: AsyncStream<WorkspaceRunner>
    private let continuation: AsyncStream<WorkspaceRunner>.Continuation

    /// A fleet of `planned`, whose runners `make` builds.
    init(
        _ planned: [Serve.Planned], make: @escaping @Sendable (Serve.Planned) -> Made,
        log: ServeLog
    ) {
        self.make = make
        self.log = log
        members = Mutex(
            planned.map { workspace in
                let made = make(workspace)
                return Member(
                    entry: workspace.entry, state: workspace.runtime.stateDisplay, runner: made.runner,
                    update: made.update)
            })
        (started, continuation) = AsyncStream.makeStream(of: WorkspaceRunner.self)
        for member in members.withLock({ $0 }) { continuation.yield(member.runner) }
    }

    /// The `serve.workspaces` entries reconciled now (nil: the project's own workspace).
    var entries: [String?] { members.withLock { $0.map(\.entry) } }

    /// Each workspace's status, in tidemark.yaml's order.
    var statuses: [WorkspaceStatus] { members.withLock { $0.map(\.runner.status) } }

    /// The runner of `entry`, if the fleet has one.
    func runner(_ entry: String?) -> WorkspaceRunner? {
        members.withLock { $0.first { $0.entry == entry }?.runner }
    }

    /// Reloaded settings (`why`: what asked for it): `planned` is what tidemark.yaml lists now.
    func reload(_ planned: [Serve.Planned], because why: String) {
        // A workspace whose state moved (another store or workspace name) is a new one: its runner's
        // claims and records live in the store it was made with.
        func same(_ member: Member, _ workspace: Serve.Planned) -> Bool {
            member.entry == workspace.entry && member.state == workspace.runtime.stateDisplay
        }
        let (added, kept, removed) = members.withLock { members -> ([Member], [(Member, Serve.Planned)], [Member]) in
            let removed = members.filter { member in !planned.contains { same(member, $0) } }
            var kept: [(Member, Serve.Planned)] = []
            var added: [Member] = []
            var next: [Member] = []
            for workspace in planned {
                if let member = members.first(where: { same($0, workspace) }) {
                    kept.append((member, workspace))
                    next.append(member)
                } else {
                    let made = make(workspace)
                    let member = Member(
                        entry: workspace.entry, state: workspace.runtime.stateDisplay, runner: made.runner,
                        update: made.update)
                    added.append(member)
                    next.append(member)
                }
            }
            members = next
            return (added, kept, removed)
        }
        for (member, workspace) in kept { member.update(workspace) }
        for member in removed {
            member.runner.retire()
            log(
                "workspace=\(member.runner.name) is no longer listed in tidemark.yaml\(planned.contains { $0.entry == member.entry } ? " with this state" : ""): this replica stops reconciling it after its current round and gives its claim up"
            )
        }
        for member in added {
            log(
                "workspace=\(member.runner.name) is new in tidemark.yaml: this replica reconciles it when it owns it"
            )
            continuation.yield(member.runner)
        }
        log(
            "settings reloaded (\(why)): \(PlanRenderer.counted(planned.count, "workspace")) (\(added.count) added, \(removed.count) removed)"
        )
    }

    /// Runs every runner, and those reloads add, until the service group shuts down.
    func run() async throws {
        await withGracefulShutdownHandler {
            await withDiscardingTaskGroup { group in
                for await runner in started {
                    group.addTask { try? await runner.run() }
                }
            }
        } onGracefulShutdown: {
            self.continuation.finish()
        }
    }
}

/// Reloads `serve`'s settings on SIGHUP and when tidemark.yaml changes (looked at every `interval`),
/// without a restart. A file that does not load is logged and changes nothing: `serve` keeps the
/// settings it runs with (and `/readyz` shows the settings check failing).
final class SettingsWatcher: Service, Sendable {
    private let file: String
    private let interval: Duration
    private let timing: Timing
    private let log: ServeLog
    private let apply: @Sendable (_ why: String) throws -> Void
    private let reloading = Mutex(())

    init(
        file: String, interval: Duration, timing: Timing, log: ServeLog,
        apply: @escaping @Sendable (_ why: String) throws -> Void
    ) {
        self.file = file
        self.interval = interval
        self.timing = timing
        self.log = log
        self.apply = apply
    }

    /// Reloads, saying why; a failure is logged and leaves the settings as they were.
    func reload(because why: String) {
        reloading.withLock { _ in
            do {
                try apply(why)
            } catch {
                log.error(
                    "\(why), but the settings do not load, so serve keeps those it runs with: \(Failure(error).plainMessage)"
                )
            }
        }
    }

    func run() async throws {
        let signals = await UnixSignalsSequence(trapping: .sighup)
        let hangups = Task {
            for await _ in signals { self.reload(because: "SIGHUP received") }
        }
        defer { hangups.cancel() }
        let (file, interval, timing) = (self.file, self.interval, self.timing)
        // Cancelled by a shutdown: the loop's sleeps need not look at it.
        await cancelWhenGracefulShutdown {
            var seen = FileManager.default.contents(atPath: file)
            while !Task.isCancelled {
                await ServeWait.pause(interval, timing: timing)
                let now = FileManager.default.contents(atPath: file)
                if now != seen, !Task.isCancelled {
                    seen = now
                    self.reload(because: "tidemark.yaml changed")
                }
            }
        }
    }
}
