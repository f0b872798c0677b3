import Foundation
import Synchronization

/// Where tidemark keeps its state: a local SQLite file today, a shared database tomorrow.
///
/// Every store passes one conformance suite (`TidemarkTesting.StateStoreConformance`). A store
/// holds at most one state; `load` answers nil until the first `save` creates it. Each `save`
/// writes only the parts its `StateWrite` names, in one transaction with the serial bump and the
/// journal entries it carries, so a batch and its journal entry land together or not at all.
public protocol StateStore: Sendable {
    /// How the store is named in messages (a path as the user wrote it, or a redacted URL).
    var location: String { get }

    /// The whole state, or nil when none was ever saved.
    func load() async throws -> State?

    /// Closes the store's connections to its file or server; its next use opens them again. A process
    /// that keeps a store for long (`serve`) closes it when it is done with it; one that exits need not.
    func close() async

    /// Writes the parts of `state` that `write` names and bumps the serial; creates the state on the
    /// first save (keeping `state.lineage`). Returns the new serial, also set in `state`.
    @discardableResult
    func save(_ state: inout State, _ write: StateWrite, at now: Int64) async throws -> Int

    /// The lineage and serial of the stored state (nil when none was saved): what a state kept in
    /// memory is checked against before it is written again (another run may have written since).
    func revision() async throws -> StateRevision?

    /// The newest apply that started and did not finish, with the operations it finished.
    func unfinishedApply() async throws -> UnfinishedApply?

    /// Past applies, newest first.
    func applies(limit: Int) async throws -> [ApplyRecord]

    /// Takes the store's exclusive lock for `holder`, or throws `StateStoreError` `.locked` naming
    /// whoever holds it. The lock lasts until the lease is released (or its process ends).
    func lock(_ holder: LockHolder) async throws -> any StateLease

    /// Who holds the lock now, or nil when it is free.
    func lockHolder() async throws -> LockHolder?
}

/// How a state store's lock ends.
public enum StateLockKind: Sendable, Equatable {
    /// The kernel releases it when the holding process ends (flock(2)); it cannot be broken.
    case process
    /// A lease renewed by a heartbeat: it expires when its holder stops renewing it, and can be broken.
    case lease
}

/// A lease on state: its id (`tidemark state force-unlock` takes a prefix of it), who holds it, and
/// when it expires unless renewed.
public struct LeaseRecord: Sendable, Equatable {
    /// The lease's id; `state force-unlock` takes a prefix of it.
    public var id: String
    /// Who holds the lease.
    public var holder: LockHolder
    /// When the lease expires unless renewed (by the store's clock).
    public var expires: Date

    /// A lease `id` held by `holder` until `expires`.
    public init(id: String, holder: LockHolder, expires: Date) {
        self.id = id
        self.holder = holder
        self.expires = expires
    }
}

/// Which save of which state a store holds.
public struct StateRevision: Sendable, Equatable, CustomStringConvertible {
    /// The state's lineage.
    public var lineage: String
    /// Its serial: one more with every save.
    public var serial: Int

    /// The revision `serial` of `lineage`.
    public init(lineage: String, serial: Int) {
        self.lineage = lineage
        self.serial = serial
    }

    /// The revision of `state`.
    public init(of state: State) { self.init(lineage: state.lineage, serial: state.serial) }

    /// "serial 12 of lineage 3f2a…".
    public var description: String { "serial \(serial) of lineage \(lineage.prefix(8))" }
}

extension StateStore {
    /// Nothing to close: a store that holds no connection.
    public func close() async {}

    /// The revision of the whole state, loaded: right for any store, and what a store that can read
    /// it alone does faster.
    public func revision() async throws -> StateRevision? {
        try await load().map { StateRevision(of: $0) }
    }

    /// How this store's lock ends: when its lease expires or is broken (a `LeaseKeeping` store), or
    /// with its process (a file lock).
    public var lockKind: StateLockKind { self is any LeaseKeeping ? .lease : .process }

}

/// A held state lock.
public protocol StateLease: Sendable {
    func release() async

    /// When the work under the lease last moved, for a lease that lets itself lapse when that work is
    /// stuck; nil for a lock that lives as long as its process (a file lock).
    var activity: LeaseActivity? { get }

