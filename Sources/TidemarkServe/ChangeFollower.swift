import Foundation
import Synchronization
import TidemarkCore
import TidemarkRuntime
import TidemarkStore

/// An inventory source whose changes `serve` follows, through the feed its kind's registry entry
/// builds (PostgreSQL's `changes` and `listen`, or a kind added from outside), as tidemark.yaml
/// declares it now.
public struct FollowedSource: Sendable, Equatable {
    /// The feed.
    public var feed: any ChangeFeed

    /// The source's name in tidemark.yaml.
    public var name: String { feed.source }

    /// A source followed through `feed`.
    public init(feed: any ChangeFeed) { self.feed = feed }

    /// The sources of `runtime`'s tidemark.yaml that follow their changes.
    public static func of(_ runtime: Runtime) -> [FollowedSource] {
        runtime.changeFeeds().map(FollowedSource.init)
    }

    /// Equal when they follow the same source the same way.
    public static func == (lhs: FollowedSource, rhs: FollowedSource) -> Bool { lhs.feed.identity == rhs.feed.identity }
}

/// What the inventory told a workspace between two reconciles.
public enum InventoryChange: Sendable, Equatable {
    /// Devices of the source changed (rows past the cursor, or notified on its channel), by id.
    case devices(source: String, ids: [String])
    /// What the changes say cannot be trusted; the source must be read in full (`why` says so).
    case fullRead(source: String, why: String)
    /// A watched input changed: a manifest or inventory file (by size or modification time), or what
    /// an `exec` source's command prints; the next reconcile reads it (`why` says what changed).
    case reread(source: String, why: String)
}

/// What the inventory said changed since the last reconcile started.
public struct PendingChanges: Sendable, Equatable {
    /// Changed devices, by source: a device changed again before a reconcile took it is one change
    /// (the later supersedes the earlier: the batch reads the device as it is then).
    public var devices: [String: Set<String>] = [:]
    /// The sources to read in full, and why.
    public var fullReads: [String: String] = [:]
    /// Watched inputs that changed (manifests, inventory files, commands), and what changed.
    public var rereads: [String: String] = [:]

    /// Nothing changed.
    public init() {}

    /// Whether nothing changed.
    public var isEmpty: Bool { devices.isEmpty && fullReads.isEmpty && rereads.isEmpty }
    /// The changed devices, each once.
    public var deviceCount: Int { devices.values.reduce(0) { $0 + $1.count } }
    /// The devices of one source, when they are all that changed: a batch planned on its own.
    public var batch: (source: String, ids: [String])? {
        guard fullReads.isEmpty, rereads.isEmpty, devices.count == 1, let (source, ids) = devices.first else {
            return nil
        }
        return (source, ids.sorted())
    }

    /// Takes what the next reconcile acts on, leaving the rest: when the changes are one source's
    /// devices only (a batch) and more than `limit` of them, `limit` devices; otherwise (or with a
    /// `limit` of 0) everything.
    public mutating func take(upTo limit: Int) -> PendingChanges {
        guard limit > 0, fullReads.isEmpty, rereads.isEmpty, devices.count == 1, let (source, ids) = devices.first,
            ids.count > limit
        else {
            defer { self = PendingChanges() }
            return self
        }
        let taken = Set(ids.sorted().prefix(limit))
        devices[source] = ids.subtracting(taken)
        var batch = PendingChanges()
        batch.devices[source] = taken
        return batch
    }

    /// Adds what `change` says.
    public mutating func add(_ change: InventoryChange) {
        switch change {
        case .devices(let source, let ids): devices[source, default: []].formUnion(ids)
        case .fullRead(let source, let why): fullReads[source] = why
        case .reread(let source, let why): rereads[source] = why
        }
    }
}

/// Follows the changes of a workspace's sources while its replica owns the workspace: the rows past
/// each source's cursor every `poll`, and its notifications.
/// Each change wakes the workspace's reconcile at once. What it cannot follow it never leaves
/// silent: a lost `LISTEN` connection, a cursor that went backwards, a changes query that failed and
/// then recovered each ask for a full read and say why in the log.
struct ChangeFollower: Sendable {
    /// How often `serve` runs each source's changes query.
    static let poll = Duration.seconds(1)

