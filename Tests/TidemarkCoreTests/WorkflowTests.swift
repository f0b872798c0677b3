import Foundation
import Testing
import TidemarkBackendTesting
import TidemarkCore
import TidemarkEmulator
import TidemarkTesting

/// The core workflows with in-memory twins for every outside part: each rule of plan, apply (resume,
/// abandon, staleness, selection, approval, exit status), import and drift, reached without a process.
@Suite struct WorkflowTests {
    static let inventory =
        "device_id,token,team\n"
        + (0..<6).map { "d\($0),\(Fixtures.token($0)),t\($0 % 2)" }
        .joined(separator: "\n") + "\n"

    static let topics = """
        topics:
          - name: team-zero
            members: [{selector: {team: t0}}]
          - name: everyone
            mode: authoritative
            members: [{selector: {team: [t0, t1]}}]
        groups:
          - notification_key_name: family
            members: [{devices: [d0, d1]}]
        """

    /// One project: manifests in memory, a store, the in-memory engine, a manual clock.
    struct Project {
        var files: [String: String]
        let store = InMemoryStateStore()
        let backend: ScriptedBackend
        let engine: FCMEngine
        let clock = ManualClock()
        let output = RecordingOutput()

        init(topics: String = WorkflowTests.topics) throws {
            try self.init(files: [
                "inv.yaml": "inventory:\n  files: [inventory.csv]\n", "inventory.csv": WorkflowTests.inventory,
                "topics.yaml": topics,
            ])
        }

        init(files: [String: String]) throws {
            self.files = files
            let (backend, engine) = try InMemoryBackend.make(project: "tidemark-test", autoRegister: true)
            self.backend = ScriptedBackend(backend)
            self.engine = engine
        }

        var parts: WorkflowParts {
            WorkflowParts(
                manifests: Fixtures.manifests(files), store: store, backend: backend, timing: clock.timing,
                output: output, tidemarkVersion: "test")
        }

        func plan(_ request: PlanRequest = PlanRequest()) async throws -> PlanOutcome {
            try await PlanWorkflow(parts).run(request)
        }

        func apply(_ request: ApplyRequest = ApplyRequest()) async throws -> ApplyOutcome {
            try await ApplyWorkflow(parts).run(request)
        }

        func saved(_ plan: Plan) -> ApplyRequest { ApplyRequest(savedPlan: (plan, "plan.json")) }
    }

    @Test func planWritesNothingAndSaysThereAreChanges() async throws {
        let project = try Project()
        let outcome = try await project.plan()
        #expect(outcome.plan.hasChanges)
        #expect(outcome.plan.lineage.isEmpty && outcome.plan.serial == 0, "no state yet")
        #expect(outcome.exitStatus(detailedExitcode: true) == .changes)
        #expect(outcome.exitStatus(detailedExitcode: false) == .success)
        #expect(try await project.store.load() == nil)
        #expect(await project.store.saveCount == 0)
        #expect(outcome.plan.createdAt == project.clock.epoch, "the plan is stamped by the injected clock")
    }

    @Test func applyConvergesAndTheNextPlanIsEmpty() async throws {
        let project = try Project()
        let outcome = try await project.apply()
        guard case .applied(let summary) = outcome.result else {
            Issue.record("expected an apply, got \(outcome.result)")
            return
        }
        #expect(summary.subscribed == 3 + 6 && summary.groupCalls == 1 && summary.failures.isEmpty)
        #expect(outcome.exitStatus == .success && outcome.resumed == nil)
        let state = try #require(try await project.store.load())
        #expect(state.lineage == ManualClock().timing.uuid(), "the lineage is drawn from the injected random source")
        #expect(state.topics["everyone"]?.managed.count == 6)
        #expect(try await project.store.unfinishedApply() == nil)
        #expect(try await project.store.applies(limit: 5).map(\.status) == [.finished])
        let again = try await project.plan()
        #expect(!again.plan.hasChanges)
        #expect(again.exitStatus(detailedExitcode: true) == .success)
        // A second apply changes nothing in FCM. (It still records what the refresh read: FCM may answer
        // a group look-up with another of the group's key aliases.)
        let changesBefore = project.backend.calls.filter { $0 != .refresh && $0 != .groupKey }.count
        let second = try await project.apply()
        #expect(project.backend.calls.filter { $0 != .refresh && $0 != .groupKey }.count == changesBefore)
        switch second.result {
        case .nothingToDo(savedPlan: false): break
        case .applied(let summary): #expect(summary.subscribed + summary.unsubscribed + summary.groupCalls == 0)
        default: Issue.record("a second apply has nothing to do: \(second.result)")
        }
    }

