import Foundation
import ServiceLifecycle

/// Whether the person running apply said yes to the plan.
public enum Approval: Sendable {
    case approved
    case declined
    /// Nobody can be asked (not a terminal, no --auto-approve).
    case unavailable
}

/// What apply is asked to do.
public struct ApplyRequest: Sendable {
    /// A saved plan to carry out exactly, and the name to call it by; nil plans afresh.
    public var savedPlan: (plan: Plan, file: String)?
    /// For a fresh plan: refresh, selection and blast radius. For a saved plan, a selection given
    /// again must equal the plan's, and `maxUnsubscribes` still applies.
    public var planning: PlanRequest
    /// Asked before a fresh plan with changes runs; the plan was shown through `planReady`.
    public var approve: @Sendable (Plan) async -> Approval
    /// Called with a fresh plan before approval, to show it.
    public var planReady: @Sendable (PlanOutcome) async throws -> Void
    /// Asked before an interrupted apply is finished: the operations it still has to run.
    public var approveResume: @Sendable (UnfinishedApply) async -> Approval
    /// `--refresh-only`: read what the refresh policy asks for and record it in state (observed
    /// memberships, dead tokens, when each registration was read), changing nothing in FCM.
    public var refreshOnly = false
    /// `prune_after`: after an apply that changed something, forget dead and departed tokens unseen for
    /// this many seconds, when at least `PruneWorkflow.automaticMinimum` of them can go.
    public var pruneAfter: Int64? = nil
    /// `saved_plan_reread_after`: a saved plan made at most this many seconds ago reads again only the
    /// registrations whose operations state and the manifests do not call for by themselves (drift its
    /// refresh found); the rest run as a plan from state would run them. nil: every registration the
    /// plan changes is read again, whatever its age.
    public var rereadAfter: Int64? = nil

    /// An apply of `savedPlan`, or of a fresh plan made under `planning`, asking `approve` before it changes anything.
    public init(
        savedPlan: (plan: Plan, file: String)? = nil, planning: PlanRequest = PlanRequest(),
        approve: @escaping @Sendable (Plan) async -> Approval = { _ in .approved },
        planReady: @escaping @Sendable (PlanOutcome) async throws -> Void = { _ in },
        approveResume: @escaping @Sendable (UnfinishedApply) async -> Approval = { _ in .approved }
    ) {
        self.savedPlan = savedPlan
        self.planning = planning
        self.approve = approve
        self.planReady = planReady
        self.approveResume = approveResume
    }
}

/// What an apply did.
public struct ApplySummary: Sendable {
    /// Memberships added.
    public var subscribed: Int
    /// Memberships removed.
    public var unsubscribed: Int
    /// Device-group calls made.
    public var groupCalls: Int
    /// Audiences written in state (no call to FCM).
    public var audiences: Int = 0
    /// Memberships FCM already held that became tidemark's own (nothing sent).
    public var adopted: Int = 0
    /// Topics, device groups and audiences released: forgotten by state, left as they are in FCM.
    public var released: Int = 0
    /// Requests sent to FCM.
    public var requests: Int
    /// Of the requests, those that repeated an earlier one.
    public var retries: Int = 0
    /// How long the apply took, in seconds.
    public var seconds: Double
    /// Tokens that failed, with FCM's answer.
    public var failures: [TokenFailure]

    /// Failures by error code, codes in order.
    public var failuresByCode: [(code: TokenError.Code, failures: [TokenFailure])] {
        Dictionary(grouping: failures, by: \.error.code).sorted { $0.key < $1.key }.map { ($0.key, $0.value) }
    }

    /// Whether some token failed for a reason other than being unregistered: the run did not do all it should.
    public var hasUnexpectedFailures: Bool { failures.contains { !$0.error.meansUnregistered } }
}

/// How an apply ended.
public struct ApplyOutcome: Sendable {
    /// What the apply came to.
    public enum Result: Sendable {
        /// The plan ran.
        case applied(ApplySummary)
        /// Nothing to change; `savedPlan` says a saved plan was empty.
        case nothingToDo(savedPlan: Bool)
        /// The person said no.
        case declined
        /// Only the interrupted apply ran: it was the saved plan given, or it left failures, so
        /// nothing new was planned.
        case resumedOnly
        /// `--refresh-only`: what was read is recorded; FCM was not changed.
        case refreshed(RefreshRecord)
    }

