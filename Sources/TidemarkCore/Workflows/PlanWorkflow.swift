import Foundation
import Synchronization

/// What a plan covers and how far it may reach.
public struct PlanRequest: Sendable {
    /// What to read from FCM first (`.none`: plan from state alone).
    public var refresh: RefreshPolicy
    /// Which topics and groups the plan covers (`--target`, `--exclude`).
    public var targets: Targets
    /// `--max-unsubscribes`: a plan removing more is refused.
    public var maxUnsubscribes: UnsubscribeLimit?
    /// `--drift-only`: re-assert what the last apply established (state's managed memberships and
    /// groups) instead of the manifests, leaving manifest edits and inventory churn for a normal apply.
    public var driftOnly = false
    /// Reading through `reads` on a project configured for `against` (`--transport` overriding
    /// tidemark.yaml): the plan carries a shadow verify of what `reads` sees against state.
    public var shadowVerify: (reads: TopicTransport, against: TopicTransport)? = nil
    /// `--allow-shrink`: an inventory source may read far fewer devices than the last apply recorded.
    public var allowShrink = false
    /// `--skip-held` (and `serve`): a rail that refuses one topic or group holds it, and the plan is
    /// the rest (`Plan.held` names what waits). Otherwise a rail refuses the whole plan, and the plan
    /// still says what it would hold and what would go on beside it.
    public var skipHeld = false
    /// The rail of every topic whose manifests set no `max_unsubscribes` (`serve`'s default when
    /// tidemark.yaml sets no rail); nil: none.
    public var topicRail: UnattendedRail? = nil

    /// `refresh: true` reads every registration; `false` plans from state alone.
    public init(refresh: Bool = true, targets: Targets = .all, maxUnsubscribes: UnsubscribeLimit? = nil) {
        self.init(policy: refresh ? .all : .none, targets: targets, maxUnsubscribes: maxUnsubscribes)
    }

    /// A request that reads under `policy`.
    public init(
        policy: RefreshPolicy, targets: Targets = .all, maxUnsubscribes: UnsubscribeLimit? = nil,
        driftOnly: Bool = false
    ) {
        self.refresh = policy
        self.targets = targets
        self.maxUnsubscribes = maxUnsubscribes
        self.driftOnly = driftOnly
    }
}

/// A plan and what it was made from, kept together so apply can carry it out.
public struct PlanOutcome: Sendable {
    /// State, with the plan's observations not yet recorded (the manifests' tokens are interned).
    public var state: State
    /// The manifests and inventory the plan was made from.
    public var loaded: LoadedManifests
    /// The plan.
    public var plan: Plan
    /// The registrations the refresh read (token ids of `state.tokens`): an apply records when.
    public var read = TokenSet()

    /// How `tidemark plan` ends: an error when the plan has errors, else 2 for changes when asked.
    public func exitStatus(detailedExitcode: Bool) -> ExitStatus {
        if plan.diagnostics.hasErrors { return .failure }
        return detailedExitcode && plan.hasChanges ? .changes : .success
    }
}

/// `tidemark plan`: load state and manifests, refresh unless told not to, and diff. Writes nothing.
public struct PlanWorkflow: Sendable {
    /// The parts the plan reads.
    public var parts: WorkflowParts

    /// A plan over `parts`.
    public init(_ parts: WorkflowParts) { self.parts = parts }

    /// Loads, refreshes as `request` says, and plans; writes nothing.
    public func run(_ request: PlanRequest) async throws -> PlanOutcome {
        // What the plan read from FCM, for its footer: the requests sent while it was made.
        let before = parts.backend.requestCount()
        var outcome = try await reading(request)
        if let before, let after = parts.backend.requestCount() { outcome.plan.reads = after - before }
        return outcome
    }

    private func reading(_ request: PlanRequest) async throws -> PlanOutcome {
        let parts = self.parts
        let policy = request.refresh
        guard policy.mode == .sample else { return try await run(request, whenStateLoads: nil, early: { nil }) }
        // A sample's slice of the sweep (and what is older than refresh_max_age) depends on state alone:
        // its read starts in a child task as soon as state is loaded, while the manifests and inventory
        // are still read. The plan awaits it in its refresh, and cancels it when it stops before that.
        let (stored, storedLoaded) = AsyncStream<State>.makeStream()
        return try await withThrowingTaskGroup(of: SliceRead?.self) { group in
            group.addTask {
                for await state in stored { return try await parts.readSlice(policy, of: state) }
                return nil
            }
            defer { group.cancelAll() }
            return try await run(
                request,
                whenStateLoads: { state in
                    storedLoaded.yield(state)
                    storedLoaded.finish()
                },
                early: {
                    storedLoaded.finish()  // no stored state: nothing was read early
                    return try await group.next() ?? nil
                })
        }
    }

