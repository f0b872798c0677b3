import Foundation

/// Why a workflow stopped without doing its work: a public struct around a private code, as every
/// error tidemark throws on purpose. Its message is a sentence that says what to do; its `reason` is a
/// stable name for the kind of failure (`stale_plan`), for `serve`'s status and events.
public struct WorkflowError: TidemarkError {
    private enum Code: Sendable {
        case invalidManifests(errorCount: Int)
        case inventoryFailed(reason: String, errorCount: Int)
        case planHasErrors
        case confirmationUnavailable
        case stalePlan(StalePlan)
        case unfinishedApply
        case tooManyDead(String)
        case selectorsMatchNothing([(selector: String, closest: [String])])
        case noState(location: String)
        case stateOfAnotherBackend(location: String, state: BackendIdentity, now: BackendIdentity)
        case unknownDevice(String)
        case ambiguousDevice(String, matches: [String])
        case nothingToRead(command: String)
        case nothingToExport
        case inventoryShrank([ShrinkGuard.Shrink])
        case interruptedMove(StateMoveRecord)
        case targetHolds(String, location: String, undone: Bool)
        case notInState([(address: String, hint: String)], location: String)
    }

    private let code: Code

    private init(_ code: Code) { self.code = code }

    /// The manifests have errors; they were reported through the output.
    public static func invalidManifests(errorCount: Int) -> Self { Self(.invalidManifests(errorCount: errorCount)) }
    /// A configured inventory source could not be read (its `reason`: `inventory_timeout`,
    /// `inventory_unreachable`, `inventory_empty`, `inventory_failed`); reported through the output.
    public static func inventoryFailed(reason: String, errorCount: Int) -> Self {
        Self(.inventoryFailed(reason: reason, errorCount: errorCount))
    }
    /// The plan has errors (a refused blast radius, say); nothing was changed.
    public static let planHasErrors = Self(.planHasErrors)
    /// Apply needs a yes, and nobody can give one here.
    public static let confirmationUnavailable = Self(.confirmationUnavailable)
    /// A saved plan that may not be applied.
    public static func stalePlan(_ stale: StalePlan) -> Self { Self(.stalePlan(stale)) }
    /// Import, prune or a saved plan while an apply is unfinished.
    public static let unfinishedApply = Self(.unfinishedApply)
    /// A refresh in which too many devices came back dead (`DeadTokenGuard`): the guard's message.
    public static func tooManyDead(_ message: String) -> Self { Self(.tooManyDead(message)) }
    /// `--target`/`--exclude` selectors that match no topic or group: the selector and the closest names.
    public static func selectorsMatchNothing(_ misses: [(selector: String, closest: [String])]) -> Self {
        Self(.selectorsMatchNothing(misses))
    }
    /// Drift with no state: nothing to compare FCM with.
    public static func noState(location: String) -> Self { Self(.noState(location: location)) }
    /// The state belongs to another FCM project or backend.
    public static func stateOfAnotherBackend(location: String, state: BackendIdentity, now: BackendIdentity) -> Self {
        Self(.stateOfAnotherBackend(location: location, state: state, now: now))
    }
    /// `tidemark device` for an id or token neither the inventory nor state knows.
    public static func unknownDevice(_ query: String) -> Self { Self(.unknownDevice(query)) }
    /// `tidemark device` for a prefix of several device ids (`matches`: the first few, sorted).
    public static func ambiguousDevice(_ query: String, matches: [String]) -> Self {
        Self(.ambiguousDevice(query, matches: matches))
    }
    /// A command that must read FCM was told to read nothing (`--refresh none`).
    public static func nothingToRead(command: String) -> Self { Self(.nothingToRead(command: command)) }
    /// `groups export` with no group declared, remembered or named.
    public static let nothingToExport = Self(.nothingToExport)
    /// Inventory sources that read far fewer devices than the last apply recorded (`ShrinkGuard`).
    public static func inventoryShrank(_ shrinks: [ShrinkGuard.Shrink]) -> Self { Self(.inventoryShrank(shrinks)) }
    /// A `state mv` was interrupted: the same command finishes it; until then the state refuses others.
    public static func interruptedMove(_ move: StateMoveRecord) -> Self { Self(.interruptedMove(move)) }
    /// `state mv` into a state that already holds the entry (`undone`: an interrupted move was undone).
    public static func targetHolds(_ address: String, location: String, undone: Bool = false) -> Self {
        Self(.targetHolds(address, location: location, undone: undone))
    }
    /// What a journaled, unfinished run at `location` means for a command that must not act past it:
    /// an interrupted `state mv` (finished by the same command) or an interrupted apply.
    public static func unfinished(_ pending: UnfinishedApply, at location: String) -> Self {
        if let move = pending.plan.move { return .interruptedMove(move) }
        return .unfinishedApply
    }
    /// `state rm` naming what state does not hold: each address with a hint of what it does hold.
    public static func notInState(_ misses: [(address: String, hint: String)], location: String) -> Self {
        Self(.notInState(misses, location: location))
    }