    /// An interrupted apply that was finished first.
    public var resumed: ApplySummary?
    /// What the apply came to.
    public var result: Result
    /// Devices the inventory still lists whose token FCM reported dead, after this apply: for
    /// `--dead-tokens FILE` and the sources' `on_dead` hooks.
    public var dead: [DeadDevice] = []
    /// What the automatic prune (`prune_after`) forgot, when it ran.
    public var pruned: PruneOutcome? = nil
    /// The memberships state holds after this apply, when it planned (`State.managedMemberships`).
    public var managedMemberships: Int? = nil
    /// What a fresh, whole plan (no targets, not drift-only, not a saved plan) left when it was carried
    /// out without an unexpected failure: the manifests as read and state as saved. `serve` plans the
    /// next changed devices from it (`WarmPlan`).
    public var settled: Settled? = nil

    /// The manifests a whole plan was made from, and state after it was carried out.
    public struct Settled: Sendable {
        /// The manifests and inventory, resolved into `state`'s token table.
        public var loaded: LoadedManifests
        /// State as the apply saved it.
        public var state: State
        /// The topics and groups a rail held: the plan was the whole plan of everything else, and
        /// their changes still wait.
        public var held: [HeldChange] = []
    }

    /// Whether a token failed, in either apply, for a reason other than being unregistered.
    public var hasUnexpectedFailures: Bool {
        if resumed?.hasUnexpectedFailures == true { return true }
        if case .applied(let summary) = result { return summary.hasUnexpectedFailures }
        return false
    }

    /// Exit 1 when a token could not be changed for a reason other than being unregistered, or the
    /// person said no.
    public var exitStatus: ExitStatus {
        if hasUnexpectedFailures { return .failure }
        if case .declined = result { return .failure }
        return .success
    }
}

/// `tidemark apply`: finish an interrupted apply (or abandon it when the manifests or backend
/// changed), then carry out a fresh or saved plan, journaling every operation.
///
/// The caller holds the state lock around `run`.
public struct ApplyWorkflow: Sendable {
    /// The parts the apply runs on.
    public var parts: WorkflowParts

    /// An apply over `parts`.
    public init(_ parts: WorkflowParts) { self.parts = parts }

    /// Carries out `request`. A graceful shutdown (SIGTERM through swift-service-lifecycle, a replica
    /// told to stop) cancels it wherever it is, and the journal's writer beside it still records every
    /// step that finished: the next apply resumes from there.
    public func run(_ request: ApplyRequest) async throws -> ApplyOutcome {
        let writer = JournalWriter()
        return try await writer.run {
            try await cancelWhenGracefulShutdown { try await applying(request, writer: writer) }
        }
    }