    @Test func approvalDecides() async throws {
        let project = try Project()
        let declined = try await project.apply(ApplyRequest(approve: { _ in .declined }))
        guard case .declined = declined.result else {
            Issue.record("\(declined.result)")
            return
        }
        #expect(declined.exitStatus == .failure)
        #expect(try await project.store.load() == nil, "a declined apply writes nothing")
        await #expect(throws: WorkflowError.self) {
            try await project.apply(ApplyRequest(approve: { _ in .unavailable }))
        }
        #expect(try await project.store.load() == nil)
        // The plan is shown before the question.
        let shown = ShownPlans()
        _ = try await project.apply(ApplyRequest(approve: { _ in .declined }, planReady: { await shown.add($0.plan) }))
        #expect(await shown.count == 1)
    }

    actor ShownPlans {
        var count = 0
        func add(_ plan: Plan) { count += 1 }
    }

    @Test func manifestErrorsStopEveryWorkflowBeforeFCMIsRead() async throws {
        let project = try Project(topics: "topics:\n  - name: a\n    members: [{devices: [nobody]}]\n")
        await #expect { try await project.plan() } throws: { error in
            guard let count = (error as? WorkflowError)?.errorCount else { return false }
            return count >= 1
        }
        #expect(project.output.diagnostics.contains { $0.contains("unknown device 'nobody'") })
        await #expect(throws: WorkflowError.self) { try await project.apply() }
        await #expect(throws: WorkflowError.self) { try await DriftWorkflow(project.parts).run() }
        await #expect(throws: WorkflowError.self) { try await ImportWorkflow(project.parts).run() }
        #expect(project.backend.calls.isEmpty)
    }

    @Test(arguments: ["serial", "manifests", "backend", "lineage", "beforeState"])
    func staleSavedPlansAreRefused(_ what: String) async throws {
        var project = try Project()
        var plan: Plan
        if what == "beforeState" {
            plan = try await project.plan().plan
            _ = try await project.apply()
        } else {
            _ = try await project.apply()
            project.files["topics.yaml"] = Self.topics.replacingOccurrences(of: "team: t0}", with: "team: t1}")
            plan = try await project.plan().plan
            switch what {
            case "serial":
                // A device subscribed itself to what the new manifests declare; import adopts it.
                _ = try await project.engine.batchAdd(
                    project: "tidemark-test", topic: "team-zero", tokens: [Fixtures.token(1)])
                _ = try await ImportWorkflow(project.parts).run()
            case "manifests": project.files["inventory.csv"] = Self.inventory + "d9,\(Fixtures.token(9)),t1\n"
            case "backend": plan.backend = BackendIdentity(kind: .fcm, project: "tidemark-test")
            default: plan.lineage = "another-lineage"
            }
        }
        let before = try await project.store.load()?.serial
        do {
            _ = try await project.apply(project.saved(plan))
            Issue.record("a stale plan (\(what)) was applied")
        } catch let error as WorkflowError where error.stalePlan != nil {
            let stale = error.stalePlan!
            switch (what, stale.reason) {
            case ("serial", .touchedChanged(["topic:team-zero"], _, _)), ("manifests", .touchedInManifests),
                ("backend", .otherBackend), ("lineage", .otherLineage), ("beforeState", .madeBeforeState):
                #expect(stale.description.hasPrefix("plan.json "))
            default: Issue.record("wrong reason for \(what): \(stale.reason)")
            }
        }
        #expect(try await project.store.load()?.serial == before, "a refused plan writes nothing")
    }

    @Test func savedPlansKeepTheirSelectionAndBlastRadius() async throws {
        let project = try Project()
        let partial = try await project.plan(PlanRequest(targets: try Targets(include: ["topic:team-*"], exclude: [])))
            .plan
        let other = try Targets(include: ["topic:everyone"], exclude: [])
        do {
            _ = try await project.apply(
                ApplyRequest(savedPlan: (partial, "p.json"), planning: PlanRequest(targets: other)))
            Issue.record("a saved plan's selection was changed")
        } catch let error as WorkflowError where error.stalePlan != nil {
            let stale = error.stalePlan!
            guard case .selectionChanged = stale.reason else {
                Issue.record("\(stale.reason)")
                return
            }
        }
        // Repeating the selection is fine, and it applies only what it covers.
        let outcome = try await project.apply(
            ApplyRequest(
                savedPlan: (partial, "p.json"),
                planning: PlanRequest(targets: try Targets(include: ["topic:team-*"], exclude: []))))
        guard case .applied(let summary) = outcome.result else {
            Issue.record("\(outcome.result)")
            return
        }
        #expect(summary.subscribed == 3 && summary.groupCalls == 0)
        // A blast radius given at apply time still applies to a saved plan.
        var project2 = try Project()
        _ = try await project2.apply()
        project2.files["topics.yaml"] = Self.topics.replacingOccurrences(of: "[t0, t1]", with: "[t0]")
        let removal = try await project2.plan().plan
        #expect(removal.unsubscribeCount == 3)
        await #expect {
            try await project2.apply(
                ApplyRequest(
                    savedPlan: (removal, "r.json"),
                    planning: PlanRequest(maxUnsubscribes: try UnsubscribeLimit(parsing: "2"))))
        } throws: { error in
            guard let stale = (error as? WorkflowError)?.stalePlan, case .tooManyUnsubscribes = stale.reason else {
                return false
            }
            return true
        }
    }

    /// Interrupts an apply after `finished` operations by failing the next subscribe for good.
    func interrupted(_ project: Project, after finished: Int) async throws -> UnfinishedApply {
        project.backend.fail(.subscribe, nth: finished + 1)
        await #expect(throws: ScriptedBackend.Failure.self) {
            try await ApplyWorkflow(project.parts).run(ApplyRequest())
        }
        return try #require(try await project.store.unfinishedApply())
    }

    @Test func anInterruptedApplyResumesWithOnlyWhatIsLeft() async throws {
        let project = try Project()
        let unfinished = try await interrupted(project, after: 1)
        #expect(unfinished.done.count == 1)
        let subscribesBefore = project.backend.calls.filter { $0 == .subscribe }.count
        let outcome = try await project.apply()
        let resumed = try #require(outcome.resumed)
        #expect(resumed.failures.isEmpty)
        #expect(
            project.output.events.contains {
                if case .resuming(_, 1, let total) = $0 { total == unfinished.plan.operations.count } else { false }
            })
        let subscribesAfter = project.backend.calls.filter { $0 == .subscribe }.count
        #expect(
            subscribesAfter - subscribesBefore == unfinished.plan.operations.filter { $0.kind == .subscribe }.count - 1,
            "the finished operation is not sent again")
        #expect(try await project.store.unfinishedApply() == nil)
        #expect(!(try await project.plan().plan.hasChanges))
    }

    @Test func anInterruptedApplyIsAbandonedWhenTheManifestsChanged() async throws {
        var project = try Project()
        _ = try await interrupted(project, after: 1)
        project.files["topics.yaml"] =
            Self.topics + "\n  - notification_key_name: second\n    members: [{devices: [d2]}]\n"
        let outcome = try await project.apply()
        #expect(outcome.resumed == nil)
        #expect(project.output.events.contains { if case .abandoned = $0 { true } else { false } })
        #expect(try await project.store.applies(limit: 5).map(\.status) == [.finished, .abandoned])
        #expect(!(try await project.plan().plan.hasChanges))
    }

    @Test func resumingBeforeASavedPlan() async throws {
        let project = try Project()
        let plan = try await project.plan().plan
        _ = try await interrupted(project, after: 1)
        // The interrupted apply was that plan (same operations): finishing it is all.
        let sameOperations = try await project.apply(project.saved(plan))
        guard case .resumedOnly = sameOperations.result else {
            Issue.record("\(sameOperations.result)")
            return
        }
        #expect(sameOperations.resumed != nil)
        // Another saved plan is stale once an interrupted apply was finished first.
        let project2 = try Project()
        var other = try await project2.plan().plan
        other.operations.removeLast()
        _ = try await interrupted(project2, after: 1)
        await #expect { try await project2.apply(project2.saved(other)) } throws: { error in
            guard let stale = (error as? WorkflowError)?.stalePlan else { return false }
            return stale.reason == .interruptedApplyFinished
        }
    }

    /// A group's steps are journaled one by one: a failure in a later step keeps the earlier ones.
    @Test func groupStepsAreJournaledAsTheyFinish() async throws {
        var project = try Project(
            topics: """
                groups:
                  - notification_key_name: family
                    members: [{devices: [d0, d1]}]
                """)
        _ = try await project.apply()
        project.files["topics.yaml"] = """
            groups:
              - notification_key_name: family
                members: [{devices: [d2, d3]}]
            """
        let plan = try await project.plan().plan
        #expect(plan.operations.map(\.kind) == [.groupAdd, .groupRemove])
        project.backend.fail(.removeFromGroup)
        await #expect(throws: ScriptedBackend.Failure.self) { try await project.apply() }
        let unfinished = try #require(try await project.store.unfinishedApply())
        #expect(unfinished.done == [0], "the add finished and is journaled")
        let state = try #require(try await project.store.load())
        #expect(state.groups["family"]?.members.count == 4, "and its members are in state")
        let outcome = try await project.apply()
        #expect(outcome.resumed?.groupCalls == 1)
        #expect(
            await project.engine.groupMembers(project: "tidemark-test", name: "family")?.sorted()
                == [Fixtures.token(2), Fixtures.token(3)])
    }

    @Test func importAdoptsAndADryRunWritesNothing() async throws {
        let project = try Project()
        _ = try await project.engine.batchAdd(
            project: "tidemark-test", topic: "team-zero",
            tokens: [Fixtures.token(0), Fixtures.token(2)])
        let dry = try await ImportWorkflow(project.parts).run(dryRun: true)
        #expect(dry.adopted == ["team-zero": 2] && dry.serial == nil)
        #expect(try await project.store.load() == nil)
        let real = try await ImportWorkflow(project.parts).run()
        #expect(real.serial == 1 && real.registrationsRead == 6)
        #expect(try await project.store.load()?.topics["team-zero"]?.managed.count == 2)
        _ = try await interrupted(project, after: 0)
        await #expect { try await ImportWorkflow(project.parts).run() } throws: { error in
            if case WorkflowError.unfinishedApply = error { return true }
            return false
        }
    }

    @Test func driftFindsWhatMovedAndWritesNothing() async throws {
        let project = try Project()
        _ = try await project.apply()
        let clean = try await DriftWorkflow(project.parts).run()
        #expect(!clean.hasDrift && clean.exitStatus(detailedExitcode: true) == .success)
        // Authoritative topics restore what a device dropped (their default): that is drift.
        _ = try await project.engine.batchRemove(
            project: "tidemark-test", topic: "everyone", tokens: [Fixtures.token(0)])
        let serial = try await project.store.load()?.serial
        let report = try await DriftWorkflow(project.parts).run()
        #expect(report.items.map(\.kind) == [.dropped])
        #expect(report.exitStatus(detailedExitcode: true) == .changes)
        #expect(report.exitStatus(detailedExitcode: false) == .success)
        #expect(try await project.store.load()?.serial == serial, "drift never writes state")
    }

    @Test func failuresOtherThanUnregisteredFailTheRun() async throws {
        let project = try Project()
        await project.engine.injectError(.invalidArgument, forToken: Fixtures.token(1))
        let outcome = try await project.apply()
        guard case .applied(let summary) = outcome.result else {
            Issue.record("\(outcome.result)")
            return
        }
        #expect(summary.failures.map(\.error) == [.invalidArgument])
        #expect(summary.failuresByCode.map(\.code) == [.invalidArgument])
        #expect(outcome.hasUnexpectedFailures && outcome.exitStatus == .failure)
        #expect(try await project.store.load()?.dead.isEmpty == true, "an invalid argument is not a dead device")
    }

    @Test func aRefreshFullOfDeadDevicesIsRefused() async throws {
        let inventory =
            "device_id,token,team\n"
            + (0..<100).map { "d\($0),\(Fixtures.token($0)),t\($0 % 2)" }
            .joined(separator: "\n") + "\n"
        var project = try Project()
        project.files["inventory.csv"] = inventory
        _ = try await project.apply()
        for i in 0..<60 { try await project.engine.unregister(token: Fixtures.token(i)) }
        await #expect { try await project.plan() } throws: { error in
            guard
                let message = (error as? WorkflowError).flatMap({ $0.reason == "too_many_dead" ? $0.description : nil })
            else { return false }
            return message.contains("60 of the 100 registrations read") && message.contains("--accept-dead")
        }
        var accepting = project.parts
        accepting.deadTokenGuard = nil
        let plan = try await PlanWorkflow(accepting).run(PlanRequest()).plan
        #expect(plan.observations.dead.count == 60)
        #expect(DeadTokenGuard().violation(newlyDead: 50, read: 60) == nil, "up to the minimum is always believed")
        #expect(DeadTokenGuard().violation(newlyDead: 51, read: 1000) == nil, "a small share is believed")
        #expect(DeadTokenGuard(share: 0.5, minimum: 0).violation(newlyDead: 6, read: 10) != nil)
    }

    @Test func selectorsThatMatchNothingAreErrors() async throws {
        let project = try Project()
        await #expect {
            try await project.plan(PlanRequest(targets: try Targets(include: ["topic:team-zeor"], exclude: [])))
        } throws: { error in
            guard let misses = (error as? WorkflowError)?.unmatchedSelectors, !misses.isEmpty else { return false }
            return misses.map(\.selector) == ["topic:team-zeor"] && misses[0].closest.first == "topic:team-zero"
                && error.localizedDescription.isEmpty == false
        }
        await #expect(throws: WorkflowError.self) {
            try await project.plan(PlanRequest(targets: try Targets(include: [], exclude: ["group:nobody-*"])))
        }
        await #expect(throws: WorkflowError.self) {
            try await ImportWorkflow(project.parts).run(targets: try Targets(include: ["nothing-like-it"], exclude: []))
        }
        // A selector that matches a topic state remembers (no longer declared) is fine.
        #expect(
            try await project.plan(PlanRequest(targets: try Targets(include: ["group:fam*"], exclude: []))).plan
                .hasChanges)
    }

    @Test func driftWithoutStateHasNothingToCompare() async throws {
        let project = try Project()
        await #expect { try await DriftWorkflow(project.parts).run() } throws: { error in
            guard (error as? WorkflowError)?.reason == "no_state" else { return false }
            return "\(error)".contains("nothing to compare")
        }
    }

    @Test func stateOfAnotherProjectOrBackendIsRefused() async throws {
        let project = try Project()
        _ = try await project.apply()
        #expect(try await project.store.load()?.backend == project.backend.identity)
        let (other, _) = try InMemoryBackend.make(project: "someone-else", autoRegister: true)
        var parts = project.parts
        parts.backend = other
        await #expect { try await PlanWorkflow(parts).run(PlanRequest(refresh: false)) } throws: { error in
            guard let (state, now) = (error as? WorkflowError)?.backends else { return false }
            return state.project == "tidemark-test" && now.project == "someone-else"
        }
        await #expect(throws: WorkflowError.self) { try await ApplyWorkflow(parts).run(ApplyRequest()) }
    }

    @Test func manifestsInSubdirectoriesAreRead() async throws {
        var project = try Project(topics: "topics: []\n")
        project.files["regions/north/weather.yaml"] = "topics:\n  - name: north\n    members: [{devices: [d1]}]\n"
        project.files[".hidden/ignored.yaml"] = "topics:\n  - name: hidden\n    members: [{devices: [d1]}]\n"
        let plan = try await project.plan().plan
        #expect(plan.topics.map(\.topic) == ["north"])
    }

    @Test func anEditedSavedPlanIsNamedAsSuch() async throws {
        let project = try Project()
        let plan = try await project.plan().plan
        #expect(plan.requests == plan.operations.count, "the in-memory engine takes one call per operation")
        let data = try Plan.encoder().encode(plan)
        #expect(try Plan.decodeSaved(data, file: "plan.json").operationsDigest == plan.operationsDigest)
        var edited = plan
        edited.operations[0].tokens.append(Fixtures.token(99))
        do {
            _ = try Plan.decodeSaved(try Plan.encoder().encode(edited), file: "plan.json")
            Issue.record("an edited plan was read as reviewed")
        } catch let error as SavedPlanError {
            #expect(error.description.contains("plan.json was edited or damaged"))
        }
    }

    /// A saved plan that carries each change as its own operation (a million one-token operations, with
    /// a digest recomputed to match) is read as the plan tidemark would have written: one operation per
    /// topic and kind, each token once, so it costs what the same plan made fresh costs, and it applies
    /// the same changes.
    @Test func aSavedPlanOfOneTokenOperationsIsReadAsTidemarksOwn() async throws {
        let project = try Project()
        let plan = try await project.plan().plan
        var split = plan
        split.operations = plan.operations.flatMap { op in
            op.kind.isGroup ? [op] : op.tokens.map { PlannedOperation(kind: op.kind, target: op.target, tokens: [$0]) }
        }
        // One token named twice: sent once.
        if let first = split.operations.first(where: { !$0.kind.isGroup }) { split.operations.append(first) }
        split.operationsDigestWhenMade = split.operationsDigest
        #expect(split.operations.count > plan.operations.count)
        let read = try Plan.decodeSaved(try Plan.encoder().encode(split), file: "plan.json")
        #expect(read.operations == plan.operations, "merged back into the planner's own shape, in its order")
        #expect(read.operationsDigest == plan.operationsDigest)
        // A plan tidemark wrote is read unchanged.
        #expect(try Plan.decodeSaved(try Plan.encoder().encode(plan), file: "plan.json").operations == plan.operations)
        let outcome = try await project.apply(project.saved(read))
        guard case .applied(let summary) = outcome.result else {
            Issue.record("expected an apply, got \(outcome.result)")
            return
        }
        #expect(summary.subscribed == 3 + 6 && summary.failures.isEmpty)
        #expect(!(try await project.plan().plan.hasChanges))
        // Past one batch: merged into batches of FCM's 1000 tokens, as the planner makes them, and a
        // plan already in that shape is left as it is.
        let tokens = (0..<2500).map { Fixtures.token($0) }
        let batches = Plan.coalesced(tokens.map { PlannedOperation(kind: .subscribe, target: "big", tokens: [$0]) })
        #expect(batches.map(\.tokens.count) == [1000, 1000, 500] && batches.flatMap(\.tokens) == tokens)
        #expect(Plan.coalesced(batches) == batches)
    }

    /// A saved plan that converts a device group to an audience and makes a new audience applies:
    /// each operation is checked against what its kind acts on (a group call may name an audience
    /// still kept in step with its FCM group).
    @Test func aSavedPlanWithAudiencesApplies() async throws {
        var project = try Project()
        _ = try await project.apply()
        project.files["topics.yaml"] = Self.topics.replacingOccurrences(
            of: "groups:\n  - notification_key_name: family\n    members: [{devices: [d0, d1]}]",
            with:
                "audiences:\n  - name: family\n    members: [{devices: [d0, d1, d2]}]\n  - name: friends\n    members: [{devices: [d3]}]"
        )
        let plan = try await project.plan().plan
        #expect(plan.operations.contains { $0.kind == .groupAdd && $0.target == "family" }, "\(plan.operations)")
        #expect(plan.operations.contains { $0.kind == .audienceSet && $0.target == "friends" })
        let outcome = try await project.apply(project.saved(plan))
        guard case .applied(let summary) = outcome.result else {
            Issue.record("expected an apply, got \(outcome.result)")
            return
        }
        #expect(summary.failures.isEmpty)
        #expect(!(try await project.plan().plan.hasChanges))
    }

    @Test func resumingCanBeDeclined() async throws {
        let project = try Project()
        _ = try await interrupted(project, after: 1)
        let declined = try await project.apply(ApplyRequest(approveResume: { _ in .declined }))
        guard case .declined = declined.result else {
            Issue.record("\(declined.result)")
            return
        }
        #expect(try await project.store.unfinishedApply() != nil, "nothing was resumed or abandoned")
        let plan = try await project.plan().plan
        #expect(plan.diagnostics.contains { $0.message.contains("was interrupted with 1 of") })
    }

    /// An edited plan with a recomputed digest still runs only what the planner would produce now.
    @Test(arguments: ["protected", "retargeted", "injected", "flipped"])
    func anEditedPlanIsRefusedEvenWithAMatchingDigest(_ edit: String) async throws {
        var project = try Project(
            topics: Self.topics.replacingOccurrences(
                of: "  - name: everyone\n", with: "  - name: everyone\n    protect: true\n"))
        _ = try await project.apply()
        project.files["topics.yaml"] = project.files["topics.yaml"]!.replacingOccurrences(
            of: "team: t0}", with: "team: [t0, t1]}")
        var plan = try await project.plan().plan
        #expect(plan.operations.count == 1 && plan.operations[0].kind == .subscribe, "\(plan.operations)")
        switch edit {
        case "protected":
            plan.operations.insert(
                PlannedOperation(kind: .unsubscribe, target: "everyone", tokens: [Fixtures.token(0)]), at: 0)
        case "retargeted":
            plan.operations[0].target = "someone-elses-topic"
        case "flipped":
            // Unsubscribing devices that are not subscribed changes nothing in FCM by itself, but it is
            // the opposite of what the planner calls for: refused by its kind.
            plan.operations[0].kind = .unsubscribe
        default:
            plan.operations[0].tokens.append(Fixtures.token(77))
        }
        plan.operationsDigestWhenMade = plan.operationsDigest
        let subscribers = await project.engine.subscribers(of: "everyone", project: "tidemark-test").count
        let serial = try await project.store.load()?.serial
        // Refused whether the apply reads every registration again or (a recent plan) only those whose
        // changes state does not call for by itself.
        for rereadAfter: Int64? in [nil, 900] {
            var request = project.saved(plan)
            request.rereadAfter = rereadAfter
            request.planning.refresh = .sample
            await #expect { try await project.apply(request) } throws: { error in
                guard let stale = (error as? WorkflowError)?.stalePlan, case .notWhatThePlannerWouldDo = stale.reason
                else {
                    return false
                }
                // A topic or registration nothing here knows is refused before anything is read; an edit
                // within what is known, by comparison with the planner's own operations.
                let unknown = edit == "retargeted" || edit == "injected"
                return stale.description.contains(
                    unknown ? "that neither the" : "which the manifests and state do not call for")
            }
        }
        if edit != "retargeted" && edit != "injected" {
            #expect(
                project.output.events.contains { if case .savedPlanChecked(_, 1..., _) = $0 { true } else { false } },
                "the recent plan's edited change was read again")
        }
        #expect(await project.engine.subscribers(of: "everyone", project: "tidemark-test").count == subscribers)
        #expect(try await project.store.load()?.serial == serial, "nothing was written")
    }

    /// A reviewed plan still applies when a device already did part of it on its own.
    @Test func aPlanStaysValidWhenFCMAlreadyDidPartOfIt() async throws {
        var project = try Project()
        _ = try await project.apply()
        project.files["topics.yaml"] = Self.topics.replacingOccurrences(of: "team: t0}", with: "team: [t0, t1]}")
        let plan = try await project.plan().plan
        let token = try #require(plan.operations.first?.tokens.first)
        _ = try await project.engine.batchAdd(project: "tidemark-test", topic: "team-zero", tokens: [token])
        let outcome = try await project.apply(project.saved(plan))
        guard case .applied = outcome.result else {
            Issue.record("\(outcome.result)")
            return
        }
        #expect(!(try await project.plan().plan.hasChanges))
    }

    /// Killed in the middle of a subscribe batch, then the change is reverted: what the killed apply
    /// made is removed by the next apply, not orphaned.
    @Test func aRevertedChangeAfterAKillLeavesNoOrphans() async throws {
        var project = try Project()
        _ = try await project.apply()
        let reverted = project.files["topics.yaml"]!
        project.files["topics.yaml"] =
            reverted + "\n  - notification_key_name: unused\n    members: [{devices: [d5]}]\n"
        project.files["more.yaml"] = "topics:\n  - name: launch\n    members: [{selector: {team: [t0, t1]}}]\n"
        // The subscribe to 'launch' fails as a whole, after FCM already took three of its tokens.
        _ = try await project.engine.batchAdd(
            project: "tidemark-test", topic: "launch",
            tokens: [Fixtures.token(0), Fixtures.token(1), Fixtures.token(2)])
        project.backend.fail(.subscribe)
        await #expect(throws: ScriptedBackend.Failure.self) { try await project.apply() }
        #expect(try await project.store.unfinishedApply() != nil)
        // The change is reverted before anyone applies again.
        project.files["topics.yaml"] = reverted
        project.files["more.yaml"] = nil
        let outcome = try await project.apply()
        guard case .applied(let summary) = outcome.result else {
            Issue.record("\(outcome.result)")
            return
        }
        #expect(summary.unsubscribed == 3, "the three memberships the killed apply made are removed")
        #expect(await project.engine.subscribers(of: "launch", project: "tidemark-test").isEmpty)
        #expect(try await project.store.applies(limit: 5).map(\.status).contains(.abandoned))
        #expect(!(try await project.plan().plan.hasChanges))
    }

    /// The manifests digest is over what they mean: comments, layout and unused columns keep a saved
    /// plan valid; a no-op apply and an import that adopts nothing leave the serial alone.
    @Test func savedPlansGoStaleOnlyForARealReason() async throws {
        var project = try Project()
        _ = try await project.apply()
        project.files["topics.yaml"] = Self.topics.replacingOccurrences(of: "team: t0}", with: "team: [t0, t1]}")
        let plan = try await project.plan().plan
        let versions = try await project.store.load()?.versions
        // Cosmetic edits: a comment, a file split in two, a column no selector reads.
        project.files["topics.yaml"] = "# reviewed by the mobile team\n" + project.files["topics.yaml"]!
        project.files["inventory.csv"] =
            "device_id,token,team,locale\n"
            + (0..<6).map { "d\($0),\(Fixtures.token($0)),t\($0 % 2),en" }.joined(separator: "\n") + "\n"
        let replanned = try await project.plan(PlanRequest(refresh: false)).plan
        #expect(replanned.manifestsDigest == plan.manifestsDigest, "what the manifests mean did not change")
        // A no-op apply records only when it read each registration (the sweep), and an import that
        // adopts nothing does not write: no topic or group moves, so the saved plan stays valid.
        project.files["topics.yaml"] = Self.topics
        let noop = try await project.apply()
        if case .applied = noop.result { Issue.record("a plan with nothing to do ran an apply") }
        _ = try await ImportWorkflow(project.parts).run()
        #expect(try await project.store.load()?.versions == versions)
        project.files["topics.yaml"] = Self.topics.replacingOccurrences(of: "team: t0}", with: "team: [t0, t1]}")
        let outcome = try await project.apply(project.saved(plan))
        guard case .applied(let summary) = outcome.result else {
            Issue.record("\(outcome.result)")
            return
        }
        #expect(summary.subscribed == 3)
    }

    /// A user who unsubscribes in the app from an additive topic stays unsubscribed (opt_outs: respect,
    /// the default there), shown as opted out; an authoritative topic restores (its default).
    @Test func optOutsAreRespectedOrRestored() async throws {
        let project = try Project()
        _ = try await project.apply()
        let user = Fixtures.token(0)  // in team-zero (additive) and everyone (authoritative)
        _ = try await project.engine.batchRemove(project: "tidemark-test", topic: "team-zero", tokens: [user])
        _ = try await project.engine.batchRemove(project: "tidemark-test", topic: "everyone", tokens: [user])
        let plan = try await project.plan().plan
        let subscribes = plan.operations.filter { $0.kind == .subscribe }
        #expect(
            subscribes.map(\.target) == ["everyone"], "restored in the authoritative topic only: \(plan.operations)")
        #expect(
            plan.topics.first { $0.topic == "team-zero" } == nil
                || plan.topics.first { $0.topic == "team-zero" }!.subscribe == 0)
        let drift = try await DriftWorkflow(project.parts).run()
        #expect(drift.items.map(\.kind).sorted { $0.rawValue < $1.rawValue } == [.dropped, .optedOut])
        _ = try await project.apply()
        #expect(await !project.engine.subscribers(of: "team-zero", project: "tidemark-test").contains(user))
        #expect(await project.engine.subscribers(of: "everyone", project: "tidemark-test").contains(user))
        #expect(try await project.store.load()?.topics["team-zero"]?.optedOut.count == 1, "the opt-out is in state")
        // Only the opt-out is left: no drift, and nothing to do.
        let quiet = try await DriftWorkflow(project.parts).run()
        #expect(!quiet.hasDrift && quiet.exitStatus(detailedExitcode: true) == .success)
        #expect(!(try await project.plan().plan.hasChanges))
        // The device subscribes itself again: the opt-out ends, and a later self-unsubscribe is one again.
        _ = try await project.engine.batchAdd(project: "tidemark-test", topic: "team-zero", tokens: [user])
        _ = try await project.apply()
        #expect(try await project.store.load()?.topics["team-zero"]?.optedOut.isEmpty == true)
    }

    @Test func optOutsCanBeRestoredOnAdditiveTopics() async throws {
        let project = try Project(
            topics: Self.topics.replacingOccurrences(
                of: "  - name: team-zero\n", with: "  - name: team-zero\n    opt_outs: restore\n"))
        _ = try await project.apply()
        _ = try await project.engine.batchRemove(
            project: "tidemark-test", topic: "team-zero", tokens: [Fixtures.token(0)])
        let plan = try await project.plan().plan
        #expect(plan.operations.contains { $0.kind == .subscribe && $0.target == "team-zero" })
        let drift = try await DriftWorkflow(project.parts).run()
        #expect(drift.items.map(\.kind) == [.dropped] && drift.hasDrift)
    }

    /// Two pull requests: the second's plan was saved before the first merged and applied. It touches
    /// other topics, so it still applies; one that touches what the first changed is refused, naming it.
    @Test func aPlanSurvivesAnUnrelatedApply() async throws {
        var project = try Project()
        _ = try await project.apply()
        let base = project.files["topics.yaml"]!
        // PR 2, planned on main: a new topic.
        project.files["launch.yaml"] = "topics:\n  - name: launch\n    members: [{devices: [d1, d2]}]\n"
        let second = try await project.plan().plan
        let clashing = try await project.plan(PlanRequest(targets: try Targets(include: ["topic:launch"], exclude: [])))
            .plan
        // PR 1 merges and applies first: team-zero gains the t1 devices.
        project.files["launch.yaml"] = nil
        project.files["topics.yaml"] = base.replacingOccurrences(of: "team: t0}", with: "team: [t0, t1]}")
        _ = try await project.apply()
        // PR 2 merges: main now has both changes; its saved plan is applied.
        project.files["launch.yaml"] = "topics:\n  - name: launch\n    members: [{devices: [d1, d2]}]\n"
        let outcome = try await project.apply(project.saved(second))
        guard case .applied(let summary) = outcome.result else {
            Issue.record("\(outcome.result)")
            return
        }
        #expect(summary.subscribed == 2)
        #expect(!(try await project.plan().plan.hasChanges))
        // A plan touching what changed since is refused with the precise reason.
        project.files["launch.yaml"] = "topics:\n  - name: launch\n    members: [{devices: [d1, d3]}]\n"
        await #expect { try await project.apply(project.saved(clashing)) } throws: { error in
            guard let stale = (error as? WorkflowError)?.stalePlan else { return false }
            return "\(stale)".contains("topic:launch")
        }
    }
}

/// A saved plan refused because the inventory moved says which source changed and which tokens went.
@Suite struct StaleInventoryTests {
    @Test func theRefusalNamesTheSourceAndTheTokens() async throws {
        var project = try WorkflowTests.Project()
        _ = try await project.apply()
        // d6 joins; the plan subscribes it. Then its token rotates before the plan is applied.
        project.files["inventory.csv"] = WorkflowTests.inventory + "d6,\(Fixtures.token(6)),t0\n"
        let plan = try await project.plan().plan
        #expect(plan.inventory?.map(\.source) == ["inventory.csv"])
        project.files["inventory.csv"] = WorkflowTests.inventory + "d6,\(Fixtures.token(66)),t0\n"
        do {
            _ = try await project.apply(project.saved(plan))
            Issue.record("a plan whose inventory moved was applied")
        } catch let error as WorkflowError where error.stalePlan != nil {
            let stale = error.stalePlan!
            let text = stale.description
            #expect(text.contains("inventory 'inventory.csv' changed"), "\(text)")
            #expect(text.contains("1 token it adds is no longer declared"), "\(text)")
            #expect(text.contains(Redaction.redact(Fixtures.token(6))), "\(text)")
        }
    }
}
