import Foundation
import TidemarkCore
import TidemarkStore

/// One call per command: the backend, the lock and the workflow, put together the same way for every
/// front end. `output` receives the workflow's events (diagnostics, progress); what comes back is
/// for the front end to render.
extension Runtime {
    /// Plans: reads FCM as `request.refresh` says. A plan that reads nothing from the emulator or FCM
    /// loads no credential, so a pull-request job can plan without the key. When a flag picked the
    /// other topic API than the project's, the plan also compares what the two read (shadow verify).
    public func plan(
        _ request: PlanRequest, output: any WorkflowOutput, acceptDead: Bool = false
    ) async throws -> PlanOutcome {
        var request = request
        if request.shadowVerify == nil, transport != configuredTransport {
            request.shadowVerify = (reads: transport, against: configuredTransport)
        }
        if request.refresh.mode == .none, backendKind.isHTTP {
            return try await PlanWorkflow(parts(detachedBackend(), output: output, acceptDead: acceptDead)).run(
                request)
        }
        let prepared = request
        return try await withBackend(output: output) { backend in
            try await PlanWorkflow(parts(backend, output: output, acceptDead: acceptDead)).run(prepared)
        }
    }

    /// The apply of `planning`, or of the plan saved at `savedPlan` (read and checked as
    /// `readSavedPlan` does), with tidemark.yaml's settings for every front end: `prune_after` and
    /// `saved_plan_reread_after`. Approves everything; a front end that asks a person sets `approve`,
    /// `planReady` and `approveResume`.
    public func applyRequest(_ planning: PlanRequest, savedPlan: String? = nil) throws -> ApplyRequest {
        var request = ApplyRequest(
            savedPlan: try savedPlan.map { (plan: try readSavedPlan($0).plan, file: $0) }, planning: planning)
        request.pruneAfter = settings.pruneAfter
        request.rereadAfter = settings.savedPlanRereadAfter
        return request
    }

    /// Applies under the state lock, waiting up to `lockTimeout` seconds for another run to let go;
    /// the lock names `holder` (what `tidemark state lock` and a refused run show).
    public func apply(
        _ request: ApplyRequest, output: any WorkflowOutput, parallelism: Int = 8, acceptDead: Bool = false,
        lockTimeout: Double = 0, holder: String = "tidemark apply"
    ) async throws -> ApplyOutcome {
        let store = stateStore()
        return try await withBackend(output: output) { backend in
            try await store.withLock(
                lockHolder(holder), waiting: lockTimeout, timing: .live, gate: leaseGate,
                onWait: { error in
                    output.emit(
                        .diagnostics([
                            .warning(
                                "\(Failure.plain(error.description)) Waiting up to \(ServeSettings.describe(.milliseconds(Int64(lockTimeout * 1000)))) for it."
                            )
                        ]))
                }
            ) {
                try await ApplyWorkflow(
                    parts(backend, output: output, parallelism: parallelism, acceptDead: acceptDead)
                ).run(request)
            }
        }
    }

    /// Applies a batch of changed devices planned by `WarmPlan.planChanges` under the state lock
    /// (`ApplyWorkflow.applyChanges`).
    public func applyChanges(_ change: ChangePlan, output: any WorkflowOutput) async throws -> ChangeApplied {
        let store = stateStore()
        return try await withBackend(output: output) { backend in
            try await store.withLock(
                lockHolder("tidemark serve (changed devices)"), waiting: 0, timing: .live, gate: leaseGate
            ) {
                try await ApplyWorkflow(parts(backend, output: output)).applyChanges(change)
            }
        }
    }

    /// Reads the devices `ids` of the source `name` through its change feed, as a whole read sees
    /// them (its labels and exclusions): the devices listed among them, and the problems a whole read
    /// would report of their rows. Nil when `name` follows no changes.
    public func readDevices(_ ids: [String], of name: String) async throws -> (Inventory, [Diagnostic])? {
        guard let feed = changeFeeds().first(where: { $0.source == name }) else { return nil }
        var builder = InventoryBuilder(deviceLimit: settings.limits.devices)
        try await feed.readDevices(ids, into: &builder)
        return (builder.inventory, builder.allDiagnostics)
    }

