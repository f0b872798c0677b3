import Foundation
import Testing
import TidemarkCore
import TidemarkTesting

@testable import TidemarkServe

/// The workspace state machine, fed events and times by hand: every transition docs/serve.md
/// describes (schedule, failures and their backoff, batches of changes, requests, suspend and resume,
/// blocked, standby, takeover, handover, a store that cannot be reached, stopping), without I/O.
struct WorkspaceMachineTests {
    static let epoch = Date(timeIntervalSince1970: 1_800_000_000)

    /// A machine for replica `r1`: claims of 30 s read every 2 s, an interval of 10 minutes, retries
    /// after 30 s, no jitter.
    func machine(
        watches: Bool = false, suspend: Bool = false, resync: Duration? = nil, replica: String = "r1",
        configure: (inout ServeSettings) -> Void = { _ in }
    ) -> WorkspaceMachine {
        var settings = ServeSettings()
        settings.interval = .seconds(600)
        settings.retryInterval = .seconds(30)
        settings.jitter = .zero
        settings.suspend = suspend
        configure(&settings)
        let status = WorkspaceStatus(
            phase: suspend ? .suspended : .pending, ready: false, workspace: "prod", state: "state.db",
            manifests: "manifests", backend: "embedded", settings: [:], suspended: suspend, replica: "-")
        return WorkspaceMachine(
            config: .init(
                replica: replica, claim: .seconds(30), poll: .seconds(2), settings: settings, resync: resync,
                watches: watches, watchWait: .seconds(5), grace: .seconds(10)),
            status: status)
    }

    func at(_ seconds: Int) -> WorkspaceMachine.Moment {
        .init(now: .seconds(seconds), wall: Self.epoch.addingTimeInterval(Double(seconds)))
    }

    func record(
        owner: String?, suspended: Bool = false, requested: Date? = nil, status: WorkspaceStatus? = nil,
        fence: Int64 = 1
    ) -> ServeRecord {
        var record = ServeRecord(workspace: "prod")
        record.owner = owner
        record.ownerFence = fence
        record.suspended = suspended
        record.suspendedBy = suspended ? "ana@laptop" : nil
        record.reconcileRequestedAt = requested
        record.reconcileRequestedBy = requested.map { _ in "ana@laptop" }
        record.status = status.flatMap { try? WorkspaceStatus.encoder.encode($0) }
        return record
    }

    func result(
        _ outcome: ReconcileResult.Outcome, at seconds: Int, took: Double = 1, changed: Int? = nil
    ) -> ReconcileResult {
        var result = ReconcileResult(
            outcome: outcome, startedAt: Self.epoch.addingTimeInterval(Double(seconds) - took), seconds: took)
        result.changedDevices = changed
        if outcome == .blocked { result.reason = "max_unsubscribes" }
        if outcome == .failure { result.reason = "fcm_failed" }
        return result
    }

    func reconciles(_ effects: [WorkspaceMachine.Effect]) -> [(whole: Bool, takeChanges: Bool)] {
        windowed(effects).map { ($0.whole, $0.takeChanges) }
    }

    func windowed(_ effects: [WorkspaceMachine.Effect]) -> [(whole: Bool, takeChanges: Bool, window: SyncWindow)] {
        effects.compactMap { effect in
            if case .reconcile(let whole, let take, let window) = effect { return (whole, take, window) }
            return nil
        }
    }

    func logs(_ effects: [WorkspaceMachine.Effect]) -> [String] {
        effects.compactMap { effect in
            if case .log(let line, _) = effect { return line }
            return nil
        }
    }

    /// A timer at `seconds` and the record read it asked for: the effects of both.
    func poll(
        _ machine: inout WorkspaceMachine, _ record: ServeRecord, at seconds: Int, claimed: Bool = true
    )
        -> [WorkspaceMachine.Effect]
    {
        machine.handle(.tick, at: at(seconds)) + machine.handle(.record(record, claimed: claimed), at: at(seconds))
    }

