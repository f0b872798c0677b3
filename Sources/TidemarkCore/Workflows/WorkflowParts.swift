import Foundation

/// Reads the manifests and the inventory they name; the CLI passes the disk, tests memory.
public protocol ManifestSource: Sendable {
    func read() async -> ReadManifests
}

/// A stretch of work that can last more than a second, which a front end shows progress for.
public enum WorkPhase: String, Sendable, CaseIterable {
    /// Reading the manifests and the inventory they name, and loading state.
    case reading = "Reading manifests, inventory and state"
    /// Reading registrations from FCM (a refresh).
    case refreshing = "Reading registrations from FCM"
    /// Diffing what is declared against state and what was read.
    case planning = "Planning"
    /// Sending the plan's changes to FCM.
    case applying = "Applying"
    /// Writing state (or the apply's last journal entries).
    case saving = "Saving state"

    /// How the phase is named on screen.
    public var label: String { rawValue }
}

/// What a workflow tells the person running it while it works; the CLI renders, tests record.
public enum WorkflowEvent: Sendable {
    /// A phase that may take a while began; progress events that follow belong to it.
    case phaseStarted(WorkPhase)
    /// The phase ended (finished, failed or cancelled).
    case phaseEnded(WorkPhase)
    /// Diagnostics worth showing before the workflow stops or goes on.
    case diagnostics([Diagnostic])
    /// A refresh read `done` of `total` registrations.
    case refreshProgress(done: Int, total: Int)
    /// A large refresh finished.
    case refreshed(registrations: Int, seconds: Double)
    /// An apply finished operations worth `tokensDone` of `tokensTotal` tokens.
    case applyProgress(ExecutionProgress)
    /// An interrupted apply is being finished.
    case resuming(startedAt: Date, done: Int, total: Int)
    /// The interrupted apply is finished, before anything else is planned: what it did.
    case resumed(ApplySummary)
    /// A recent saved plan was checked against state and the manifests: of the `registrations` it
    /// changes, only `readAgain` had operations they do not call for by themselves and were read again.
    /// `planAge` is seconds since its refresh.
    case savedPlanChecked(registrations: Int, readAgain: Int, planAge: Int64?)
    /// An interrupted apply was given up, because the manifests or backend changed since.
    case abandoned(startedAt: Date)
    /// Calls to FCM (or another service) have been failing for a few seconds and are being retried
    /// (said once, then at most every ~10 s while it lasts).
    case retrying(RetryNotice)
    /// After retries that were said, calls are answered again, `afterSeconds` after they began failing.
    case answeringAgain(afterSeconds: Double)
}

/// Receives workflow events.
public protocol WorkflowOutput: Sendable {
    func emit(_ event: WorkflowEvent)
}

/// An output that drops everything.
public struct SilentOutput: WorkflowOutput {
    /// An output that drops everything.
    public init() {}
    /// Drops `event`.
    public func emit(_ event: WorkflowEvent) {}
}

/// The parts every workflow runs on: where the desired state comes from, where state lives, which
/// FCM it talks to, and the clock. The CLI builds them from flags and settings; tests from twins.
public struct WorkflowParts: Sendable {
    /// Where the manifests (and through them the inventory) are read.
    public var manifests: any ManifestSource
    /// Where state lives.
    public var store: any StateStore
    /// The FCM the run reads and changes.
    public var backend: any Backend
    /// Clock, sleep and random draws.
    public var timing: Timing
    /// Where the run's events go (terminal, JSON lines, a test's recorder).
    public var output: any WorkflowOutput
    /// The version recorded in plans.
    public var tidemarkVersion: String
    /// Requests in flight at once, for refreshes and applies.
    public var parallelism: Int
    /// Refreshes of at least this many registrations report progress and their rate.
    public var progressThreshold: Int
    /// Refuses a refresh in which too many devices come back dead; nil accepts any (`--accept-dead`).
    public var deadTokenGuard: DeadTokenGuard?
    /// FCM's deadlines for device groups and the Instance ID API, said once per run (off in tests
    /// of other things).
    public var deadlines: DeadlineCheck = .off
    /// Asked before every request an apply sends to FCM: a run that lost its state lock stops.
    public var leaseGate: LeaseGate? = nil
    /// Refuses an inventory that shrank past `max_shrink` since the last apply; nil never refuses.
    public var shrinkGuard: ShrinkGuard? = ShrinkGuard()

    /// The parts of a run; the rest keep their defaults until set.
    public init(
        manifests: any ManifestSource, store: any StateStore, backend: any Backend, timing: Timing = .live,
        output: any WorkflowOutput = SilentOutput(), tidemarkVersion: String, parallelism: Int = 8,
        progressThreshold: Int = 20_000, deadTokenGuard: DeadTokenGuard? = DeadTokenGuard()
    ) {
        self.manifests = manifests
        self.store = store
        self.backend = backend
        self.timing = timing
        self.output = output
        self.tidemarkVersion = tidemarkVersion
        self.parallelism = max(1, parallelism)
        self.progressThreshold = progressThreshold
        self.deadTokenGuard = deadTokenGuard
    }
}

/// How a command ends, as CI reads it.
public enum ExitStatus: Int32, Sendable {
    /// Success, or no changes.
    case success = 0
    /// An error: nothing (or not everything) was done.
    case failure = 1
    /// There are changes (or drift); only with `--detailed-exitcode`.
    case changes = 2
}

extension WorkflowParts {
    /// Runs `body` as `phase`, said to the output when it starts and when it ends.
    func phase<T>(_ phase: WorkPhase, _ body: () async throws -> T) async rethrows -> T {
        output.emit(.phaseStarted(phase))
        defer { output.emit(.phaseEnded(phase)) }
        return try await body()
    }

    /// Runs `body`, a question to a person, without the lease taking the wait for stuck work.
    func waitingForPerson<T: Sendable>(_ body: () async -> T) async -> T {
        guard let leaseGate else { return await body() }
        return await leaseGate.waitingForPerson(body)
    }

    /// A differ that knows whether FCM turned device groups down at the run's date.
    public func differ() -> Differ { Differ(groupsTurnedDown: deadlines.groupsTurnedDown) }

    /// A planner with that differ.
    public func planner() -> Planner { Planner(differ: differ(), tidemarkVersion: tidemarkVersion) }

    /// An apply's unregistered answers, held to this run's dead-token guard over `inventory`'s tokens.
    func deadAnswers(_ inventory: Inventory) -> ApplySession.DeadAnswers {
        ApplySession.DeadAnswers(deadTokenGuard: deadTokenGuard, inventory: inventory, location: backend.location)
    }

    /// Before a state's first save: gives it a lineage, and records the FCM project and backend it
    /// belongs to (a run against another is refused from then on).
    func claim(_ state: inout State) {
        state.claim(backend: backend.identity, lineage: timing.uuid())
    }
}