    private func run(
        _ request: PlanRequest, whenStateLoads: (@Sendable (State) -> Void)?,
        early: () async throws -> SliceRead?
    ) async throws -> PlanOutcome {
        let (state, declared) = try await parts.loadStateAndManifests(whenStateLoads: whenStateLoads)
        try parts.stopOnErrors(declared)
        try Self.checkSelectors(request.targets, state: state, loaded: declared)
        if !request.allowShrink, !request.driftOnly, let shrinkGuard = parts.shrinkGuard {
            let shrinks = shrinkGuard.check(declared.snapshots, against: state.inventoryRows)
            if !shrinks.isEmpty { throw WorkflowError.inventoryShrank(shrinks) }
        }
        var loaded = declared
        if request.driftOnly {
            // Drift can only be drift from something tidemark established.
            if state.lineage.isEmpty { throw WorkflowError.noState(location: parts.store.location) }
            loaded.desired = state.established(declared: loaded.desired)
        }
        let run = try await parts.refresh(
            request.refresh, state: state, loaded: loaded, targets: request.targets, early: early)
        let observed = run.observed
        let planner = parts.planner()
        let now = parts.timing.wallClock()
        PhaseTrace.mark("refreshed")
        var plan = await parts.phase(.planning) {
            let (plan, targets) = Self.holding(request) { targets in
                planner.plan(
                    loaded: loaded, state: state, refresh: observed,
                    backend: parts.backend.identity, now: now, targets: targets,
                    maxUnsubscribes: request.maxUnsubscribes, topicRail: request.topicRail)
            }
            var planned = plan
            if request.driftOnly {
                let full = planner.plan(
                    loaded: declared, state: state, refresh: observed, backend: parts.backend.identity, now: now,
                    targets: targets)
                planned.driftOnly = DriftOnlyNote(waiting: plan.waiting(comparedWith: full))
            }
            return planned
        }
        PhaseTrace.mark("planned")
        plan.requests = parts.backend.requests(for: plan.operations)
        plan.operationsDigestWhenMade = plan.operationsDigest
        plan.coverage = run.coverage
        if let shadow = request.shadowVerify, observed != nil {
            plan.shadowVerify = ShadowVerify(
                reads: shadow.reads, against: shadow.against, observations: plan.observations,
                coverage: run.coverage)
        }
        if !run.sampled.isEmpty {
            var differed = Set(plan.observations.dead + plan.observations.revived)
            for delta in plan.observations.topics {
                differed.formUnion(delta.subscribed)
                differed.formUnion(delta.unsubscribed)
            }
            plan.sweptMatching = run.sampled.map { state.tokens[$0] }.filter { !differed.contains($0) }
        }
        if let unfinished = try await parts.store.unfinishedApply(), let move = unfinished.plan.move {
            plan.diagnostics.append(.warning(WorkflowError.interruptedMove(move).description))
        } else if let unfinished = try await parts.store.unfinishedApply() {
            let started = ISO8601DateFormatter().string(from: unfinished.startedAt)
            plan.diagnostics.append(
                .warning(
                    "an apply started at \(started) was interrupted with \(unfinished.done.count) of \(unfinished.plan.operations.count) operations done; the next 'tidemark apply' first finishes it (or abandons it if the manifests or backend changed), so this plan may change."
                ))
        }
        return PlanOutcome(state: state, loaded: loaded, plan: plan, read: observed?.refreshed ?? TokenSet())
    }
}

extension PlanWorkflow {
    /// The plan `make` makes of `request`'s targets; when rails refuse it only for some topics and
    /// groups, those are held: with `skipHeld` the plan is the one beside them (`Plan.held` names
    /// them), else the refused plan says what would be held and what would go on (`Plan.beside`).
    /// Returns the targets the plan was made of. Topics are diffed on their own, so the plan beside
    /// held ones raises no rail of a topic the first did not (the global `max_unsubscribes` is counted
    /// again on what remains).
    static func holding(_ request: PlanRequest, _ make: (Targets) -> Plan) -> (Plan, Targets) {
        let first = make(request.targets)
        guard first.diagnostics.hasErrors, let held = HeldChange.holds(in: first.diagnostics), !held.isEmpty else {
            return (first, request.targets)
        }
        var targets = request.targets
        targets.withheld.formUnion(held.map(\.subject))
        var beside = make(targets)
        beside.held = held
        if request.skipHeld { return (beside, targets) }
        var refused = first
        refused.held = held
        refused.beside = BesideHeld(beside)
        return (refused, request.targets)
    }