    /// Owned at `seconds` and through its first reconcile, which succeeds at `seconds + 1`.
    func owned(_ machine: inout WorkspaceMachine, at seconds: Int = 0) {
        _ = machine.handle(.tick, at: at(seconds))
        _ = machine.handle(.record(record(owner: "r1"), claimed: true), at: at(seconds))
        _ = machine.handle(.reconciled(result(.success, at: seconds + 1), shuttingDown: false), at: at(seconds + 1))
    }

    @Test func theFirstOwnerReconcilesAtOnceThenOnItsIntervalReadingTheRecordEveryPoll() {
        var machine = machine()
        #expect(machine.handle(.tick, at: at(0)) == [.readRecord(claim: true)])
        #expect(machine.wakeAt() == nil, "nothing to wake for while the read is out")
        let took = machine.handle(.record(record(owner: "r1"), claimed: true), at: at(0))
        #expect(took.first == .lead(true) && took.contains(.forgetPublished))
        #expect(logs(took).contains { $0.contains("owned by this replica (r1, claim 1); reconciling now") })
        #expect(reconciles(took).map(\.whole) == [true])
        #expect(machine.status.phase == .reconciling && machine.owned && machine.reconciling)
        // During a reconcile only the claim is renewed, every third of it.
        #expect(machine.wakeAt() == .seconds(10))
        #expect(machine.handle(.tick, at: at(10)) == [.readRecord(claim: true)])
        #expect(machine.handle(.record(record(owner: "r1"), claimed: true), at: at(10)).isEmpty)

        let ended = machine.handle(.reconciled(result(.success, at: 12), shuttingDown: false), at: at(12))
        #expect(ended.first == .measure(result(.success, at: 12)))
        #expect(ended.contains(.notify(result(.success, at: 12))) && ended.contains(.publish))
        #expect(
            logs(ended).contains {
                $0.hasPrefix("reconcile workspace=prod result=success") && $0.contains("next_in=10m")
            })
        #expect(ended.last == .readRecord(claim: false), "the record read is due: the last was at 10 s")
        #expect(machine.status.phase == .ready && machine.status.ready && machine.status.lastSuccessAt != nil)
        #expect(machine.status.nextRunAt == Self.epoch.addingTimeInterval(612))
        #expect(machine.wakeAt() == .seconds(612), "while the read is out, only the schedule")