    /// The feeds of the sources whose kind follows changes and whose settings ask it to (what
    /// `serve` follows between whole reads), in tidemark.yaml's order.
    public func changeFeeds() -> [any ChangeFeed] {
        let context = sourceContext()
        return settings.inventory.compactMap { registries.sources.feed($0, context) }
    }

    /// Compares what FCM holds with state, as `policy` reads it; changes neither.
    public func drift(
        _ policy: RefreshPolicy, output: any WorkflowOutput, acceptDead: Bool = false
    ) async throws -> DriftReport {
        try await withBackend(output: output) { backend in
            try await DriftWorkflow(parts(backend, output: output, acceptDead: acceptDead)).run(policy)
        }
    }

    /// Adopts what FCM holds for `targets` into state, under the state lock (a dry run takes none and
    /// writes nothing).
    public func importMemberships(
        targets: Targets, dryRun: Bool, output: any WorkflowOutput, acceptDead: Bool = false
    ) async throws -> ImportOutcome {
        let store = stateStore()
        return try await withBackend(output: output) { backend in
            let importing = ImportWorkflow(parts(backend, output: output, acceptDead: acceptDead))
            if dryRun { return try await importing.run(targets: targets, dryRun: true) }
            // The gate: each answer of the reads moves the lease's work (a long read is not stuck), and
            // a run that lost its lease sends nothing more.
            return try await store.withLock(lockHolder("tidemark import"), waiting: 0, timing: .live, gate: leaseGate) {
                try await importing.run(targets: targets)
            }
        }
    }

    /// Reads the members of device groups from FCM, under the state lock (it records what it read).
    public func exportGroups(_ names: [String], output: any WorkflowOutput) async throws -> GroupsExport {
        let store = stateStore()
        return try await withBackend(output: output) { backend in
            try await store.withLock(
                lockHolder("tidemark groups export"), waiting: 0, timing: .live, gate: leaseGate
            ) {
                try await GroupsExportWorkflow(parts(backend, output: output, acceptDead: true)).run(names: names)
            }
        }
    }

    /// What state and the inventory say of one device or token; reads nothing from FCM.
    public func device(_ query: String, output: any WorkflowOutput) async throws -> DeviceView {
        try await DeviceWorkflow(parts(detachedBackend(), output: output)).run(query)
    }

    /// Forgets tokens gone for at least `retention` seconds, under the state lock (a dry run takes none
    /// and writes nothing).
    public func prune(retention: Int64, dryRun: Bool, output: any WorkflowOutput) async throws -> PruneOutcome {
        let workflow = PruneWorkflow(
            manifests: manifestSource(), store: stateStore(), timing: timing, output: output)
        if dryRun { return try await workflow.run(retention: retention, dryRun: true) }
        return try await stateStore().withLock(lockHolder("tidemark state prune")) {
            try await workflow.run(retention: retention)
        }
    }

    /// Forgets `addresses` in state, sending nothing to FCM, under the state lock (a dry run takes none
    /// and writes nothing).
    public func releaseFromState(_ addresses: [StateAddress], dryRun: Bool) async throws -> StateRemoveOutcome {
        let workflow = StateRemoveWorkflow(store: stateStore(), timing: timing)
        if dryRun { return try await workflow.run(addresses, dryRun: true) }
        return try await stateStore().withLock(lockHolder("tidemark state rm")) {
            try await workflow.run(addresses)
        }
    }

    /// Moves `address` from this run's state to `target`'s (another workspace or store), or finishes
    /// the interrupted move of it, under both states' locks; sends nothing to FCM.
    public func moveInState(_ address: StateAddress, to target: Runtime) async throws -> StateMoveOutcome {
        guard stateDisplay != target.stateDisplay else {
            throw RuntimeError(
                "\(address) is already in \(stateDisplay); give another workspace (--to-workspace) or store (--to-state)."
            )
        }
        let (source, destination) = (stateStore(), target.stateStore())
        let workflow = StateMoveWorkflow(
            source: source, target: destination, sourceName: stateDisplay, targetName: target.stateDisplay,
            timing: timing, tidemarkVersion: Runtime.version)
        let holder = lockHolder("tidemark state mv")
        // Both locks in one order whatever the direction: two moves the other way round never each
        // hold one lock and wait for the other.
        let (first, second) =
            stateDisplay < target.stateDisplay ? (source, destination) : (destination, source)
        return try await first.withLock(holder) {
            try await second.withLock(holder) { try await workflow.run(address) }
        }
    }