    /// Every selector must match something declared or remembered.
    static func checkSelectors(_ targets: Targets, state: State, loaded: LoadedManifests) throws {
        guard targets.isPartial else { return }
        let topics = Set(loaded.desired.topics.map(\.name)).union(state.topics.keys)
        let groups = Set(loaded.desired.groups.map(\.name)).union(state.groups.keys)
        let misses = targets.unmatched(topics: topics.sorted(), groups: groups.sorted())
        if !misses.isEmpty {
            throw WorkflowError.selectorsMatchNothing(misses.map { ($0.0.description, $0.1) })
        }
    }
}

extension WorkflowParts {
    /// Loads state and reads the manifests at the same time (they are independent until resolution),
    /// then resolves the manifests' tokens into the state's table.
    /// A state made for another FCM project or backend is refused.
    public func loadStateAndManifests(
        whenStateLoads: (@Sendable (State) -> Void)? = nil
    ) async throws -> (State, LoadedManifests) {
        var (state, loaded, _) = try await phase(.reading) {
            try await Self.loadStateAndRead(manifests: manifests, store: store, whenStateLoads: whenStateLoads)
        }
        // Said once per run, with the manifests' own diagnostics: past a deadline, an error stops the
        // run before anything is sent to FCM.
        let declared = Set(loaded.desired.groups.map(\.name))
        let audiences = Set(loaded.desired.audiences.map(\.name))
        // An audience's FCM group (converted, not yet retired) is still a device group FCM serves.
        let remembered = Set(state.groups.filter { $0.value.key != nil }.keys).subtracting(declared)
        loaded.diagnostics += deadlines.diagnostics(groups: declared.count, rememberedGroups: remembered.count)
        if deadlines.groupsTurnedDown {
            // Groups FCM no longer serves are not planned: deleting them would call an API that is gone.
            // Audiences stay: they live in state, and their FCM groups are only forgotten.
            state.keepGroups { name, group in
                declared.contains(name) || audiences.contains(name) || group.audience
            }
        }
        if let recorded = state.backend, recorded != backend.identity {
            throw WorkflowError.stateOfAnotherBackend(location: store.location, state: recorded, now: backend.identity)
        }
        return (state, loaded)
    }

    static func loadStateAndManifests(
        manifests: any ManifestSource, store: any StateStore
    ) async throws
        -> (State, LoadedManifests)
    {
        let (state, loaded, _) = try await loadStateAndRead(manifests: manifests, store: store)
        return (state, loaded)
    }

    /// `loadStateAndManifests`, also returning the manifests as read (before resolution).
    /// `whenStateLoads` is given the stored state (when there is one) as soon as it is loaded.
    static func loadStateAndRead(
        manifests: any ManifestSource, store: any StateStore, whenStateLoads: (@Sendable (State) -> Void)? = nil
    ) async throws -> (State, LoadedManifests, ReadManifests) {
        // The stored state, or an empty one (lineage "", serial 0) when none exists yet.
        PhaseTrace.mark("loading state and reading manifests")
        async let loading = { () async throws -> State? in
            let state = try await store.load()
            PhaseTrace.mark("state loaded")
            if let state { whenStateLoads?(state) }
            return state
        }()
        let read = await manifests.read()
        PhaseTrace.mark("manifests read")
        var state = try await loading ?? State(lineage: "", serial: 0)
        let loaded = state.interning { read.resolve(into: &$0) }
        PhaseTrace.mark("manifests resolved")
        return (state, loaded, read)
    }

    /// Reports the manifests' errors and stops when there are any.
    func stopOnErrors(_ loaded: LoadedManifests) throws { try Self.stopOnErrors(loaded, output: output) }

    static func stopOnErrors(_ loaded: LoadedManifests, output: any WorkflowOutput) throws {
        let errors = loaded.diagnostics.filter { $0.severity == .error }
        guard !errors.isEmpty else { return }
        output.emit(.diagnostics(errors))
        if let failure = loaded.inventoryFailure {
            throw WorkflowError.inventoryFailed(reason: failure, errorCount: errors.count)
        }
        throw WorkflowError.invalidManifests(errorCount: errors.count)
    }