    /// Throws when this run no longer holds the lock (its lease expired or was taken, by the store's
    /// clock): nothing more may be sent to FCM in its name. Cheap enough to ask before every request.
    func ensureHeld() async throws

    /// The lease's heartbeat: renews it until the calling task is cancelled (or the lease is lost).
    /// `withLock` runs it beside the work it covers. A lock that lives as long as its process returns
    /// at once.
    func keepAlive() async
}

extension StateLease {
    /// A lock that cannot be lost while its process lives (a file lock) is always held.
    public func ensureHeld() async throws {}

    /// A lock that lives as long as its process needs no heartbeat.
    public func keepAlive() async {}

    /// A lock that lives as long as its process is never stuck.
    public var activity: LeaseActivity? { nil }
}

/// When the work a lease covers last moved (a request sent or answered, a state transaction committed),
/// and whether it waits for a person (a confirmation prompt). A lease renewed by a heartbeat asks this
/// before each renewal, so work stuck for longer than its stall limit no longer holds the workspace: the
/// lease lapses, another run can take over, and the stuck run stops at its next request.
public final class LeaseActivity: Sendable {
    private struct Fields {
        var last: ContinuousClock.Instant
        var asking = 0
    }

    private let fields: Mutex<Fields>

    /// Activity that last moved `now`.
    public init(now: ContinuousClock.Instant = .now) { fields = Mutex(Fields(last: now)) }

    /// The work moved.
    public func progressed(at now: ContinuousClock.Instant = .now) {
        fields.withLock { $0.last = max($0.last, now) }
    }

    /// Runs `body`, a wait for a person, during which the work is not stuck however long it takes.
    public func waitingForPerson<T: Sendable>(_ body: () async throws -> T) async rethrows -> T {
        fields.withLock { $0.asking += 1 }
        defer {
            fields.withLock { f in
                f.asking -= 1
                f.last = max(f.last, .now)
            }
        }
        return try await body()
    }

    /// How long nothing has moved; nil while a person is asked.
    public func idle(at now: ContinuousClock.Instant = .now) -> Duration? {
        fields.withLock { f in f.asking > 0 ? nil : max(.zero, now - f.last) }
    }
}

/// Where the requests of a run ask whether its state lock is still held: the backend and the executor
/// check it before each request they send, so a run that lost its lease (paused past its expiry, its
/// lease broken) sends nothing more to FCM. Empty (always open) until `withLock` fills it.
public final class LeaseGate: Sendable {
    private let lease = Mutex<(any StateLease)?>(nil)

    /// An open gate, until `withLock` puts a lease in it.
    public init() {}

    /// Throws when the lease held for this run was lost.
    public func check() async throws {
        guard let held = lease.withLock({ $0 }) else { return }
        held.activity?.progressed()
        try await held.ensureHeld()
    }

    /// The run's work moved (an answer came back): a lease whose work moves is not stuck.
    public func progressed() {
        lease.withLock { $0 }?.activity?.progressed()
    }

    /// Runs `body`, a wait for a person (a confirmation prompt): however long it takes, the lease is
    /// not let go as stuck.
    public func waitingForPerson<T: Sendable>(_ body: () async throws -> T) async rethrows -> T {
        guard let activity = lease.withLock({ $0 })?.activity else { return try await body() }
        return try await activity.waitingForPerson(body)
    }

    func hold(_ held: (any StateLease)?) { lease.withLock { $0 = held } }

    /// Puts `held` in the gate, as `withLock` does (tests of what a lost lease stops).
    public func testHold(_ held: any StateLease) { hold(held) }
}

extension StateStore {
    /// Runs `body` holding the lock, and releases it however `body` ends.
    public func withLock<T: Sendable>(_ holder: LockHolder, _ body: () async throws -> T) async throws -> T {
        try await withLock(holder, waiting: 0, timing: .live, body)
    }