    /// Copies this run's state to `target` (`rule` says what the target may hold already).
    public func copyState(to target: any StateStore, _ rule: StateCopyWorkflow.Rule) async throws -> State {
        try await StateCopyWorkflow(from: stateStore(), to: target, timing: timing).run(
            rule, holder: lockHolder("tidemark state copy"))
    }

    /// Copies `source` into this run's state (`rule` says what this state may hold already).
    public func copyState(from source: any StateStore, _ rule: StateCopyWorkflow.Rule) async throws -> State {
        try await StateCopyWorkflow(from: source, to: stateStore(), timing: timing).run(
            rule, holder: lockHolder("tidemark state copy"))
    }

    /// A self-contained SQLite state file at `path` (`state pull` writes one, `state push` reads one).
    public func snapshotStore(_ path: String) -> any StateStore {
        SQLiteStateStore(path: path, location: path)
    }

    /// Breaks the state's lease whose id starts with `prefix`, recorded as broken by this run.
    public func forceUnlock(_ prefix: String) async throws -> LockHolder? {
        try await leaseKeeping().forceUnlock(prefix, by: lockHolder("tidemark state force-unlock"))
    }

    /// The devices a condition over topics selects, from the manifests or (after reading FCM when
    /// `refresh`) from what was observed.
    public func audience(
        _ condition: FCMCondition, source: Audience.Source, refresh: Bool, output: any WorkflowOutput
    ) async throws -> (Audience, LoadedManifests) {
        let workflow = AudienceWorkflow(manifests: manifestSource(), store: stateStore(), output: output)
        guard refresh else { return try await workflow.run(condition, source: source) }
        return try await withBackend(output: output) { backend in
            try await workflow.run(condition, source: source, refreshFrom: backend, timing: timing)
        }
    }

    /// The members of the audience or device group `name`, as the manifests declare it (`desired`) or
    /// as state holds it after the last apply (`observed`), with the state and manifests that name
    /// them; refused when neither names it.
    public func namedAudience(
        _ name: String, source: Audience.Source, output: any WorkflowOutput
    ) async throws -> NamedAudience {
        let (state, loaded) = try await AudienceWorkflow(
            manifests: manifestSource(), store: stateStore(), output: output
        ).load()
        guard let found = Audience.members(named: name, source: source, desired: loaded.desired, state: state) else {
            let where_ = source == .desired ? "the manifests declare" : "state holds"
            throw RuntimeError(
                "\(where_) no audience or device group named '\(name)'\(source == .desired ? " ('--from observed' reads state)" : "")."
            )
        }
        return NamedAudience(
            tokens: found.tokens, isAudience: found.isAudience, state: state, inventory: loaded.inventory)
    }
}

extension Runtime {
    /// The SQL that makes `table` notify the `listen` channel of the PostgreSQL inventory source
    /// `name` in tidemark.yaml with the device id (`idColumn`) of every row inserted, updated or
    /// deleted (`tidemark inventory triggers`). Reads tidemark.yaml only; connects to no database.
    public func changeTriggers(source name: String, table: String, idColumn: String) throws -> String {
        let sources = resolved.project.inventory
        guard let source = sources.first(where: { $0.name == name }) else {
            let names = sources.map { "'\($0.name)'" }.joined(separator: ", ")
            let closest = nearest(name, in: sources.map(\.name)).map { " (did you mean '\($0)'?)" } ?? ""
            throw RuntimeError(
                sources.isEmpty
                    ? "tidemark.yaml declares no inventory source; 'inventory:' with a 'postgres:' source comes first."
                    : "tidemark.yaml declares no inventory source '\(name)'\(closest); it declares \(names).")
        }
        guard let settings = source.settings(as: PostgresSourceSettings.self) else {
            throw RuntimeError(
                "\(source.location): inventory source '\(name)' reads with '\(source.key)', not 'postgres'; triggers watch the table of a 'postgres' source."
            )
        }
        guard let channel = settings.listen else {
            throw RuntimeError(
                "\(source.location): inventory source '\(name)' has no 'listen' channel; add 'listen: tidemark_devices' (any channel name) under its 'postgres:', then print the triggers that notify it."
            )
        }
        return try PostgresChangeTriggers.sql(source: name, channel: channel, table: table, idColumn: idColumn)
    }
}