    private func applying(_ request: ApplyRequest, writer: JournalWriter) async throws -> ApplyOutcome {
        if request.refreshOnly { return try await refreshOnly(request) }
        var resumed: ApplySummary?
        if let unfinished = try await parts.store.unfinishedApply() {
            // A state mv is finished by the same state mv, never resumed or abandoned as an apply.
            if let move = unfinished.plan.move { throw WorkflowError.interruptedMove(move) }
            switch try await resume(unfinished, request, writer: writer) {
            case .finishedSavedPlan(let summary): return ApplyOutcome(resumed: summary, result: .resumedOnly)
            case .finished(let summary):
                if summary.hasUnexpectedFailures { return ApplyOutcome(resumed: summary, result: .resumedOnly) }
                resumed = summary
            case .declined: return ApplyOutcome(resumed: nil, result: .declined)
            case .abandoned: break
            }
        }
        var state: State
        var loaded: LoadedManifests
        let plan: Plan
        // The registrations read before this apply: recorded as read, which advances the sweep.
        var read = TokenSet()
        // A saved plan's sweep: the registrations it read that matched state, and when.
        var swept: SweptRegistrations?
        if let (saved, file) = request.savedPlan {
            // A plan older than `rereadAfter` has every registration it changes read again: the read
            // starts now, beside the loading of state and inventory (at a million devices, seconds of
            // each). A recent plan reads only what state does not explain, once loaded (checkOperations).
            // A plan for another backend reads nothing.
            let tokens = Self.registrationsRead(saved)
            let parts = self.parts
            let recent = Self.isRecent(saved, now: parts.timing.unixTime(), window: request.rereadAfter)
            let readEarly = request.planning.refresh.mode != .all && !recent && saved.backend == parts.backend.identity
            async let early = { readEarly ? try await parts.read(tokens) : nil }()
            (state, loaded) = try await parts.loadStateAndManifests()
            try parts.stopOnErrors(loaded)
            try checkFresh(saved, file: file, state: state, loaded: loaded)
            try checkSelection(saved, file: file, request: request.planning, state: state)
            // Before anything more is read from FCM: a plan naming what nothing here knows was not made
            // from these manifests and this state (a forged or foreign file; its reads stop with it).
            try Self.checkKnown(saved, file: file, state: state, loaded: loaded, stateLocation: parts.store.location)
            PhaseTrace.mark("saved plan: state and manifests loaded")
            let observed = try await checkOperations(
                saved, file: file, state: &state, loaded: loaded, request: request.planning,
                early: try await early.map { (tokens, $0) },
                justify: recent && request.planning.refresh.mode != .all)
            PhaseTrace.mark("saved plan: operations checked")
            // What the file says it observed is never trusted: only its checked operations run, and
            // only what this apply read itself is recorded. The one claim taken from it is which
            // registrations of its sweep matched state: that only moves them later in the sweep.
            var checked = saved
            checked.observations = state.observations(from: observed)
            read = observed.refreshed
            swept = SweptRegistrations(plan: saved, state: state)
            plan = checked
        } else {
            let outcome = try await PlanWorkflow(parts).run(request.planning)
            (state, loaded, plan) = (outcome.state, outcome.loaded, outcome.plan)
            read = outcome.read
            try await request.planReady(outcome)
            if plan.diagnostics.hasErrors { throw WorkflowError.planHasErrors }
            if plan.hasChanges {
                switch await parts.waitingForPerson({ await request.approve(plan) }) {
                case .approved: break
                case .declined: return ApplyOutcome(resumed: resumed, result: .declined)
                case .unavailable: throw WorkflowError.confirmationUnavailable
                }
            }
        }
        if !plan.hasChanges {
            // Nothing to change in FCM; what was read is still recorded (the sweep moves on), in one
            // write that touches no topic it did not see change.
            let rows = loaded.inventoryRows
            let recount = request.savedPlan == nil && !request.planning.driftOnly && rows != state.inventoryRows
            if recount { state.recordInventoryRows(rows) }
            if !read.isEmpty || !plan.observations.isEmpty || swept?.ids.isEmpty == false || recount {
                state = try await record(plan.observations, read: read, swept: swept, state: state)
            }
            var outcome = ApplyOutcome(
                resumed: resumed, result: .nothingToDo(savedPlan: request.savedPlan != nil),
                dead: DeadDevice.collect(state: state, inventory: loaded.inventory))
            outcome.managedMemberships = state.managedMemberships
            if Self.isWhole(request), resumed?.hasUnexpectedFailures != true {
                outcome.settled = ApplyOutcome.Settled(loaded: loaded, state: state, held: plan.held ?? [])
            }
            return outcome
        }
        state.claim(backend: plan.backend, lineage: parts.timing.uuid())
        let session = try await ApplySession.begin(
            plan: plan, desired: loaded.desired, store: parts.store, state: state,
            timing: parts.timing, inventory: loaded.inventory, read: read, swept: swept,
            answers: parts.deadAnswers(loaded.inventory),
            inventoryRows: request.planning.driftOnly ? nil : loaded.inventoryRows, writer: writer)
        PhaseTrace.mark("apply: journal begun")
        let summary = try await execute(plan, done: [], tokensDone: [:], session: session)
        PhaseTrace.mark("apply: executed")
        let final = await session.state
        var outcome = ApplyOutcome(
            resumed: resumed, result: .applied(summary),
            dead: DeadDevice.collect(state: final, inventory: loaded.inventory))
        outcome.managedMemberships = final.managedMemberships
        if let retention = request.pruneAfter {
            // A prune rewrites every topic's row (token ids change), so it waits until enough can go.
            let pruned = try await PruneWorkflow.prune(
                final, declared: loaded.desired.knownTokens, store: parts.store, now: parts.timing.unixTime(),
                retention: retention, minimum: max(PruneWorkflow.automaticMinimum, final.tokens.count / 10))
            if pruned.serial != nil { outcome.pruned = pruned }
        }
        if outcome.pruned == nil, Self.isWhole(request), !outcome.hasUnexpectedFailures {
            outcome.settled = ApplyOutcome.Settled(loaded: loaded, state: final, held: plan.held ?? [])
        }
        return outcome
    }

    /// A fresh plan of everything: no saved plan, targets or drift-only.
    static func isWhole(_ request: ApplyRequest) -> Bool {
        request.savedPlan == nil && !request.planning.driftOnly && !request.planning.targets.isPartial
    }

    enum Resumption {
        case finishedSavedPlan(ApplySummary)
        case finished(ApplySummary)
        case abandoned
        case declined
    }