    /// The workspace, for the log.
    var workspace: String
    /// How often the changes query runs.
    var poll = ChangeFollower.poll
    /// The most changed rows read at once.
    var batch = 10_000
    /// The clock it waits by.
    var timing: Timing
    /// The log.
    var log: ServeLog

    /// Follows the sources `sources` names and watches the inputs `inputs` names (asked again each time
    /// `reloads` grows: reloaded settings start over) while this replica owns the workspace (`owning`), telling
    /// `wake` of each change, until cancelled. Each time the replica starts owning it, `ready` is told
    /// the ownership's generation once every watch has its starting point (a baseline of the files, a
    /// command's first output, a cursor, a LISTEN connection): what changes after that is seen.
    func run(
        sources: @escaping @Sendable () -> [FollowedSource],
        inputs: @escaping @Sendable () -> WatchedInputs = { WatchedInputs() },
        owning: OwnershipSignal, reloads: Beacon = Beacon(), wake: @escaping @Sendable (InventoryChange) -> Void,
        ready: @escaping @Sendable (Int) -> Void = { _ in }
    ) async {
        while !Task.isCancelled, !Task.isShuttingDownGracefully {
            let followed = sources()
            let watched = inputs()
            // Each watch by the name its starting point is reported under.
            var watches: [(name: String, run: @Sendable (_ report: @escaping @Sendable (Int) -> Void) async -> Void)] =
                []
            if let directory = watched.manifests {
                watches.append(("files", { await watchFiles(directory, owning: owning, report: $0, wake: wake) }))
            }
            for command in watched.commands {
                watches.append(
                    ("command \(command.name)", { await watchCommand(command, owning: owning, report: $0, wake: wake) })
                )
            }
            for source in followed {
                if source.feed.cursorName != nil {
                    watches.append(
                        (
                            "cursor \(source.name)",
                            { await followCursor(source, owning: owning, report: $0, wake: wake) }
                        ))
                }
                if source.feed.listenName != nil {
                    watches.append(
                        ("listen \(source.name)", { await listen(source, owning: owning, report: $0, wake: wake) }))
                }
            }
            let starts = WatchStarts(watches: Set(watches.map(\.name)), ready: ready)
            await withDiscardingTaskGroup { group in
                for watch in watches {
                    group.addTask { await watch.run(starts.reporter(watch.name)) }
                }
                while !Task.isCancelled, !Task.isShuttingDownGracefully {
                    let mark = reloads.value
                    guard sources() == followed, inputs() == watched else { break }
                    await reloads.wait(beyond: mark)
                }
                group.cancelAll()
            }
        }
    }

    /// Reads the rows past the cursor every poll. The cursor starts at the source's largest value
    /// when the replica starts owning the workspace (its first reconcile reads everything anyway).
    func followCursor(
        _ followed: FollowedSource, owning: OwnershipSignal, report: @Sendable (Int) -> Void,
        wake: @Sendable (InventoryChange) -> Void
    ) async {
        // One connection, kept: a poll is one query.
        guard let source = followed.feed.cursor(), let cursorName = followed.feed.cursorName else { return }
        var cursor: String?
        var started = false
        var failing: String?
        // Whether the cursor went backwards is asked every tenth poll that found nothing.
        var quiet = 0
        var generation = owning.generation
        while !Task.isCancelled, !Task.isShuttingDownGracefully {
            guard owning.isOwning, owning.generation == generation || !started else {
                if started { await source.close() }
                started = false
                await owning.waitUntilOwning()
                generation = owning.generation
                continue
            }
            do {
                if !started {
                    generation = owning.generation
                    cursor = try await source.current()
                    started = true
                    report(generation)
                } else {
                    let read = try await source.changed(after: cursor, limit: batch)
                    quiet = read.ids.isEmpty ? quiet + 1 : 0
                    if !read.ids.isEmpty {
                        cursor = read.cursor
                        wake(.devices(source: followed.name, ids: read.ids))
                        if read.ids.count == batch { continue }
                    } else if quiet % 10 == 0, let last = cursor, try await source.wentBack(from: last) {
                        let why =
                            "its cursor \(cursorName) went backwards (the largest value is now below \(last): a restored or emptied table, a reset sequence)"
                        log.warning(
                            "workspace=\(workspace) inventory source '\(followed.name)': \(why); reading it in full and following from its new end"
                        )
                        cursor = try await source.current()
                        wake(.fullRead(source: followed.name, why: why))
                    }
                }
                if let problem = failing {
                    failing = nil
                    let why = "its changes could not be read for a while (\(problem))"
                    log(
                        "workspace=\(workspace) inventory source '\(followed.name)': its changes can be read again; reading it in full, as changes may have been missed"
                    )
                    wake(.fullRead(source: followed.name, why: why))
                }
            } catch {
                let message = Failure(error).plainMessage
                if failing != message {
                    log.warning(
                        "workspace=\(workspace) inventory source '\(followed.name)': its changes cannot be read: \(message); check \(followed.feed.settingsHint). Reconciles still read it in full on their schedule"
                    )
                    failing = message
                }
            }
            await ServeWait.pause(poll, timing: timing)
        }
        await source.close()
    }