/// An audience's or device group's members (`tidemark audience --name`).
public struct NamedAudience: Sendable {
    /// Its live tokens, sorted.
    public var tokens: [String]
    /// An audience (a named set in state), not a device group.
    public var isAudience: Bool
    /// The state read (what remembers the devices of tokens gone from the inventory).
    public var state: State
    /// The manifests' inventory (the members' device ids).
    public var inventory: Inventory
}

extension Runtime {
    /// Refuses to release or move `addresses` while a `tidemark serve` owns the workspace (and it is
    /// not suspended) and the manifests still declare one of them: serve's next reconcile would adopt
    /// it again within seconds (or, after a move, two workspaces would manage one topic). Nothing is
    /// refused when the store keeps no records for serve or none owns the workspace.
    public func refuseWhileServed(_ addresses: [StateAddress], command: String) async throws {
        guard let records = try? serveRecords(), let record = try? await records.serveRecord(),
            let owner = record.liveOwner(at: Date()), !record.suspended
        else { return }
        let declared = declarations()
        let still = addresses.compactMap { address in declared[address].map { (address, $0) } }
        guard let (first, at) = still.first else { return }
        throw RuntimeError(
            "'tidemark serve' on replica \(owner) owns workspace '\(workspaceName)', and the manifests still declare \(first) (\(at))\(still.count > 1 ? " and \(still.count - 1) more" : ""): its next reconcile would manage it again within seconds, undoing '\(command)'. Delete the declaration first (or list it under 'removed:' with 'unsubscribe: false', which serve applies through a plan), or run 'tidemark suspend \(workspaceName)' while you work."
        )
    }

    /// Where the manifests on disk declare each topic, group and audience (`file:line`), read
    /// without the inventory. Files that do not decode declare nothing.
    public func declarations() -> [StateAddress: String] {
        let manifests = manifestSource().declared().manifests
        var declared: [StateAddress: String] = [:]
        for topic in manifests.topics {
            declared[StateAddress(.topic, topic.name.value)] = topic.name.location.description
        }
        for group in manifests.groups {
            declared[StateAddress(.group, group.name.value)] = group.name.location.description
        }
        for audience in manifests.audiences {
            declared[StateAddress(.audience, audience.name.value)] = audience.name.location.description
        }
        return declared
    }

    /// The topics and device groups that two or more of `runtimes` declare in one FCM project (same
    /// backend and project), one sentence each naming the workspaces and where each declares it:
    /// each workspace plans against its own state, so one's plan removes what the other adds.
    /// Audiences are named sets in a workspace's own state and never meet.
    public static func sharedDeclarations(_ runtimes: [Runtime]) -> [String] {
        let projects = Dictionary(grouping: runtimes) { "\($0.backendKind.rawValue)/\($0.settings.project)" }
        var found: [String] = []
        for key in projects.keys.sorted() {
            guard let members = projects[key], members.count > 1 else { continue }
            var seen: [StateAddress: [(workspace: String, at: String)]] = [:]
            for runtime in members {
                for (address, at) in runtime.declarations() where address.kind != .audience {
                    seen[address, default: []].append((runtime.workspaceName, at))
                }
            }
            for (address, places) in seen where places.count > 1 {
                let names = places.map { "'\($0.workspace)' (\($0.at))" }.joined(separator: " and ")
                found.append(
                    "workspaces \(names) both manage \(address) in FCM project '\(members[0].settings.project)': each plans against its own state, so one's apply undoes the other's; declare it in one workspace only (or 'tidemark state mv' it)"
                )
            }
        }
        return found.sorted()
    }
}