    /// Finishes an interrupted apply when it was made from the same manifests and backend; abandons it otherwise.
    func resume(
        _ unfinished: UnfinishedApply, _ request: ApplyRequest, writer: JournalWriter
    ) async throws -> Resumption {
        var (state, loaded) = try await parts.loadStateAndManifests()
        guard unfinished.plan.manifestsDigest == loaded.digest, unfinished.plan.backend == parts.backend.identity,
            !loaded.diagnostics.hasErrors
        else {
            parts.output.emit(.abandoned(startedAt: unfinished.startedAt))
            // What was in flight when it stopped may or may not have reached FCM: read it, so the next
            // plan starts from what FCM holds (a removal FCM carried out is not taken for an opt-out,
            // nor a membership assumed that it never made).
            let uncertain = Self.inFlight(unfinished)
            var read: RefreshResult?
            if !uncertain.isEmpty, unfinished.plan.backend == parts.backend.identity {
                let statuses = try await parts.read(uncertain)
                read = try await parts.refreshResult(uncertain, statuses, groups: [], state: &state, loaded: loaded)
            }
            let session = ApplySession.resume(unfinished, store: parts.store, state: state, timing: parts.timing)
            try await session.abandon(unfinished, read: read)
            return .abandoned
        }
        let session = ApplySession.resume(
            unfinished, store: parts.store, state: state, timing: parts.timing,
            answers: parts.deadAnswers(loaded.inventory), writer: writer)
        switch await parts.waitingForPerson({ await request.approveResume(unfinished) }) {
        case .approved: break
        case .declined: return .declined
        case .unavailable: throw WorkflowError.confirmationUnavailable
        }
        parts.output.emit(
            .resuming(
                startedAt: unfinished.startedAt, done: unfinished.done.count,
                total: unfinished.plan.operations.count))
        let summary = try await execute(
            unfinished.plan, done: unfinished.done, tokensDone: unfinished.tokensDone, session: session)
        // Said now, before a new plan says what is left: the two then read in the order they happened.
        parts.output.emit(.resumed(summary))
        if let (saved, file) = request.savedPlan {
            guard saved.operationsDigest == unfinished.plan.operationsDigest else {
                throw WorkflowError.stalePlan(
                    StalePlan(
                        file: file, stateLocation: parts.store.location,
                        reason: .interruptedApplyFinished))
            }
            return .finishedSavedPlan(summary)
        }
        return .finished(summary)
    }

    /// The registrations an interrupted apply may have changed without journaling it, each once: the
    /// tokens not journaled of the topic operations of the phase it stopped in (unsubscribes run to the
    /// end before any subscribe is sent, so when an unsubscribe is unfinished no subscribe was sent).
    static func inFlight(_ unfinished: UnfinishedApply) -> [String] {
        let operations = unfinished.plan.operations
        let pending = operations.indices.filter { !unfinished.done.contains($0) }
        let phase: PlannedOperation.Kind? =
            pending.contains { operations[$0].kind == .unsubscribe }
            ? .unsubscribe : pending.contains { operations[$0].kind == .subscribe } ? .subscribe : nil
        guard let phase else { return [] }
        var seen = Set<String>()
        var tokens: [String] = []
        for index in pending where operations[index].kind == phase {
            let op = operations[index]
            let from = min(unfinished.progress[index]?.tokensDone ?? 0, op.tokens.count)
            for token in op.tokens[from...] where seen.insert(token).inserted { tokens.append(token) }
        }
        return tokens
    }

    /// A saved plan applies only to the state, manifests and backend it was made from.
    func checkFresh(_ plan: Plan, file: String, state: State, loaded: LoadedManifests) throws {
        func stale(_ reason: StalePlan.Reason) -> WorkflowError {
            .stalePlan(StalePlan(file: file, stateLocation: parts.store.location, reason: reason))
        }
        if plan.lineage != state.lineage {
            if plan.lineage.isEmpty { throw stale(.madeBeforeState(lineage: state.lineage)) }
            throw stale(.otherLineage(plan: plan.lineage, state: state.lineage))
        }
        if plan.serial != state.serial {
            // The state moved. Still valid when nothing the plan touches moved with it (another pull
            // request's apply, say); the operations are derived again before anything runs.
            guard let versions = plan.versions else {
                throw stale(.serialMoved(plan: plan.serial, state: state.serial))
            }
            let moved = versions.filter { state.versions[$0.key] ?? 0 != $0.value }.map(\.key).sorted()
            if !moved.isEmpty {
                throw stale(.touchedChanged(moved, plan: plan.serial, state: state.serial))
            }
        }
        if plan.manifestsDigest != loaded.digest {
            // Other topics may have changed (another pull request merged first): still valid when every
            // topic and group the plan touches means what it meant.
            guard let desired = plan.desired else {
                throw stale(.manifestsChanged(plan: plan.manifestsDigest, now: loaded.digest))
            }
            let now = loaded.entryDigests
            let changed = desired.filter { (now[$0.key] ?? "") != $0.value }.map(\.key).sorted()
            if !changed.isEmpty {
                throw stale(.touchedInManifests(changed, devices: Self.inventoryMoves(plan, loaded, state)))
            }
        }
        if plan.backend != parts.backend.identity {
            throw stale(.otherBackend(plan: plan.backend, now: parts.backend.identity))
        }
    }