    /// Listens on the source's channel; a notification names a changed device (an empty one, a
    /// truncated table). A lost connection is made again, and the source read in full, as
    /// notifications sent while nobody listened are lost.
    func listen(
        _ followed: FollowedSource, owning: OwnershipSignal, report: @escaping @Sendable (Int) -> Void,
        wake: @escaping @Sendable (InventoryChange) -> Void
    ) async {
        let feed = followed.feed
        let listening = feed.listenName ?? "its notifications"
        var lost: String?
        var backoff = Duration.seconds(1)
        let workspace = self.workspace
        let log = self.log
        while !Task.isCancelled, !Task.isShuttingDownGracefully {
            guard owning.isOwning else {
                lost = nil
                await owning.waitUntilOwning()
                continue
            }
            let generation = owning.generation
            var problem: String
            let connected = Flag()
            do {
                let wasLost = lost
                try await feed.listen {
                    connected.set()
                    report(generation)
                    if let wasLost {
                        log(
                            "workspace=\(workspace) inventory source '\(followed.name)': \(listening) again; reading it in full, as notifications sent while the connection was down are lost"
                        )
                        wake(.fullRead(source: followed.name, why: "its \(listening) connection was lost (\(wasLost))"))
                    }
                } each: { payload in
                    if payload.isEmpty {
                        wake(.fullRead(source: followed.name, why: "its table was truncated"))
                    } else {
                        wake(.devices(source: followed.name, ids: [payload]))
                    }
                    return owning.isOwning && owning.generation == generation
                }
                if Task.isCancelled || Task.isShuttingDownGracefully { return }
                if !owning.isOwning || owning.generation != generation { continue }
                problem = "the server ended the connection"
            } catch {
                problem = Failure(error).plainMessage
            }
            if connected.isSet { lost = nil }
            if lost == nil {
                log.warning(
                    "workspace=\(workspace) inventory source '\(followed.name)': the \(listening) connection was lost: \(problem); connecting again, then reading the source in full"
                )
                backoff = .seconds(1)
            }
            lost = problem
            await ServeWait.pause(backoff, timing: timing)
            backoff = min(backoff * 2, .seconds(30))
        }
    }
}

/// Collects, for each ownership generation, which watches have their starting point, and tells
/// `ready` once all have.
final class WatchStarts: Sendable {
    private let watches: Set<String>
    private let ready: @Sendable (Int) -> Void
    private let started = Mutex<[Int: Set<String>]>([:])

    /// Starts of `watches`, told to `ready` for the generations of `owning`.
    init(watches: Set<String>, ready: @escaping @Sendable (Int) -> Void) {
        self.watches = watches
        self.ready = ready
    }

    /// What the watch `name` calls with the generation it started in.
    func reporter(_ name: String) -> @Sendable (Int) -> Void {
        { generation in
            let all = self.started.withLock { started -> Bool in
                started = started.filter { $0.key >= generation }
                let before = started[generation, default: []]
                started[generation, default: []].insert(name)
                return before != self.watches && started[generation] == self.watches
            }
            if all { self.ready(generation) }
        }
    }
}

/// A flag one task sets and another reads.
final class Flag: Sendable {
    private let value = Mutex(false)

    /// Sets it.
    func set() { value.withLock { $0 = true } }
    /// Whether it was set.
    var isSet: Bool { value.withLock { $0 } }
}