        // Between reconciles: a read every poll, a renewal every third of the claim, nothing else.
        #expect(machine.handle(.record(record(owner: "r1"), claimed: false), at: at(12)).isEmpty)
        #expect(machine.wakeAt() == .seconds(14))
        #expect(machine.handle(.tick, at: at(20)) == [.readRecord(claim: true)])
        #expect(machine.handle(.record(record(owner: "r1"), claimed: true), at: at(20)).isEmpty)
        #expect(machine.wakeAt() == .seconds(22))
        // Due at 612 s: a whole reconcile.
        let due = poll(&machine, record(owner: "r1"), at: 612)
        #expect(reconciles(due).map(\.whole) == [true])
    }

    @Test func aFailureRetriesAfterRetryIntervalDoublingAndChangesWaitForTheRetry() {
        var machine = machine()
        _ = machine.handle(.tick, at: at(0))
        _ = machine.handle(.record(record(owner: "r1"), claimed: true), at: at(0))
        _ = machine.handle(.reconciled(result(.failure, at: 1), shuttingDown: false), at: at(1))
        #expect(machine.status.phase == .failing && !machine.status.ready && machine.status.consecutiveFailures == 1)
        #expect(machine.status.nextRunAt == Self.epoch.addingTimeInterval(31))
        // A change while it waits to retry does not start a reconcile: the retry reads it.
        let woke = machine.handle(.changed(pending: true, devices: 3), at: at(5))
        #expect(reconciles(woke).isEmpty && woke == [.readRecord(claim: false)])
        #expect(machine.status.inventoryChangesWaiting == 3)
        #expect(reconciles(machine.handle(.record(record(owner: "r1"), claimed: false), at: at(5))).isEmpty)
        #expect(machine.wakeAt() == .seconds(7), "the next read")
        let retry = poll(&machine, record(owner: "r1"), at: 31)
        #expect(reconciles(retry).count == 1 && reconciles(retry).first! == (true, true))
        // The runner took the changes into the retry.
        _ = machine.handle(.changed(pending: false, devices: 0), at: at(31))
        _ = machine.handle(.reconciled(result(.failure, at: 32), shuttingDown: false), at: at(32))
        #expect(machine.status.consecutiveFailures == 2)
        #expect(machine.status.nextRunAt == Self.epoch.addingTimeInterval(92), "60 s: doubled")
        #expect(reconciles(poll(&machine, record(owner: "r1"), at: 92)).count == 1)
        _ = machine.handle(.reconciled(result(.success, at: 93), shuttingDown: false), at: at(93))
        #expect(machine.status.consecutiveFailures == 0 && machine.status.phase == .ready)
        #expect(machine.status.nextRunAt == Self.epoch.addingTimeInterval(693), "back to the interval")
    }

    @Test func aChangeStartsABatchAtOnceThatLeavesTheScheduleAsItWas() {
        var machine = machine(resync: .seconds(300))
        owned(&machine)
        #expect(
            machine.status.nextRunAt == Self.epoch.addingTimeInterval(301), "the resync is sooner than the interval")
        let woke = machine.handle(.changed(pending: true, devices: 2), at: at(10))
        #expect(reconciles(woke).count == 1 && reconciles(woke)[0] == (false, true))
        #expect(machine.status.phase == .reconciling)
        // The runner took the changes: none left.
        _ = machine.handle(.changed(pending: false, devices: 0), at: at(10))
        let ended = machine.handle(
            .reconciled(result(.success, at: 11, changed: 2), shuttingDown: false), at: at(11))
        #expect(reconciles(ended).isEmpty)
        #expect(
            machine.status.nextRunAt == Self.epoch.addingTimeInterval(301), "a batch leaves the resync where it was")
        #expect(logs(ended).contains { $0.contains("next_in=4m50s") })
        // Changes that came during a reconcile start the next batch as soon as it ends.
        _ = machine.handle(.changed(pending: true, devices: 1), at: at(20))
        _ = machine.handle(.changed(pending: false, devices: 0), at: at(20))
        _ = machine.handle(.changed(pending: true, devices: 4), at: at(20))
        let next = machine.handle(.reconciled(result(.success, at: 21, changed: 1), shuttingDown: false), at: at(21))
        #expect(reconciles(next).count == 1 && reconciles(next)[0] == (false, true))
    }

    @Test func aRequestReconcilesWholeAtOnceAndOnlyOnce() {
        var machine = machine()
        owned(&machine)
        let asked = Self.epoch.addingTimeInterval(5)
        _ = machine.handle(.tick, at: at(6))
        let first = machine.handle(.record(record(owner: "r1", requested: asked), claimed: false), at: at(6))
        #expect(logs(first).contains("workspace=prod reconcile requested by ana@laptop"))
        #expect(reconciles(first).map(\.whole) == [false], "not due: the request reconciles what changed")
        #expect(machine.status.reconcileRequestedAt == asked && machine.status.reconcileRequestedBy == "ana@laptop")
        _ = machine.handle(.reconciled(result(.success, at: 7), shuttingDown: false), at: at(7))
        _ = machine.handle(.tick, at: at(9))
        let again = machine.handle(.record(record(owner: "r1", requested: asked), claimed: false), at: at(9))
        #expect(reconciles(again).isEmpty, "a request is served once")
    }

    @Test func suspendHoldsEverythingAndResumeReconcilesAtOnceWhenChangesWereDropped() {
        var machine = machine()
        owned(&machine)
        _ = machine.handle(.tick, at: at(4))
        let suspended = machine.handle(.record(record(owner: "r1", suspended: true), claimed: false), at: at(4))
        #expect(suspended.contains(.suspended(true)))
        #expect(logs(suspended).contains("workspace=prod suspended by ana@laptop"))
        #expect(machine.status.phase == .suspended && machine.status.suspended && machine.status.nextRunAt == nil)
        #expect(reconciles(machine.handle(.changed(pending: true, devices: 1), at: at(5))).isEmpty)
        _ = machine.handle(.tick, at: at(6))
        let dropped = machine.handle(.record(record(owner: "r1", suspended: true), claimed: false), at: at(6))
        #expect(dropped.contains(.dropChanges))
        _ = machine.handle(.changed(pending: false, devices: 0), at: at(6))
        #expect(machine.wakeAt() == .seconds(8), "suspended, only the record reads wake it")
        _ = machine.handle(.tick, at: at(8))
        let resumed = machine.handle(.record(record(owner: "r1"), claimed: false), at: at(8))
        #expect(resumed.contains(.suspended(false)) && logs(resumed).contains("workspace=prod resumed"))
        #expect(reconciles(resumed).map(\.whole) == [true], "changes were dropped while suspended: reconcile now")

        // Suspended and resumed with nothing dropped: the phase the last reconcile left, on schedule.
        var quiet = self.machine()
        owned(&quiet)
        _ = quiet.handle(.tick, at: at(4))
        _ = quiet.handle(.record(record(owner: "r1", suspended: true), claimed: false), at: at(4))
        _ = quiet.handle(.tick, at: at(6))
        let back = quiet.handle(.record(record(owner: "r1"), claimed: false), at: at(6))
        #expect(reconciles(back).isEmpty && quiet.status.phase == .ready && back.contains(.publish))

        // `suspend: true` in tidemark.yaml holds it from the start.
        var configured = self.machine(suspend: true)
        _ = configured.handle(.tick, at: at(0))
        let held = configured.handle(.record(record(owner: "r1"), claimed: true), at: at(0))
        #expect(reconciles(held).isEmpty && configured.status.phase == .suspended)
    }

    @Test func aBlockedPlanWaitsForTheIntervalAndSaysBlocked() {
        var machine = machine()
        _ = machine.handle(.tick, at: at(0))
        _ = machine.handle(.record(record(owner: "r1"), claimed: true), at: at(0))
        _ = machine.handle(.reconciled(result(.blocked, at: 1), shuttingDown: false), at: at(1))
        #expect(machine.status.phase == .blocked && !machine.status.ready && machine.status.consecutiveFailures == 0)
        #expect(machine.status.nextRunAt == Self.epoch.addingTimeInterval(601))
    }

    @Test func anotherOwnerMeansStandbyAndItsEndATakeoverThatReconcilesAtOnce() {
        var machine = machine()
        _ = machine.handle(.tick, at: at(0))
        let standby = machine.handle(.record(record(owner: "r2"), claimed: true), at: at(0))
        #expect(
            standby == [
                .log(
                    "workspace=prod standby: replica r2 owns it; this replica takes it over when that one stops renewing its claim"
                ), .lead(false),
            ])
        #expect(machine.status.phase == .standby && machine.status.replica == "r2" && !machine.owned)
        #expect(machine.wakeAt() == .seconds(2), "a standby wakes for its reads only")
        _ = machine.handle(.tick, at: at(2))
        #expect(machine.handle(.record(record(owner: "r2"), claimed: false), at: at(2)) == [.lead(false)], "said once")
        _ = machine.handle(.tick, at: at(4))
        let free = machine.handle(.record(record(owner: nil), claimed: false), at: at(4))
        #expect(
            logs(free) == [
                "workspace=prod standby: free, left to a replica that owns fewer workspaces; this replica takes it if none has within 10s"
            ])
        _ = machine.handle(.tick, at: at(10))
        let takeover = machine.handle(.record(record(owner: "r1", fence: 2), claimed: true), at: at(10))
        #expect(logs(takeover).contains("workspace=prod owned by this replica (r1, claim 2); reconciling now"))
        #expect(reconciles(takeover).map(\.whole) == [true] && machine.status.replica == "r1")
    }

    /// A handover: the owner gives the workspace up between reconciles, with a status naming the new
    /// owner; the new owner reconciles it whole at once, once its watches have their starting point, so
    /// a manifest edited or a device inserted while the workspace changed hands is not passed over.
    @Test func aHandoverGoesBetweenReconcilesAndTheNewOwnerReconcilesOnceItsWatchesAreSet() throws {
        var a = machine(watches: true)
        _ = a.handle(.tick, at: at(0))
        _ = a.handle(.record(record(owner: "r1"), claimed: true), at: at(0))
        #expect(reconciles(a.handle(.watching, at: at(1))).map(\.whole) == [true])
        #expect(!a.mayHandOver(record(owner: "r1")), "never during a reconcile")
        _ = a.handle(.reconciled(result(.success, at: 2), shuttingDown: false), at: at(2))
        #expect(a.mayHandOver(record(owner: "r1")))
        _ = a.handle(.tick, at: at(4))
        let handOver = WorkspaceMachine.HandOver(to: "r2", mine: 3, theirs: 1)
        let gave = a.handle(.record(record(owner: "r1"), claimed: false, handOver: handOver), at: at(4))
        guard case .handOver(let given, let published) = try #require(gave.first) else {
            Issue.record("the first effect publishes and gives the claim up: \(gave)")
            return
        }
        #expect(given == handOver && published.handedOverTo == "r2" && published.phase == .ready)
        #expect(gave.contains(.lead(false)) && a.status.phase == .standby && !a.owned)
        #expect(
            logs(gave).contains {
                $0.contains("handed over to spread the workspaces: this replica owned 3, replica r2 owns 1")
            })

        var b = machine(watches: true, replica: "r2")
        _ = b.handle(.tick, at: at(5))
        let took = b.handle(.record(record(owner: "r2", status: published, fence: 2), claimed: true), at: at(5))
        #expect(
            logs(took).contains {
                $0.contains(
                    "handed over to this replica (r2, claim 2) by replica r1; reconciling now (once its watches have their starting point)"
                )
            })
        #expect(reconciles(took).isEmpty, "its watches have no starting point yet")
        #expect(b.status.phase == .ready && b.status.last != nil, "what the status said goes on")
        #expect(b.wakeAt() == .seconds(7), "the next read comes before the watches' deadline at 10 s")
        let set = b.handle(.watching, at: at(6))
        #expect(reconciles(set).map(\.whole) == [true])
    }

    /// Watches that have no starting point within `watchWait` do not hold the first reconcile; once they
    /// do, another whole reconcile reads what changed before them.
    @Test func lateWatchesDoNotHoldTheFirstReconcileAndAreCaughtUpWith() {
        var machine = machine(watches: true)
        _ = machine.handle(.tick, at: at(0))
        _ = machine.handle(.record(record(owner: "r1"), claimed: true), at: at(0))
        _ = machine.handle(.tick, at: at(2))
        #expect(reconciles(machine.handle(.record(record(owner: "r1"), claimed: false), at: at(2))).isEmpty)
        _ = machine.handle(.tick, at: at(4))
        _ = machine.handle(.record(record(owner: "r1"), claimed: false), at: at(4))
        #expect(machine.wakeAt() == .seconds(5))
        let late = machine.handle(.tick, at: at(5))
        #expect(reconciles(late).map(\.whole) == [true])
        #expect(logs(late).contains { $0.contains("its watches did not have their starting point within 5s") })
        #expect(reconciles(machine.handle(.watching, at: at(6))).isEmpty, "not during the reconcile")
        let ended = machine.handle(.reconciled(result(.success, at: 8), shuttingDown: false), at: at(8))
        #expect(reconciles(ended).map(\.whole) == [true], "caught up with, whole")
        let again = machine.handle(.reconciled(result(.success, at: 9), shuttingDown: false), at: at(9))
        #expect(reconciles(again).isEmpty)
    }

    @Test func aStoreThatCannotBeReachedIsFailingNotOwnedAndSaidOnce() {
        var machine = machine()
        owned(&machine)
        _ = machine.handle(.tick, at: at(3))
        let failed = machine.handle(.recordFailed("connection refused"), at: at(3))
        #expect(failed.contains(.lead(false)))
        #expect(logs(failed) == ["workspace=prod cannot claim the workspace in its state store: connection refused"])
        #expect(machine.status.phase == .failing && !machine.status.ready && !machine.owned)
        _ = machine.handle(.tick, at: at(5))
        #expect(logs(machine.handle(.recordFailed("connection refused"), at: at(5))).isEmpty, "said once")
        _ = machine.handle(.tick, at: at(7))
        let back = machine.handle(.record(record(owner: "r1"), claimed: true), at: at(7))
        #expect(reconciles(back).map(\.whole) == [true], "owned again: reconciled at once")
    }

    @Test func aStopWaitsForTheReconcileInFlightThenGivesTheClaimUp() {
        var machine = machine()
        _ = machine.handle(.tick, at: at(0))
        _ = machine.handle(.record(record(owner: "r1"), claimed: true), at: at(0))
        #expect(machine.handle(.stop, at: at(1)).isEmpty && !machine.finished)
        #expect(machine.wakeAt() == .seconds(10), "the claim is still renewed until the reconcile ends")
        let stopped = machine.handle(.reconciled(result(.failure, at: 2), shuttingDown: true), at: at(2))
        #expect(logs(stopped).contains { $0.contains("stopped by the shutdown: what finished is journaled") })
        #expect(Array(stopped.suffix(3)) == [.publish, .release(owned: true), .lead(false)])
        #expect(machine.finished && machine.status.phase == .stopped && machine.wakeAt() == nil)
        #expect(machine.handle(.tick, at: at(3)).isEmpty)

        // A standby that stops gives its presence up.
        var standby = self.machine()
        _ = standby.handle(.tick, at: at(0))
        _ = standby.handle(.record(record(owner: "r2"), claimed: true), at: at(0))
        #expect(standby.handle(.stop, at: at(1)) == [.release(owned: false)])
    }

    @Test func theJitterIsDrawnFromTheMoment() {
        var settings = ServeSettings()
        settings.interval = .seconds(600)
        settings.jitter = .seconds(10)
        var machine = WorkspaceMachine(
            config: .init(replica: "r1", claim: .seconds(30), poll: .seconds(2), settings: settings),
            status: self.machine().status)
        _ = machine.handle(.tick, at: at(0))
        _ = machine.handle(.record(record(owner: "r1"), claimed: true), at: at(0))
        var moment = at(1)
        moment.draw = 2_500
        _ = machine.handle(.reconciled(result(.success, at: 1), shuttingDown: false), at: moment)
        #expect(machine.status.nextRunAt == Self.epoch.addingTimeInterval(603.5))
    }

    @Test func outsideTheSyncWindowsChangesArePlannedWholeAndAppliedWhenAWindowOpens() throws {
        // A deny window from 08:00 UTC (the epoch) for 5 minutes.
        let freeze = ServeWindow(
            kind: .deny, schedule: try CronSchedule(parsing: "0 8 * * *"), duration: .seconds(300),
            timeZone: TimeZone(identifier: "UTC")!, location: SourceLocation(file: "tidemark.yaml", line: 3, column: 7))
        var machine = machine { $0.windows = [freeze] }
        _ = machine.handle(.tick, at: at(0))
        let first = windowed(machine.handle(.record(record(owner: "r1"), claimed: true), at: at(0)))
        let opens = Self.epoch.addingTimeInterval(300)
        #expect(first.count == 1 && first[0].whole && first[0].window == .closed(opensAt: opens))
        var planned = result(.success, at: 1)
        planned.windowClosed = true
        planned.windowOpensAt = opens
        planned.changesWaiting = 2
        _ = machine.handle(.reconciled(planned, shuttingDown: false), at: at(1))
        // What waits is applied once the window lets it through, not at the interval (10 minutes).
        #expect(machine.status.nextRunAt == opens.addingTimeInterval(1))
        // A change while closed is planned with the whole inventory, never in a batch.
        let changed = windowed(machine.handle(.changed(pending: true, devices: 1), at: at(100)))
        #expect(changed.count == 1 && changed[0].whole && changed[0].window == .closed(opensAt: opens))
        _ = machine.handle(.changed(pending: false, devices: 0), at: at(100))
        _ = machine.handle(.reconciled(planned, shuttingDown: false), at: at(101))
        #expect(machine.status.nextRunAt == opens.addingTimeInterval(1))
        // Open: a whole reconcile that applies.
        let due = windowed(poll(&machine, record(owner: "r1"), at: 301))
        #expect(due.count == 1 && due[0].whole && due[0].window == .open)
        _ = machine.handle(.reconciled(result(.success, at: 302), shuttingDown: false), at: at(302))
        #expect(machine.status.nextRunAt == Self.epoch.addingTimeInterval(902), "back on the interval")
        // Open, a change is a batch again.
        let batch = windowed(machine.handle(.changed(pending: true, devices: 1), at: at(310)))
        #expect(machine.status.phase == .reconciling)
        #expect(batch.count == 1 && !batch[0].whole && batch[0].window == .open)
    }

    @Test func withOnChangePlanChangesArePlannedWhole() {
        var machine = machine { $0.onChange = .plan }
        owned(&machine)
        let changed = windowed(machine.handle(.changed(pending: true, devices: 1), at: at(5)))
        #expect(changed.count == 1 && changed[0].whole && changed[0].window == .open)
        _ = machine.handle(.changed(pending: false, devices: 0), at: at(5))
        // Nothing waits for a window: the schedule stays the interval.
        var planned = result(.success, at: 6)
        planned.changesWaiting = 1
        _ = machine.handle(.reconciled(planned, shuttingDown: false), at: at(6))
        #expect(machine.status.nextRunAt == Self.epoch.addingTimeInterval(606))
    }

    @Test func aReconcileIsLoggedAtItsLevelAndAClaimThatFailsIsAWarning() {
        func level(_ outcome: ReconcileResult.Outcome) -> ServeLog.Level? {
            var owner = self.machine()
            _ = owner.handle(.tick, at: at(0))
            _ = owner.handle(.record(record(owner: "r1"), claimed: true), at: at(0))
            let ended = owner.handle(.reconciled(result(outcome, at: 1), shuttingDown: false), at: at(1))
            return ended.compactMap { effect -> ServeLog.Level? in
                if case .log(let line, let level) = effect, line.hasPrefix("reconcile ") { return level }
                return nil
            }.first
        }
        #expect(level(.success) == .info && level(.blocked) == .warning && level(.failure) == .error)
        var machine = machine()
        _ = machine.handle(.tick, at: at(0))
        let failed = machine.handle(.recordFailed("connection refused"), at: at(0))
        #expect(
            failed.contains(
                .log(
                    "workspace=prod cannot claim the workspace in its state store: connection refused", level: .warning)
            ))
    }

    @Test func fcmFailingEveryRequestForDegradedAfterIsDegradedNotReadyUntilItAnswers() {
        var machine = machine()
        owned(&machine)
        // The next reconcile, at 601 s, meets FCM answering 503 to everything from 605 s.
        let started = poll(&machine, record(owner: "r1"), at: 601)
        #expect(reconciles(started).count == 1 && machine.status.ready, "ready stays what the last reconcile left")
        #expect(machine.reconcileStarted == .seconds(601))
        #expect(machine.status.reconcileStartedAt == Self.epoch.addingTimeInterval(601))
        var snapshot = ReconcileWatch.Snapshot(started: .seconds(601))
        snapshot.retryingSince = .seconds(605)
        snapshot.answer = "HTTP 503 (UNAVAILABLE)"
        // 50 s of retries: not yet; 54 s into the reconcile, its first progress line.
        let early = logs(machine.handle(.progress(snapshot), at: at(655)))
        #expect(machine.status.phase == .reconciling && machine.status.ready)
        #expect(
            early == [
                "workspace=prod reconcile in progress for 54s: planning (reading the manifests, the inventory and state)"
            ])
        // A snapshot of another reconcile is ignored.
        var stale = snapshot
        stale.started = .seconds(1)
        stale.retryingSince = .seconds(1)
        _ = machine.handle(.progress(stale), at: at(656))
        #expect(machine.status.phase == .reconciling)
        // 60 s: degraded, not ready, said once at warning with what FCM answers and since when.
        let degraded = machine.handle(.progress(snapshot), at: at(665))
        #expect(machine.status.phase == .degraded && !machine.status.ready)
        #expect(
            machine.status.fcmTrouble
                == WorkspaceStatus.FCMTrouble(
                    answer: "HTTP 503 (UNAVAILABLE)", since: Self.epoch.addingTimeInterval(605)))
        #expect(degraded.contains(.publish))
        #expect(
            degraded.contains {
                if case .log(let line, .warning) = $0 {
                    return line.contains("workspace=prod degraded: every request to FCM has failed for 1m")
                        && line.contains("HTTP 503 (UNAVAILABLE)")
                }
                return false
            })
        #expect(logs(machine.handle(.progress(snapshot), at: at(670))).allSatisfy { !$0.contains("degraded") })
        // FCM answers again: reconciling, ready as the last reconcile left it.
        var answering = ReconcileWatch.Snapshot(started: .seconds(601))
        answering.step = "applying"
        answering.done = 500
        answering.total = 2000
        answering.etaSeconds = 90
        let back = machine.handle(.progress(answering), at: at(690))
        #expect(machine.status.phase == .reconciling && machine.status.ready && machine.status.fcmTrouble == nil)
        #expect(logs(back).contains { $0.contains("workspace=prod FCM answers again after 1m25s") })
        // Every 30 s a progress line with a count and an ETA, in the status too.
        #expect(
            logs(back).contains {
                $0.contains(
                    "reconcile in progress for 1m29s: applying, 500 of 2,000 token changes (25%), about 1m30s left")
            })
        #expect(machine.status.progress?.done == 500 && machine.status.progress?.etaSeconds == 90)
        #expect(logs(machine.handle(.progress(answering), at: at(695))).isEmpty, "not again within 30 s")
        // The end clears the progress; a failure keeps what FCM answered, a success clears it.
        _ = machine.handle(.progress(snapshot), at: at(745))
        _ = machine.handle(.reconciled(result(.failure, at: 900), shuttingDown: false), at: at(900))
        #expect(machine.status.phase == .failing && machine.status.fcmTrouble != nil)
        #expect(
            machine.status.progress == nil && machine.status.reconcileStartedAt == nil
                && machine.reconcileStarted == nil)
        _ = poll(&machine, record(owner: "r1"), at: 930)
        _ = machine.handle(.reconciled(result(.success, at: 931), shuttingDown: false), at: at(931))
        #expect(machine.status.phase == .ready && machine.status.fcmTrouble == nil)
    }

    @Test func theWatchTellsRetryingFromAnswersAndEstimatesTheRest() {
        let clock = ManualClock()
        let watch = ReconcileWatch(timing: clock.timing)
        watch.begin(at: .seconds(0))
        func attempt(_ outcome: FCMAttempt.Outcome, _ code: String, elapsed: Double = 0) {
            watch.observe(
                FCMAttempt(kind: .write, outcome: outcome, code: code, cause: "HTTP \(code)", elapsed: elapsed))
        }
        clock.advance(.seconds(10))
        attempt(.retried, "5xx", elapsed: 2)
        #expect(watch.snapshot().retryingSince == .seconds(8) && watch.snapshot().answer == "HTTP 5xx")
        clock.advance(.seconds(5))
        attempt(.retried, "429")
        #expect(watch.snapshot().retryingSince == .seconds(8), "the first retry since the last answer")
        attempt(.failed, "5xx")
        #expect(watch.snapshot().retryingSince != nil, "retries that gave up are no answer")
        attempt(.failed, "4xx")
        #expect(watch.snapshot().retryingSince == nil, "a 404 is FCM answering")
        attempt(.retried, "network")
        attempt(.success, "2xx")
        #expect(watch.snapshot().retryingSince == nil)
        watch.progressed(
            .applyProgress(ExecutionProgress(operationsDone: 0, operationsTotal: 1, tokensDone: 100, tokensTotal: 1100))
        )
        clock.advance(.seconds(10))
        watch.progressed(
            .applyProgress(ExecutionProgress(operationsDone: 0, operationsTotal: 1, tokensDone: 600, tokensTotal: 1100))
        )
        let snapshot = watch.snapshot()
        #expect(snapshot.step == "applying" && snapshot.done == 600 && snapshot.total == 1100)
        #expect(snapshot.etaSeconds == 10, "500 in 10 s: 500 left take 10 s")
        watch.begin(at: .seconds(30))
        #expect(watch.snapshot() == ReconcileWatch.Snapshot(started: .seconds(30)))
    }
}