    /// Which inventory sources read other devices than when `plan` was made, and which devices of its
    /// operations the inventory no longer lists with the same token; nil when nothing is known to have moved.
    static func inventoryMoves(_ plan: Plan, _ loaded: LoadedManifests, _ state: State) -> String? {
        var parts: [String] = []
        for record in plan.inventory ?? [] {
            guard let now = loaded.snapshots[record.source] else {
                parts.append("inventory '\(record.source)' is no longer read")
                continue
            }
            guard now.identity != record.identity else { continue }
            let counts = record.rows.flatMap { then in now.rows.map { " (\(then) devices then, \($0) now)" } } ?? ""
            parts.append("inventory '\(record.source)' changed\(counts)")
        }
        let topics = Dictionary(loaded.desired.topics.map { ($0.name, $0.members) }, uniquingKeysWith: { a, _ in a })
        let groups = Dictionary(loaded.desired.groups.map { ($0.name, $0.members) }, uniquingKeysWith: { a, _ in a })
        var gone: [String] = []
        var seen = Set<String>()
        for op in plan.operations where op.kind == .subscribe || op.kind == .groupAdd || op.kind == .groupCreate {
            let members = op.kind == .subscribe ? topics[op.target] : groups[op.target]
            for token in op.tokens where seen.insert(token).inserted {
                let declared = state.tokens.id(token).map { members?.contains($0) ?? false } ?? false
                if !declared { gone.append(Redaction.redact(token)) }
            }
        }
        if !gone.isEmpty {
            parts.append(
                "\(gone.count) token\(gone.count == 1 ? "" : "s") it adds \(gone.count == 1 ? "is" : "are") no longer declared, as when a device leaves the inventory or its token rotates: \(gone.prefix(3).joined(separator: ", "))\(gone.count > 3 ? ", …" : "")"
            )
        }
        return parts.isEmpty ? nil : parts.joined(separator: "; ")
    }