    /// Whether `value` is a workflow error of the same kind as `pattern` (payloads aside), so that
    /// `catch WorkflowError.unfinishedApply` reads as it would for an enum.
    public static func ~= (pattern: WorkflowError, value: any Error) -> Bool {
        (value as? WorkflowError)?.reason == pattern.reason
    }

    /// The stable name of the kind of failure: `invalid_input`, `stale_plan`, `inventory_shrank`….
    public var reason: FailureReason {
        switch code {
        case .invalidManifests: .invalidInput
        case .inventoryFailed(let reason, _): FailureReason(rawValue: reason)
        case .planHasErrors: .planHasErrors
        case .confirmationUnavailable: "confirmation_unavailable"
        case .stalePlan: "stale_plan"
        case .unfinishedApply: "unfinished_apply"
        case .tooManyDead: .tooManyDead
        case .selectorsMatchNothing: "selectors_match_nothing"
        case .noState: .noState
        case .stateOfAnotherBackend: "state_of_another_backend"
        case .unknownDevice: "unknown_device"
        case .ambiguousDevice: "ambiguous_device"
        case .nothingToRead: "nothing_to_read"
        case .nothingToExport: "nothing_to_export"
        case .inventoryShrank: .inventoryShrank
        case .interruptedMove: "interrupted_move"
        case .targetHolds: "target_holds"
        case .notInState: "not_in_state"
        }
    }

    /// How many errors were reported, for `invalid_input` and an inventory source that failed.
    public var errorCount: Int? {
        switch code {
        case .invalidManifests(let count), .inventoryFailed(_, let count): count
        default: nil
        }
    }

    /// Why a saved plan was refused, for `stale_plan`.
    public var stalePlan: StalePlan? {
        if case .stalePlan(let stale) = code { stale } else { nil }
    }

    /// The sources that shrank, for `inventory_shrank`.
    public var shrinks: [ShrinkGuard.Shrink] {
        if case .inventoryShrank(let shrinks) = code { shrinks } else { [] }
    }

    /// The selectors that matched nothing and the closest names, for `selectors_match_nothing`.
    public var unmatchedSelectors: [(selector: String, closest: [String])] {
        if case .selectorsMatchNothing(let misses) = code { misses } else { [] }
    }

    /// The backend the state was made with and the one this run uses, for `state_of_another_backend`.
    public var backends: (state: BackendIdentity, now: BackendIdentity)? {
        if case .stateOfAnotherBackend(_, let state, let now) = code { (state, now) } else { nil }
    }

    /// The error, as a sentence that says what to do.
    public var description: String {
        switch code {
        case .invalidManifests(let count):
            "\(count) error\(count == 1 ? "" : "s") found; nothing was planned or changed."
        case .inventoryFailed(_, let count):
            "an inventory source could not be read (\(count) error\(count == 1 ? "" : "s") above); nothing was planned or changed."
        case .planHasErrors:
            "the plan has errors (above); nothing was changed."
        case .confirmationUnavailable:
            "apply needs confirmation: run it on a terminal, pass --auto-approve, or apply a saved plan file."
        case .stalePlan(let stale):
            stale.description
        case .unfinishedApply:
            "an apply was interrupted; finish it with 'tidemark apply' first (its journal decides what state holds)."
        case .tooManyDead(let message):
            message
        case .inventoryShrank(let shrinks):
            ShrinkGuard.message(shrinks)
        case .interruptedMove(let move):
            "a 'tidemark state mv \(move.address)' from \(move.from) to \(move.to) was interrupted; run the same 'tidemark state mv' again to finish it. Until then both states refuse other commands, so that \(move.address) is never acted on in two places."
        case .targetHolds(let address, let location, let undone):
            undone
                ? "\(location) came to hold \(address) of its own while the move waited to be finished, so the move was undone: \(address) stays where it was. Release it in \(location) first ('tidemark state rm') to move it there."
                : "\(location) already holds \(address); nothing was moved. Release it there first ('tidemark state rm \(address)'), or move it to another workspace."
        case .notInState(let misses, let location):
            misses.map { "the state \(location) holds no \($0.address)\($0.hint)" }.joined(separator: "; ")
                + ". Nothing was changed; 'tidemark state list' shows what it holds."
        case .selectorsMatchNothing(let misses):
            misses.map { miss in
                "--target/--exclude '\(miss.selector)' matches no topic or group of the manifests or state"
                    + (miss.closest.isEmpty ? "" : " (closest: \(miss.closest.joined(separator: ", ")))") + "."
            }.joined(separator: "\n") + " Nothing was planned; fix the selector."
        case .noState(let location):
            "there is no state at \(location) yet, so there is nothing to compare FCM with. Run 'tidemark apply' (or 'tidemark import' to adopt what exists) first."
        case .unknownDevice(let query):
            "neither the inventory nor state knows a device or token '\(query.count > 40 ? Redaction.redact(query) : query)', nor a device id that begins with it; give a device id from the inventory (or its start) or a full registration token."
        case .ambiguousDevice(let query, let matches):
            "'\(query)' begins \(matches.count > DeviceWorkflow.listedMatches ? "more than \(DeviceWorkflow.listedMatches)" : "\(matches.count)") device ids: \(matches.prefix(DeviceWorkflow.listedMatches).joined(separator: ", "))\(matches.count > DeviceWorkflow.listedMatches ? ", …" : ""); give more of the id."
        case .nothingToExport:
            "no device group is declared in the manifests, remembered in state or named on the command line; there is nothing to export."
        case .nothingToRead(let command):
            "\(command) compares what FCM holds with state, so it must read something: use --refresh touched, sample or all, not none."
        case .stateOfAnotherBackend(let location, let state, let now):
            "the state \(location) belongs to \(state), but this run uses \(now). Point 'state' in tidemark.yaml at that backend's own state, or use the backend it was made with."
        }
    }
}