    /// Reads what `policy` asks for: nothing, every registration, or the registrations a plan from state
    /// would change (`touched`), those read longer ago than the policy's age, and the sweep's slice.
    func refresh(
        _ policy: RefreshPolicy, state: State, loaded: LoadedManifests, targets: Targets = .all,
        early: () async throws -> SliceRead? = { nil }
    ) async throws -> RefreshRun {
        let now = timing.unixTime()
        var touched = TokenSet()
        if policy.mode == .touched || policy.mode == .sample {
            // Every token a plan from state alone would change: their full registration decides the
            // 2000-topic cap and what tidemark owns. The diff is per token, so what the read changes
            // stays within the tokens read.
            let working = state
            // Audience steps change state only: their members need no read.
            let ids = differ().diff(desired: loaded.desired, state: working, targets: targets).operations
                .filter { !$0.kind.isStateOnly }
                .flatMap { op in op.tokens.compactMap { working.tokens.id($0) } }
            touched = TokenSet(ids)
        }
        PhaseTrace.mark("refresh: \(touched.count) registrations touched")
        if policy.mode == .sample, let slice = try await early() {
            return try await refresh(policy, state: state, loaded: loaded, touched: touched, early: slice)
        }
        let (ids, coverage, sampled) = state.refreshSelection(
            policy, touched: touched, now: now, salt: Self.sweepSalt(state.lineage))
        guard policy.reads else { return RefreshRun(observed: nil, coverage: coverage, sampled: TokenSet()) }
        PhaseTrace.mark("refresh: reading \(ids.count) registrations")
        let observed = try await refresh(ids, groups: groupsToLookUp(state, loaded), state: state, loaded: loaded)
        var read = coverage
        read.read = observed.refreshed.count
        return RefreshRun(observed: observed, coverage: read, sampled: sampled)
    }

    /// The slice of the sweep (and what is older than `refresh_max_age`) that `policy` reads in `stored`,
    /// read before the plan knows what it touches: what `refreshSelection` picks with nothing touched.
    func readSlice(_ policy: RefreshPolicy, of stored: State) async throws -> SliceRead {
        let now = timing.unixTime()
        let (ids, _, sampled) = stored.refreshSelection(
            policy, touched: TokenSet(), now: now, salt: Self.sweepSalt(stored.lineage))
        PhaseTrace.mark("refresh: reading the sweep's slice of \(ids.count) registrations")
        let read = try await self.read(ids.ids.map { stored.tokens[$0] })
        return SliceRead(
            ids: ids, sampled: sampled, stale: ids.subtracting(sampled), statuses: read.statuses, at: read.at)
    }

    /// A sample whose slice was read while state and manifests loaded (`early`): the touched registrations
    /// it did not already read are read now, and the coverage is what both reads chose.
    private func refresh(
        _ policy: RefreshPolicy, state: State, loaded: LoadedManifests, touched: TokenSet, early: SliceRead
    ) async throws -> RefreshRun {
        let rest = touched.subtracting(early.ids)
        PhaseTrace.mark("refresh: reading \(rest.count) more registrations")
        let read = try await self.read(rest.ids.map { state.tokens[$0] })
        let chosen = early.ids.union(rest)
        let fleet = state.fleet()
        var coverage = state.coverage(policy, fleet: fleet, read: chosen, now: early.at)
        coverage.touched = touched.count
        coverage.stale = early.stale.subtracting(touched).count
        let sampled = early.sampled.subtracting(touched)
        coverage.sampled = sampled.count
        coverage.budget = policy.budget.reads(fleet: fleet.count)
        let observed = try await result(
            early.ids.ids + rest.ids, (early.statuses + read.statuses, early.at),
            groups: groupsToLookUp(state, loaded), state: state, loaded: loaded)
        coverage.read = observed.refreshed.count
        return RefreshRun(observed: observed, coverage: coverage, sampled: sampled)
    }

    /// A state's own order for the sweep: each slice is spread over the fleet, not in inventory order.
    static func sweepSalt(_ lineage: String) -> UInt64 { StringIndex.hash(lineage, seed: 0x7377_6565_70) }

    /// Every group a refresh looks up: declared or remembered, and the FCM groups audiences were
    /// converted from while they live (an audience without one is never looked up: a group of the
    /// same name made outside tidemark is not its). None after FCM turned device groups down.
    func groupsToLookUp(_ state: State, _ loaded: LoadedManifests) -> [String] {
        guard !deadlines.groupsTurnedDown else { return [] }
        return Set(loaded.desired.groups.map(\.name)).union(
            state.groups.filter { !$0.value.audience || $0.value.key != nil }.keys
        ).sorted()
    }