    /// A saved plan runs only operations the planner would produce now: the registrations and groups it
    /// touches are read again, their operations derived again from state and manifests (safety rails
    /// included), and any (topic or group, direction, token) of the file that is neither in them nor
    /// already true in FCM refuses the whole plan. An edited file, even with a recomputed digest, cannot
    /// unsubscribe a protected topic or add a token nobody declared.
    ///
    /// With `justify` (a recent plan), a registration is read again only when one of its operations is
    /// not what a plan from state alone produces: the rest are what `--refresh none` would run.
    func checkOperations(
        _ plan: Plan, file: String, state: inout State, loaded: LoadedManifests, request: PlanRequest,
        early: (tokens: [String], read: (statuses: [RegistrationStatus], at: Int64))? = nil, justify: Bool = false
    )
        async throws -> RefreshResult
    {
        let groups = Set(plan.operations.filter(\.kind.isGroupCall).map(\.target)).sorted()
        let planner = parts.planner()
        func replan(_ observed: RefreshResult) throws -> Plan {
            planner.plan(
                loaded: loaded, state: state, refresh: observed, backend: parts.backend.identity,
                now: parts.timing.wallClock(), targets: try plan.selection, maxUnsubscribes: request.maxUnsubscribes)
        }
        func refuse(_ detail: String) -> WorkflowError {
            .stalePlan(
                StalePlan(file: file, stateLocation: parts.store.location, reason: .notWhatThePlannerWouldDo(detail)))
        }
        func checkRails(_ now: Plan) throws {
            if let first = now.diagnostics.first(where: { $0.severity == .error }) {
                throw refuse("the plan breaks a safety rail now: \(first.message)")
            }
        }
        var observed: RefreshResult
        var now: Plan
        if justify {
            // Groups are looked up in any case; registrations only where state does not explain the plan.
            observed = try await parts.refresh(TokenSet(), groups: groups, state: state, loaded: loaded)
            now = try replan(observed)
            // Usually the two plans are the same, operation for operation (compared without hashing).
            let same = now.operations == plan.operations
            let reread = same ? [] : Self.unexplained(plan, by: now)
            let changed = Self.registrationsRead(plan).count
            func sayChecked() {
                guard changed + reread.count > 0 else { return }
                parts.output.emit(
                    .savedPlanChecked(
                        registrations: changed, readAgain: reread.count,
                        planAge: plan.coverage.map { parts.timing.unixTime() - $0.at }))
            }
            PhaseTrace.mark("saved plan: \(reread.count) registrations to read again")
            if same {
                // Every change is one a plan from state makes: what remains to check is its safety
                // rails, before the check is said to have passed.
                try checkRails(now)
                sayChecked()
                return observed
            }
            sayChecked()
            if !reread.isEmpty {
                let read = try await parts.read(reread)
                observed = try await parts.refreshResult(reread, read, groups: groups, state: &state, loaded: loaded)
                now = try replan(observed)
            }
        } else if let early {
            // Read while state loaded: exactly the registrations below, interned now.
            observed = try await parts.refreshResult(
                early.tokens, early.read, groups: groups, state: &state, loaded: loaded)
            now = try replan(observed)
        } else {
            // --refresh all: every registration, the plan's own among them (new ones interned first).
            for token in Self.registrationsRead(plan) { state.intern(token) }
            let all = TokenSet(sorted: Array(0..<UInt32(state.tokens.count)))
            observed = try await parts.refresh(all, groups: groups, state: state, loaded: loaded)
            now = try replan(observed)
        }
        try checkRails(now)
        let expected = Self.triples(now)
        for op in plan.operations where op.tokens.isEmpty && op.kind.isStateOnly {
            if !expected.contains(Triple(kind: op.kind, target: op.target, token: "")) {
                throw refuse(
                    "it would \(op.kind.rawValue) '\(op.target)', which the manifests and state do not call for")
            }
        }
        var working = state
        working.recordRefresh(observed)
        var unexpected: [Triple] = []
        for op in plan.operations {
            for token in op.tokens where !expected.contains(Triple(kind: op.kind, target: op.target, token: token)) {
                // The planner makes the opposite change: the file's direction was turned around.
                if op.kind.opposites.contains(where: {
                    expected.contains(Triple(kind: $0, target: op.target, token: token))
                }) {
                    unexpected.append(Triple(kind: op.kind, target: op.target, token: token))
                    continue
                }
                // Harmless when it is already true in FCM (a device re-asserted its own subscription).
                let id = working.tokens.id(token)
                let subscribed = id.map { working.topics[op.target]?.observed.contains($0) ?? false } ?? false
                let member = id.map { working.groups[op.target]?.members.contains($0) ?? false } ?? false
                let alreadyTrue =
                    switch op.kind {
                    case .subscribe: subscribed
                    case .unsubscribe: !subscribed && id != nil
                    case .groupCreate, .groupAdd, .audienceSet: member
                    case .groupRemove: !member && id != nil
                    // Recording what FCM holds as tidemark's own is harmless where FCM holds it.
                    case .topicAdopt: subscribed
                    case .audienceDelete, .audienceUnlink, .topicRelease, .groupRelease: false
                    }
                if !alreadyTrue { unexpected.append(Triple(kind: op.kind, target: op.target, token: token)) }
            }
        }
        guard let first = unexpected.first else { return observed }
        throw refuse(
            "it would \(first.kind.rawValue) \(Redaction.redact(first.token)) \(first.kind == .subscribe || first.kind == .groupAdd || first.kind == .groupCreate ? "to" : "from") '\(first.target)', which the manifests and state do not call for\(unexpected.count > 1 ? " (and \(unexpected.count - 1) more such change\(unexpected.count == 2 ? "" : "s"))" : "")"
        )
    }

    /// Refuses a saved plan whose operations name a topic, group or registration that neither the
    /// manifests, the inventory nor state know: no plan tidemark made here can, and reading them from FCM
    /// first (a million forged registrations) would only cost minutes before the same refusal.
    static func checkKnown(
        _ plan: Plan, file: String, state: State, loaded: LoadedManifests, stateLocation: String
    ) throws {
        // Each kind against what it acts on: a topic operation names a topic, a device-group call a
        // group (or an audience still kept in step with the FCM group it came from), an audience step an
        // audience (or the group being converted to one).
        let topics = Set(loaded.desired.topics.map(\.name)).union(state.topics.keys)
        let groups = Set(loaded.desired.groups.map(\.name)).union(state.groups.keys)
            .union(loaded.desired.audiences.map(\.name))
        let audiences = Set(loaded.desired.audiences.map(\.name)).union(state.groups.keys)
        var unknownTarget: (name: String, kind: String)?
        var unknownTokens = 0
        var firstToken: String?
        for op in plan.operations where unknownTarget == nil {
            let known: Bool
            let kind: String
            if op.kind.isTopicStep {
                (known, kind) = (topics.contains(op.target), "a topic")
            } else if op.kind == .groupRelease {
                (known, kind) = (state.groups.keys.contains(op.target), "a device group or audience")
            } else if op.kind.isStateOnly {
                (known, kind) = (audiences.contains(op.target), "an audience")
            } else if op.kind.isGroupCall {
                (known, kind) = (groups.contains(op.target), "a device group")
            } else {
                (known, kind) = (topics.contains(op.target), "a topic")
            }
            if !known { unknownTarget = (op.target, kind) }
        }
        for op in plan.operations {
            for token in op.tokens where state.tokens.id(token) == nil && loaded.inventory.index(ofToken: token) == nil
            {
                unknownTokens += 1
                if firstToken == nil { firstToken = token }
            }
        }
        func refuse(_ detail: String) -> WorkflowError {
            .stalePlan(StalePlan(file: file, stateLocation: stateLocation, reason: .notWhatThePlannerWouldDo(detail)))
        }
        if let unknownTarget {
            throw refuse(
                "it names '\(unknownTarget.name.escapedOnOneLine)' as \(unknownTarget.kind) that neither the manifests nor state know"
            )
        }
        if let firstToken {
            throw refuse(
                "it names \(PlanRenderer.formatCount(unknownTokens)) registration\(unknownTokens == 1 ? "" : "s") that neither the inventory, the manifests nor state know (\(Redaction.redact(firstToken)) first)"
            )
        }
    }