/// Why a saved plan is refused: it no longer describes what applying it would do.
public struct StalePlan: Sendable, CustomStringConvertible {
    /// Why the plan is stale.
    public enum Reason: Sendable, Equatable {
        /// Made before any state existed; state exists now.
        case madeBeforeState(lineage: String)
        /// Made for another state.
        case otherLineage(plan: String, state: String)
        /// The state moved on since (a plan without per-topic versions).
        case serialMoved(plan: Int, state: Int)
        /// The manifests changed for topics or groups the plan touches; `devices` says which inventory
        /// sources and devices moved, when that is known.
        case touchedInManifests([String], devices: String? = nil)
        /// Topics or groups the plan touches changed since (`topic:NAME`, `group:NAME`).
        case touchedChanged([String], plan: Int, state: Int)
        /// The manifests or inventory changed since.
        case manifestsChanged(plan: String, now: String)
        /// Made for another backend or project.
        case otherBackend(plan: BackendIdentity, now: BackendIdentity)
        /// An interrupted apply was finished first.
        case interruptedApplyFinished
        /// Flags try to change the plan's selection.
        case selectionChanged(planned: String, given: String)
        /// The plan unsubscribes more than allowed.
        case tooManyUnsubscribes(String)
        /// Its operations are not what the planner produces now (an edited file, a rail it breaks).
        case notWhatThePlannerWouldDo(String)
    }

    /// The plan file as the user named it.
    public var file: String
    /// Where state lives, as shown.
    public var stateLocation: String
    /// Why the plan is stale.
    public var reason: Reason

    /// A refusal of `file` against the state at `stateLocation`.
    public init(file: String, stateLocation: String, reason: Reason) {
        self.file = file
        self.stateLocation = stateLocation
        self.reason = reason
    }

    /// The refusal, naming the file, the reason and what to do.
    public var description: String {
        switch reason {
        case .madeBeforeState(let lineage):
            "\(file) is stale: it was made before any state existed, but \(stateLocation) now exists (lineage \(lineage.prefix(8))). Make a new plan."
        case .otherLineage(let plan, let state):
            "\(file) was made for another state (lineage \(plan.prefix(8)), this state is \(state.isEmpty ? "missing" : String(state.prefix(8)))). Make a new plan against this state."
        case .serialMoved(let plan, let state):
            "\(file) is stale: the state moved from serial \(plan) (when planned) to \(state). Make a new plan."
        case .touchedInManifests(let names, let devices):
            "\(file) is stale: the manifests or inventory changed what \(names.prefix(5).joined(separator: ", "))\(names.count > 5 ? " and \(names.count - 5) more" : "") mean\(names.count == 1 ? "s" : "") since it was made\(devices.map { " (\($0))" } ?? ""). Make a new plan."
        case .touchedChanged(let names, let plan, let state):
            "\(file) is stale: \(names.prefix(5).joined(separator: ", "))\(names.count > 5 ? " and \(names.count - 5) more" : "") changed since it was made (state serial \(plan) then, \(state) now). Make a new plan."
        case .manifestsChanged(let plan, let now):
            "\(file) is stale: the manifests or inventory changed since it was made (sha256 \(plan.prefix(12)) then, \(now.prefix(12)) now). Make a new plan."
        case .otherBackend(let plan, let now):
            "\(file) was made for backend \(plan), but this run uses \(now). Use the same backend and project, or make a new plan."
        case .interruptedApplyFinished:
            "\(file) is stale: an interrupted apply was finished first, so the state moved on. Make a new plan."
        case .selectionChanged(let planned, let given):
            "\(file) was planned for \(planned); --target/--exclude (\(given)) cannot change what a saved plan covers. Make a new plan with those selectors."
        case .tooManyUnsubscribes(let violation):
            "\(file) is refused: \(violation)"
        case .notWhatThePlannerWouldDo(let detail):
            "\(file) is refused: \(detail). Nothing was changed; make a new plan and review it."
        }
    }
}