    /// Runs `body` holding the lock; while another run holds it, tries again every second for up to
    /// `timeout` seconds (`--lock-timeout`: a CI job that must not be dropped waits its turn instead of
    /// relying on a concurrency group, which cancels pending runs). Then fails naming the holder.
    public func withLock<T: Sendable>(
        _ holder: LockHolder, waiting timeout: Double, timing: Timing, gate: LeaseGate? = nil,
        onWait: (@Sendable (StateStoreError) -> Void)? = nil, _ body: () async throws -> T
    ) async throws -> T {
        let started = timing.now()
        var lease: any StateLease
        var said = false
        while true {
            do {
                lease = try await lock(holder)
                break
            } catch let error as StateStoreError where error.code == .locked {
                let left = timeout - Timing.seconds(timing.now() - started)
                guard left > 0 else { throw error }
                // A wait longer than a moment says what it waits for, once.
                if !said {
                    said = true
                    onWait?(error)
                }
                try await timing.sleep(.milliseconds(Int64(min(1, left) * 1000)))
            }
        }
        gate?.hold(lease)
        defer { gate?.hold(nil) }
        // The heartbeat runs beside `body` in one task group, and stops when `body` ends.
        let held = lease
        let outcome = await withTaskGroup(of: Void.self) { group -> Result<T, any Error> in
            group.addTask { await held.keepAlive() }
            defer { group.cancelAll() }
            do {
                return .success(try await body())
            } catch {
                return .failure(error)
            }
        }
        await lease.release()
        return try outcome.get()
    }
}

/// Who holds (or asks for) a state lock, as a second run is told.
public struct LockHolder: Sendable, Equatable, Codable, CustomStringConvertible {
    /// The command, such as `tidemark apply`.
    public var operation: String
    /// The user running the command.
    public var user: String
    /// The host it runs on.
    public var host: String
    /// Its process id.
    public var pid: Int32
    /// When it took the lock.
    public var since: Date
    /// The CI job running the command, when the environment names one.
    public var job: String?
    /// A random id of the process that holds the lock: two holders are the same only when this is.
    public var instance: String?
    /// The machine's boot and the process's PID namespace (`boot-id/pid:[inode]`): a process id means
    /// the same process only within one of these, so only then may a holder whose process id is gone be
    /// taken for dead (two containers may share a host name and process ids).
    public var namespace: String?

    /// A holder as a lock records it.
    public init(
        operation: String, user: String, host: String, pid: Int32, since: Date, job: String? = nil,
        instance: String? = nil, namespace: String? = nil
    ) {
        self.operation = operation
        self.user = user
        self.host = host
        self.pid = pid
        self.since = since
        self.job = job
        self.instance = instance
        self.namespace = namespace
    }

    /// This process's namespace as `namespace` records it; nil where it cannot be read.
    public static let currentNamespace: String? = {
        guard
            let boot = try? String(contentsOfFile: "/proc/sys/kernel/random/boot_id", encoding: .utf8)
                .trimmingCharacters(in: .whitespacesAndNewlines),
            let pidNamespace = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/ns/pid"),
            !boot.isEmpty
        else { return nil }
        return "\(boot)/\(pidNamespace)"
    }()

    /// A random id for this process, fixed for its life.
    public static let currentInstance = UUID().uuidString.lowercased()

    /// The holder as a second run is told: command, process, user, host, job and since when.
    public var description: String {
        "\(operation) (pid \(pid), user \(user) on \(host)\(job.map { ", job \($0)" } ?? "")) since \(ISO8601DateFormatter().string(from: since))"
    }

    /// The CI job URL the environment gives: GitHub Actions, GitLab CI, Buildkite, CircleCI, Jenkins.
    public static func jobURL(_ environment: [String: String]) -> String? {
        if let server = environment["GITHUB_SERVER_URL"], let repository = environment["GITHUB_REPOSITORY"],
            let run = environment["GITHUB_RUN_ID"]
        {
            return "\(server)/\(repository)/actions/runs/\(run)"
        }
        for key in ["CI_JOB_URL", "BUILDKITE_BUILD_URL", "CIRCLE_BUILD_URL", "BUILD_URL"] {
            if let url = environment[key], !url.isEmpty { return url }
        }
        return nil
    }
}