    /// One change a plan makes: a token to or from a topic or group (token "" for a step without tokens).
    struct Triple: Hashable {
        var kind: PlannedOperation.Kind
        var target: String
        var token: String
    }

    /// Every change of `plan`'s operations.
    static func triples(_ plan: Plan) -> Set<Triple> {
        var expected = Set<Triple>()
        for op in plan.operations {
            for token in op.tokens { expected.insert(Triple(kind: op.kind, target: op.target, token: token)) }
            // A step without tokens (forgetting an audience or its FCM group) is checked by itself.
            if op.tokens.isEmpty { expected.insert(Triple(kind: op.kind, target: op.target, token: "")) }
        }
        return expected
    }

    /// The registrations to read again before `plan` can be checked against `now` (a plan from state
    /// alone): those with a change `now` does not make (drift the plan's refresh found, or an edit), in
    /// the plan's order, then those with a change `now` makes that the plan left out (its refresh found
    /// the token dead, or the change already made), so that what it found is also recorded.
    static func unexplained(_ plan: Plan, by now: Plan) -> [String] {
        let expected = triples(now)
        let planned = triples(plan)
        var unexplained = Set<String>()
        for op in plan.operations where op.kind.readsRegistrations {
            for token in op.tokens where !expected.contains(Triple(kind: op.kind, target: op.target, token: token)) {
                unexplained.insert(token)
            }
        }
        var omitted: [String] = []
        for op in now.operations where op.kind.readsRegistrations {
            for token in op.tokens
            where !planned.contains(Triple(kind: op.kind, target: op.target, token: token))
                && unexplained.insert(token).inserted
            {
                omitted.append(token)
            }
        }
        return registrationsRead(plan).filter { unexplained.contains($0) } + omitted
    }

    /// Whether a saved plan was made within `window` seconds before `now` (by its own refresh time; a time
    /// in the future does not count as recent).
    static func isRecent(_ plan: Plan, now: Int64, window: Int64?) -> Bool {
        guard let window, window > 0, let coverage = plan.coverage, coverage.mode != .none else { return false }
        let at = coverage.at
        return at <= now + 5 && now - at <= window
    }

    /// The registrations a saved plan changes, each once, in the plan's order: what applying it reads
    /// again (audience steps and releases change state only, and need no read; an adoption says FCM
    /// holds a membership, which is read).
    static func registrationsRead(_ plan: Plan) -> [String] {
        var seen = Set<String>()
        var tokens: [String] = []
        for op in plan.operations where op.kind.readsRegistrations {
            for token in op.tokens where seen.insert(token).inserted { tokens.append(token) }
        }
        return tokens
    }

    /// A saved plan runs with the selection it was made with: flags may repeat it, never change or widen it;
    /// `maxUnsubscribes` still applies.
    func checkSelection(_ plan: Plan, file: String, request: PlanRequest, state: State) throws {
        let saved = try plan.selection
        if request.targets.isPartial, request.targets != saved {
            throw WorkflowError.stalePlan(
                StalePlan(
                    file: file, stateLocation: parts.store.location,
                    reason: .selectionChanged(planned: saved.summary, given: request.targets.summary)))
        }
        if let limit = request.maxUnsubscribes,
            let violation = limit.violation(unsubscribes: plan.unsubscribeCount, known: state.observedMembershipCount)
        {
            throw WorkflowError.stalePlan(
                StalePlan(
                    file: file, stateLocation: parts.store.location,
                    reason: .tooManyUnsubscribes(violation)))
        }
    }