    /// Reads every known token and every declared or remembered group from the backend.
    func refreshAll(state: State, loaded: LoadedManifests) async throws -> RefreshResult {
        let all = TokenSet(sorted: Array(0..<UInt32(state.tokens.count)))
        return try await refresh(all, groups: groupsToLookUp(state, loaded), state: state, loaded: loaded)
    }

    /// Reads `ids` (token ids of the state's table) and the keys of `groups` from the backend.
    func refresh(
        _ all: TokenSet, groups: [String], state: State, loaded: LoadedManifests
    ) async throws
        -> RefreshResult
    {
        let read = try await read(all.ids.map { state.tokens[$0] })
        return try await result(all.ids, read, groups: groups, state: state, loaded: loaded)
    }

    /// Reads `tokens` without state (a saved plan's registrations, while state loads), reporting
    /// progress on a large read; `at` is when the read began.
    func read(_ tokens: [String]) async throws -> (statuses: [RegistrationStatus], at: Int64) {
        let large = tokens.count >= progressThreshold
        let output = self.output
        let report: @Sendable (Int, Int) -> Void = { done, total in
            output.emit(.refreshProgress(done: done, total: total))
        }
        let at = timing.unixTime()
        let started = timing.now()
        let statuses = try await phase(.refreshing) {
            report(0, tokens.count)
            return try await Refresher(backend: backend).read(tokens, progress: report)
        }
        PhaseTrace.mark("read \(tokens.count) registrations")
        if large {
            output.emit(.refreshed(registrations: tokens.count, seconds: Timing.seconds(timing.now() - started)))
        }
        return (statuses, at)
    }

    /// A `read` of `tokens` as a refresh of their ids in `state` (interned), with `groups` looked up.
    func refreshResult(
        _ tokens: [String], _ read: (statuses: [RegistrationStatus], at: Int64), groups: [String],
        state: inout State, loaded: LoadedManifests
    ) async throws -> RefreshResult {
        let ids = tokens.map { state.intern($0) }
        return try await result(ids, read, groups: groups, state: state, loaded: loaded)
    }

    /// What a read found for `ids`, with `groups` looked up, held to the dead-token guard.
    private func result(
        _ ids: [UInt32], _ read: (statuses: [RegistrationStatus], at: Int64), groups: [String], state: State,
        loaded: LoadedManifests
    ) async throws -> RefreshResult {
        let observed = try await Refresher(backend: backend).result(ids, read.statuses, groups: groups, at: read.at)
        try guardDead(observed, state: state, loaded: loaded)
        return observed
    }

    /// Refuses a read in which too many of the inventory's devices came back dead (`deadTokenGuard`).
    func guardDead(_ observed: RefreshResult, state: State, loaded: LoadedManifests) throws {
        // Nothing came back dead: nothing to hold (and no need to look up the whole inventory).
        let dead = observed.dead.subtracting(state.dead)
        if let deadTokenGuard, !dead.isEmpty {
            // Only the registrations read are looked up in the inventory, not the inventory in state.
            let inventory = loaded.inventory
            func listed(_ id: UInt32) -> Bool { inventory.index(ofToken: state.tokens[id]) != nil }
            let read = observed.refreshed.ids.filter(listed).count
            let newlyDead = dead.ids.filter(listed).count
            if let violation = deadTokenGuard.violation(newlyDead: newlyDead, read: read, location: backend.location) {
                throw WorkflowError.tooManyDead(violation)
            }
        }
    }
}

/// What a refresh read and how far that reached.
public struct RefreshRun: Sendable {
    /// nil when nothing was read (`--refresh=none`).
    public var observed: RefreshResult?
    /// How far the refresh looked.
    public var coverage: RefreshCoverage
    /// The registrations read as the sweep's slice (not touched, not stale): a sample of the fleet
    /// that the rest can be estimated from.
    public var sampled: TokenSet
}

/// The sweep's slice as read early (`WorkflowParts.readSlice`): ids of the stored state's table.
public struct SliceRead: Sendable {
    /// Everything read: the slice and what was older than `refresh_max_age`.
    var ids: TokenSet
    var sampled: TokenSet
    /// Read because older than `refresh_max_age`.
    var stale: TokenSet
    var statuses: [RegistrationStatus]
    var at: Int64
}