/// What one save changes; everything in it commits in one transaction with the serial bump.
public struct StateWrite: Sendable {
    /// Topics whose rows are written (or deleted, when `state` no longer has them).
    public var topics: [String] = []
    /// Groups whose rows are written (or deleted).
    public var groups: [String] = []
    /// Tokens whose last-seen time or liveness changed. New tokens are always written.
    public var tokens: [UInt32] = []
    /// Every token's last-seen time and liveness (after a full refresh).
    public var allTokens = false
    /// Journal: an apply starts with this id and plan.
    public var beginApply: (id: String, plan: Plan)?
    /// Journal: operations of an apply that finished.
    public var finishedOperations: [JournalEntry] = []
    /// Journal: the first tokens of operations that finished (per-token transports journal in steps);
    /// at most one per operation, and none for an operation in `finishedOperations`.
    public var operationProgress: [OperationProgress] = []
    /// Journal: an apply ended.
    public var finishApply: (id: String, status: ApplyStatus)?
    /// A copy of a whole state from another store (`state pull`, `push`, `migrate`): the serial and
    /// the row versions are the state's own, not bumped.
    public var restore = false
    /// The token table was rebuilt with new ids (`state prune`): every stored token is replaced.
    public var compact = false

    /// A write of nothing: only the serial is bumped.
    public init() {}

    /// Every topic and group that differs between `before` and `after`: rows that `after` dropped are
    /// deleted, rows that did not change are not written (their versions stay).
    public mutating func includeTopicsAndGroups(before: State, after: State) {
        topics = Set(before.topics.keys).union(after.topics.keys).filter { before.topics[$0] != after.topics[$0] }
            .sorted()
        groups = Set(before.groups.keys).union(after.groups.keys).filter { before.groups[$0] != after.groups[$0] }
            .sorted()
    }

    /// A write of everything in `state`, keeping its serial and versions: how a state is copied whole.
    public static func restoring(_ state: State) -> StateWrite {
        var write = StateWrite()
        write.topics = state.topics.keys.sorted()
        write.groups = state.groups.keys.sorted()
        write.allTokens = true
        write.restore = true
        return write
    }

    /// The version keys of the rows this write touches.
    public var versionKeys: [String] {
        Set(topics).map { State.versionKey(.topic, $0) } + Set(groups).map { State.versionKey(.group, $0) }
    }
}

/// One finished operation of an apply, as journaled.
public struct JournalEntry: Sendable, Equatable {
    /// The apply's id.
    public var applyID: String
    /// The operation's index in the apply's plan.
    public var index: Int
    /// Tokens the operation changed.
    public var ok: Int
    /// Tokens it could not change.
    public var failed: Int

    /// Operation `index` of apply `applyID` finished, with its counts.
    public init(applyID: String, index: Int, ok: Int, failed: Int) {
        self.applyID = applyID
        self.index = index
        self.ok = ok
        self.failed = failed
    }
}

/// How far an unfinished operation of an apply got: its first `tokensDone` tokens were sent and their
/// outcomes recorded in state, `ok` of them changed and `failed` did not. A resumed apply sends only the
/// rest.
public struct OperationProgress: Sendable, Equatable {
    /// The apply's id.
    public var applyID: String
    /// The operation's index in the apply's plan.
    public var index: Int
    /// The operation's first tokens sent and recorded.
    public var tokensDone: Int
    /// Of them, the tokens changed.
    public var ok: Int
    /// Of them, the tokens not changed.
    public var failed: Int

    /// Operation `index` of apply `applyID` got `tokensDone` tokens far.
    public init(applyID: String, index: Int, tokensDone: Int, ok: Int, failed: Int) {
        self.applyID = applyID
        self.index = index
        self.tokensDone = tokensDone
        self.ok = ok
        self.failed = failed
    }
}

/// How an apply ended, as the journal records it.
public enum ApplyStatus: String, Sendable, Codable, CaseIterable {
    case running, finished, abandoned
}

/// An apply that started and did not finish (the process was killed or failed).
public struct UnfinishedApply: Sendable {
    /// The apply's id.
    public var id: String
    /// When it started.
    public var startedAt: Date
    /// The plan it was carrying out.
    public var plan: Plan
    /// Indices of the plan's operations that finished.
    public var done: Set<Int>
    /// Operations that did not finish but got part of the way, by index.
    public var progress: [Int: OperationProgress]