    func execute(
        _ plan: Plan, done: Set<Int>, tokensDone: [Int: Int], session: ApplySession
    ) async throws -> ApplySummary {
        let started = parts.timing.now()
        let state = await session.state
        let keys = state.groups.compactMapValues(\.key)
        let total = plan.operations.reduce(0) { $0 + $1.tokens.count }
        let output = parts.output
        let report: @Sendable (ExecutionProgress) -> Void = { output.emit(.applyProgress($0)) }
        var executor = Executor(
            backend: parts.backend, recorder: session, parallelism: parts.parallelism,
            timing: parts.timing, progress: total > 0 ? report : nil)
        executor.gate = parts.leaseGate
        let executed = try await parts.phase(.applying) {
            try await executor.run(plan.operations, done: done, tokensDone: tokensDone, groupKeys: keys)
        }
        PhaseTrace.mark("apply: operations done")
        try await parts.phase(.saving) { try await session.finish() }
        return Self.summary(
            of: plan, done: done, tokensDone: tokensDone, report: executed,
            seconds: Timing.seconds(parts.timing.now() - started))
    }

    static func summary(
        of plan: Plan, done: Set<Int>, tokensDone: [Int: Int] = [:], report: ExecutionReport, seconds: Double
    ) -> ApplySummary {
        let remaining = plan.operations.indices.filter { !done.contains($0) }
        let sent = { (kind: PlannedOperation.Kind) in
            remaining.filter { plan.operations[$0].kind == kind }.reduce(0) {
                $0 + plan.operations[$1].tokens.count - min(tokensDone[$1] ?? 0, plan.operations[$1].tokens.count)
            }
        }
        let subscribed = sent(.subscribe)
        let unsubscribed = sent(.unsubscribe)
        let failures = report.failures
        var summary = ApplySummary(
            subscribed: subscribed - failures.filter { $0.kind == .subscribe }.count,
            unsubscribed: unsubscribed - failures.filter { $0.kind == .unsubscribe }.count,
            groupCalls: remaining.filter { plan.operations[$0].kind.isGroupCall }.count, requests: report.requests,
            retries: report.retries,
            seconds: seconds, failures: failures)
        let audienceSteps: Set<PlannedOperation.Kind> = [.audienceSet, .audienceDelete, .audienceUnlink]
        summary.audiences =
            Set(
                remaining.filter { audienceSteps.contains(plan.operations[$0].kind) }.map { plan.operations[$0].target }
            )
            .count
        summary.adopted = remaining.filter { plan.operations[$0].kind == .topicAdopt }.reduce(0) {
            $0 + plan.operations[$1].tokens.count
        }
        summary.released = remaining.count { [.topicRelease, .groupRelease].contains(plan.operations[$0].kind) }
        return summary
    }
}

/// What `apply --refresh-only` read and recorded.
public struct RefreshRecord: Sendable {
    /// How far the refresh looked.
    public var coverage: RefreshCoverage
    /// How what was read differs from what state remembered (now recorded).
    public var observations: Observations
    /// The serial state was written at; nil when nothing was read.
    public var serial: Int?
}

extension ApplyWorkflow {
    /// `apply --refresh-only`: reads per the refresh policy and records what it saw, changing nothing
    /// in FCM. Refused while an apply is unfinished (its journal decides what state holds).
    func refreshOnly(_ request: ApplyRequest) async throws -> ApplyOutcome {
        if let pending = try await parts.store.unfinishedApply() {
            throw WorkflowError.unfinished(pending, at: parts.store.location)
        }
        let outcome = try await PlanWorkflow(parts).run(request.planning)
        let coverage =
            outcome.plan.coverage
            ?? RefreshCoverage(mode: .none, fleet: outcome.state.fleet().count, read: 0, at: parts.timing.unixTime())
        var record = RefreshRecord(coverage: coverage, observations: outcome.plan.observations, serial: nil)
        if !outcome.read.isEmpty {
            let state = try await self.record(
                outcome.plan.observations, read: outcome.read, swept: nil, state: outcome.state)
            record.serial = state.serial
        }
        return ApplyOutcome(
            resumed: nil, result: .refreshed(record),
            dead: DeadDevice.collect(state: outcome.state, inventory: outcome.loaded.inventory))
    }

    /// Records observations and when `read` was read, in one save that writes only the topics and
    /// groups that changed and the tokens read.
    func record(
        _ observations: Observations, read: TokenSet, swept: SweptRegistrations?, state: State
    )
        async throws -> State
    {
        let before = state
        var state = state
        parts.claim(&state)
        let tokens = state.recordReads(observations, read: read, swept: swept)
        var write = StateWrite()
        write.includeTopicsAndGroups(before: before, after: state)
        write.tokens = tokens
        _ = try await parts.phase(.saving) { try await parts.store.save(&state, write, at: parts.timing.unixTime()) }
        return state
    }
}