    /// An unfinished apply as the journal holds it; progress of finished operations is dropped.
    public init(
        id: String, startedAt: Date, plan: Plan, done: Set<Int>, progress: [Int: OperationProgress] = [:]
    ) {
        self.id = id
        self.startedAt = startedAt
        self.plan = plan
        self.done = done
        self.progress = progress.filter { !done.contains($0.key) }
    }

    /// Tokens already sent, by the index of an operation that got part of the way.
    public var tokensDone: [Int: Int] { progress.mapValues(\.tokensDone) }
}

/// One line of the apply history.
public struct ApplyRecord: Sendable, Equatable, Codable {
    /// The apply's id.
    public var id: String
    /// Running, finished or abandoned.
    public var status: ApplyStatus
    /// When it started (seconds since 1970).
    public var startedAt: Int64
    /// Operations in its plan.
    public var operations: Int
    /// Operations it finished.
    public var done: Int

    /// A line of the apply history.
    public init(id: String, status: ApplyStatus, startedAt: Int64, operations: Int, done: Int) {
        self.id = id
        self.status = status
        self.startedAt = startedAt
        self.operations = operations
        self.done = done
    }
}

/// Why a state store cannot be used; every case says what to do.
public struct StateStoreError: TidemarkError {
    /// What kind of problem it is; the message depends on it.
    public enum Code: Sendable {
        /// The file is not an SQLite database.
        case notSQLite
        /// An SQLite database, but not tidemark's.
        case foreign
        /// tidemark's, but damaged.
        case damaged
        /// Written by a newer tidemark.
        case newerFormat
        /// Another run holds the lock.
        case locked
        /// A run's lease expired or was taken while it worked; it stopped.
        case leaseLost
        /// The store could not be read or written (a disk, a server, a connection).
        case io
        /// The store cannot do what was asked (break a lease it does not have).
        case unsupported
    }

    /// What kind of problem it is.
    public var code: Code
    /// The store's location as shown to the user.
    public var path: String
    /// What exactly was found.
    public var detail: String
    /// Who holds the lock, for `.locked`.
    public var holder: LockHolder?

    /// `state_locked`, `lease_lost`, `state_unreachable`…: the kind of problem, by a stable name.
    public var reason: FailureReason {
        switch code {
        case .notSQLite: "state_not_sqlite"
        case .foreign: "state_foreign"
        case .damaged: "state_damaged"
        case .newerFormat: "state_newer_format"
        case .locked: .stateLocked
        case .leaseLost: .leaseLost
        case .io: .stateUnreachable
        case .unsupported: "state_unsupported"
        }
    }

    /// A problem of `code` with the store at `path`.
    public init(_ code: Code, path: String, _ detail: String, holder: LockHolder? = nil) {
        self.code = code
        self.path = path
        self.detail = detail
        self.holder = holder
    }

    /// The message: what is wrong and what to do.
    public var description: String {
        switch code {
        case .notSQLite:
            "\(path) is not a tidemark state file (it is not an SQLite database). It was left untouched; move it away or point 'state' in tidemark.yaml elsewhere."
        case .foreign:
            "\(path) is an SQLite database but not a tidemark state file (\(detail)). It was left untouched; move it away or point 'state' in tidemark.yaml elsewhere."
        case .damaged:
            "\(path) is damaged (\(detail)). It was left untouched; restore it from a backup, or move it away and run 'tidemark import' to adopt the current memberships."
        case .newerFormat:
            "\(path) was written by a newer tidemark (\(detail)); upgrade tidemark to use it."
        case .locked:
            "the state \(path) is locked by \(detail). Wait for that run to finish; the lock is released when its process ends."
        case .leaseLost:
            "the state \(path): \(detail)."
        case .io:
            "cannot use the state \(path): \(detail)"
        case .unsupported:
            "the state \(path) \(detail)."
        }
    }
}

/// A state store's failure is not one that retrying an FCM call fixes: the command stops and says so.
extension StateStoreError: RetryableError {
    /// A store error is final for the call that met it.
    public var isRetryable: Bool { false }
}
