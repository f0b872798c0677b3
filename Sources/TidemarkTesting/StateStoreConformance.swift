import Foundation
import Synchronization
import Testing
import TidemarkCore

/// One suite for every `StateStore`: a store passes it or is not a state store.
///
/// A test target runs every check against a fresh store of its kind:
/// ```swift
/// @Test(arguments: StateStoreConformance.Check.allCases)
/// func conforms(_ check: StateStoreConformance.Check) async throws {
///     try await StateStoreConformance.run(check) { InMemoryStateStore() }
/// }
/// ```
public enum StateStoreConformance {
    /// The checks every state store passes.
    public enum Check: String, CaseIterable, Sendable, CustomTestStringConvertible {
        case startsEmpty
        case roundTripsEverything
        case writesOnlyWhatIsNamed
        case bumpsTheSerialOnEverySave
        case journalsAnApply
        case keepsTheHistory
        case lockIsExclusiveAndNamesItsHolder
        case sessionResumesWhereItStopped
        case recordsWhenEachTopicAndGroupChanged
        case journalsStepsWithinAnOperation
        case restoresAWholeStateKeepingItsSerial
        case remembersEachTokensDevice
        case compactsTheTokenTable
        case journalsEveryTokenOfAPlan
        case leaseOperationsMatchTheLockKind
        case keepsServeRecords
        case reusesTheStringsOfTheLastRead

        /// The check's name, as test reports show it.
        public var testDescription: String { rawValue }
    }

    /// Runs `check` against a new, empty store from `make`.
    public static func run(_ check: Check, _ make: () async throws -> any StateStore) async throws {
        let store = try await make()
        switch check {
        case .startsEmpty: try await startsEmpty(store)
        case .roundTripsEverything: try await roundTripsEverything(store)
        case .writesOnlyWhatIsNamed: try await writesOnlyWhatIsNamed(store)
        case .bumpsTheSerialOnEverySave: try await bumpsTheSerialOnEverySave(store)
        case .journalsAnApply: try await journalsAnApply(store)
        case .keepsTheHistory: try await keepsTheHistory(store)
        case .lockIsExclusiveAndNamesItsHolder: try await lockIsExclusiveAndNamesItsHolder(store)
        case .sessionResumesWhereItStopped: try await sessionResumesWhereItStopped(store)
        case .recordsWhenEachTopicAndGroupChanged: try await recordsWhenEachTopicAndGroupChanged(store)
        case .journalsStepsWithinAnOperation: try await journalsStepsWithinAnOperation(store)
        case .restoresAWholeStateKeepingItsSerial: try await restoresAWholeStateKeepingItsSerial(store)
        case .remembersEachTokensDevice: try await remembersEachTokensDevice(store)
        case .compactsTheTokenTable: try await compactsTheTokenTable(store)
        case .journalsEveryTokenOfAPlan: try await journalsEveryTokenOfAPlan(store)
        case .leaseOperationsMatchTheLockKind: try await leaseOperationsMatchTheLockKind(store)
        case .keepsServeRecords: try await keepsServeRecords(store)
        case .reusesTheStringsOfTheLastRead: try await reusesTheStringsOfTheLastRead(store)
        }
    }

    /// The lineage of the sample state.
    public static let lineage = "0f3e8a52-2c1d-4b7e-9a41-5d6c7e8f9a0b"

    static func token(_ i: Int) -> String { Fixtures.token(i) }

    /// A state of `tokens` tokens (at least 10: its sets name ids up to 9) with two topics, a group
    /// and two audiences, as a first apply would leave it.
    public static func sample(tokens: Int = 5000, lineage: String = lineage) -> State {
        precondition(tokens >= 10, "the sample's sets name token ids up to 9")
        var state = State(lineage: lineage, serial: 0)
        for i in 0..<tokens { state.intern(token(i)) }
        state.setSeen(3, at: 99)
        state.setDead(TokenSet([4]))
        state.setTopic(
            "news",
            TopicState(
                mode: .authoritative, protect: true, managed: TokenSet([1, 2, 3]),
                observed: TokenSet(0..<UInt32(min(tokens, 4000)))))
        state.setTopic(
            "sports", TopicState(managed: TokenSet([5, 9]), observed: TokenSet([5, 6]), optedOut: TokenSet([9])))
        state.setGroup("family", GroupState(key: "APA91bkey", protect: false, members: TokenSet([7, 8])))
        // A group converted to an audience (its FCM group still kept), exported before; and an audience
        // with no FCM group at all.
        state.setGroup(
            "kitchen",
            GroupState(
                key: "APA91bold", protect: true, members: TokenSet([2, 3]), audience: true,
                exported: TokenSet([2, 3, 6]), exportedAt: 555))
        state.setGroup("beta-testers", GroupState(key: nil, members: TokenSet([0, 1]), audience: true))
        state.claim(backend: BackendIdentity(kind: .fcm, project: "tidewatch-prod"))
        return state
    }

    /// A write naming every topic and group of `state`.
    public static func writeAll(_ state: State) -> StateWrite {
        var write = StateWrite()
        write.topics = Array(state.topics.keys)
        write.groups = Array(state.groups.keys)
        return write
    }

    /// A plan of `operations` made from `state`, for journal checks.
    public static func plan(_ operations: [PlannedOperation], state: State, digest: String = "d") -> Plan {
        Plan(
            tidemarkVersion: "test", createdAt: Date(timeIntervalSince1970: 1_800_000_000), lineage: state.lineage,
            serial: state.serial, manifestsDigest: digest, backend: BackendIdentity(kind: .embedded, project: "p"),
            refreshed: false, operations: operations, topics: [], groups: [], diagnostics: [],
            observations: Observations())
    }

    /// The holder the lock checks take the lock as.
    public static let holder = LockHolder(
        operation: "tidemark apply", user: "ci", host: "runner-1", pid: 4242,
        since: Date(timeIntervalSince1970: 1_800_000_000))

    /// The device id of each token survives a save; a changed one is written when the write names it.
    static func remembersEachTokensDevice(_ store: any StateStore) async throws {
        var state = sample(tokens: 30)
        state.setDeviceID(0, "device-0")
        state.setDeviceID(7, "d7")
        state.setLeft(9, at: 777)
        try await store.save(&state, writeAll(state), at: 1000)
        var loaded = try #require(try await store.load())
        #expect(loaded.leftAt.count == 30 && loaded.leftAt[9] == 777 && loaded.leftAt[8] == 0)
        #expect(loaded.deviceIDs.count == 30)
        #expect(loaded.deviceID(of: 0) == "device-0" && loaded.deviceID(of: 7) == "d7" && loaded.deviceID(of: 1) == nil)
        // A device id learnt later for a stored token, and a new token with its device.
        loaded.setDeviceID(1, "device-1")
        loaded.setLeft(1, at: 555)
        let new = loaded.intern(token(500))
        loaded.setDeviceID(new, "device-500")
        var write = StateWrite()
        write.tokens = [1]
        try await store.save(&loaded, write, at: 1001)
        let again = try #require(try await store.load())
        #expect(again.deviceID(of: 1) == "device-1" && again.deviceID(of: new) == "device-500")
        #expect(again.leftAt[1] == 555 && again.leftAt[9] == 777)
        #expect(again.deviceID(of: 0) == "device-0")
    }

    /// Where the string's bytes are stored: the same address for two strings is one allocation. Only for
    /// strings too long to be stored inline (over 15 bytes).
    public static func storage(_ string: String) -> UnsafeRawPointer? {
        string.utf8.withContiguousStorageIfAvailable { UnsafeRawPointer($0.baseAddress) } ?? nil
    }

    /// A load inside `StringReuse.$current.withValue` keeps the strings it is given for the tokens and
    /// device ids that have the same bytes, and only those (`serve`'s whole reads; see `StringReuse`).
    static func reusesTheStringsOfTheLastRead(_ store: any StateStore) async throws {
        var state = sample(tokens: 30)
        for i in 0..<30 { state.setDeviceID(UInt32(i), "device-\(i)-of-the-sample-state") }
        // Token 8's device has an accent written apart (e and U+0301); the kept one has it composed.
        state.setDeviceID(8, "device-8-of-the-sample-cafe\u{301}")
        try await store.save(&state, writeAll(state), at: 1000)
        let first = try #require(try await store.load())
        // The last read as `serve` keeps it, but for token 4 (rotated since) and the device of token 6.
        var kept = TokenRegistry()
        for i in 0..<30 {
            let id = kept.intern(i == 4 ? token(1004) : first.tokens[UInt32(i)])
            let device =
                i == 6
                ? "another-device-of-the-sample" : i == 8 ? "device-8-of-the-sample-caf\u{e9}" : first.deviceIDs[i]
            kept.setDeviceID(id, device)
        }
        let again = try #require(
            try await StringReuse.$current.withValue(StringReuse(kept)) { try await store.load() })
        #expect(again.tokens.tokens == first.tokens.tokens && again.deviceIDs == first.deviceIDs)
        for i in 0..<30 where i != 4 {
            #expect(storage(again.tokens[UInt32(i)]) == storage(kept[UInt32(i)]), "token \(i) is the kept string")
        }
        #expect(again.tokens[4] == token(4), "a token the kept strings do not have is read as stored")
        for i in 0..<30 where i != 6 && i != 8 {
            #expect(
                storage(again.deviceIDs[i]) == storage(kept.deviceIDs[i]), "device of token \(i) is the kept string")
        }
        #expect(again.deviceIDs[6] == "device-6-of-the-sample-state")
        #expect(
            Array(again.deviceIDs[8].utf8) == Array("device-8-of-the-sample-cafe\u{301}".utf8),
            "the same text spelt with other bytes is not taken for the kept id")
    }

    /// `state prune`: a rebuilt token table replaces the stored one, every set remapped, in one save.
    static func compactsTheTokenTable(_ store: any StateStore) async throws {
        var state = sample(tokens: 40)
        state.setDeviceID(12, "device-12")
        try await store.save(&state, writeAll(state), at: 1000)
        var selection = PruneSelection()
        selection.dead = [4]
        selection.departed = [0, 10, 39]
        var pruned = state.removing(selection)
        #expect(pruned.tokens.count == 36 && pruned.tokens[0] == token(1) && pruned.tokens.id(token(10)) == nil)
        let serial = try await store.save(&pruned, .compacting(pruned), at: 1001)
        #expect(serial == 2)
        let loaded = try #require(try await store.load())
        #expect(loaded.tokens.count == 36)
        #expect((0..<36).allSatisfy { loaded.tokens[UInt32($0)] == pruned.tokens[UInt32($0)] })
        #expect(loaded.dead.isEmpty, "the dead token is gone")
        #expect(loaded.topics == pruned.topics && loaded.groups == pruned.groups)
        #expect(loaded.deviceID(of: loaded.tokens.id(token(12))!) == "device-12")
        #expect(loaded.seenAt[Int(loaded.tokens.id(token(3))!)] == 99)
        // The news topic's managed tokens 1, 2, 3 are ids 0, 1, 2 now.
        #expect(loaded.topics["news"]?.managed.map { loaded.tokens[$0] } == [token(1), token(2), token(3)])
        // A later ordinary save appends after the compacted table.
        var next = loaded
        let new = next.intern(token(900))
        try await store.save(&next, StateWrite(), at: 1002)
        #expect(try await store.load()?.tokens.id(token(900)) == new)
    }

    static func startsEmpty(_ store: any StateStore) async throws {
        #expect(try await store.load() == nil)
        #expect(try await store.revision() == nil)
        #expect(try await store.unfinishedApply() == nil)
        #expect(try await store.applies(limit: 10).isEmpty)
        #expect(try await store.lockHolder() == nil)
        #expect(!store.location.isEmpty)
    }

    static func roundTripsEverything(_ store: any StateStore) async throws {
        var state = sample()
        let serial = try await store.save(&state, writeAll(state), at: 1000)
        #expect(serial == 1 && state.serial == 1)
        let loaded = try #require(try await store.load())
        #expect(loaded.lineage == lineage && loaded.serial == 1)
        #expect(loaded.tokens.count == 5000 && loaded.tokens[4999] == token(4999))
        #expect(loaded.tokens.id(token(17)) == 17)
        #expect(loaded.seenAt[3] == 99 && loaded.seenAt[2] == 0 && loaded.dead == TokenSet([4]))
        #expect(loaded.topics == state.topics)
        #expect(loaded.groups == state.groups)
        #expect(loaded.backend == BackendIdentity(kind: .fcm, project: "tidewatch-prod"), "the state knows whose it is")
    }

    static func writesOnlyWhatIsNamed(_ store: any StateStore) async throws {
        var state = sample(tokens: 20)
        try await store.save(&state, writeAll(state), at: 1000)
        // Change two topics, a group and a token; name only one topic and the group.
        state.updateTopic("news") { $0.observed = TokenSet([9]) }
        state.updateTopic("sports") { $0.observed = TokenSet([10]) }
        state.setGroup("family", nil)
        state.setSeen(5, at: 500)
        state.setDead(state.dead.union(TokenSet([6])))
        var write = StateWrite()
        write.topics = ["news"]
        write.groups = ["family"]
        try await store.save(&state, write, at: 1001)
        var loaded = try #require(try await store.load())
        #expect(loaded.topics["news"]?.observed == TokenSet([9]))
        #expect(loaded.topics["sports"]?.observed == TokenSet([5, 6]), "an unnamed topic keeps what was stored")
        #expect(loaded.groups["family"] == nil, "a named group that state dropped is deleted")
        #expect(loaded.seenAt[5] == 0 && !loaded.dead.contains(6), "unnamed tokens keep what was stored")
        // Naming the tokens writes them; new tokens are always written.
        state.intern(token(100))
        state.setSeen(20, at: 77)
        write = StateWrite()
        write.tokens = [5, 6]
        try await store.save(&state, write, at: 1002)
        loaded = try #require(try await store.load())
        #expect(loaded.seenAt[5] == 500 && loaded.dead.contains(6))
        #expect(loaded.tokens.count == 21 && loaded.tokens[20] == token(100) && loaded.seenAt[20] == 77)
        // allTokens writes every token, including a revival.
        state.setDead(state.dead.subtracting(TokenSet([6])))
        state.setSeen(0, at: 42)
        write = StateWrite()
        write.allTokens = true
        try await store.save(&state, write, at: 1003)
        loaded = try #require(try await store.load())
        #expect(loaded.seenAt[0] == 42 && !loaded.dead.contains(6))
        // Deleting a topic deletes it.
        state.setTopic("sports", nil)
        write = StateWrite()
        write.topics = ["sports"]
        try await store.save(&state, write, at: 1004)
        #expect(try await store.load()?.topics.keys.sorted() == ["news"])
    }

    static func bumpsTheSerialOnEverySave(_ store: any StateStore) async throws {
        var state = sample(tokens: 10)
        for expected in 1...4 {
            let serial = try await store.save(&state, StateWrite(), at: Int64(1000 + expected))
            #expect(serial == expected && state.serial == expected)
        }
        let loaded = try #require(try await store.load())
        #expect(loaded.serial == 4 && loaded.lineage == lineage, "the lineage never changes")
        #expect(try await store.revision() == StateRevision(lineage: lineage, serial: 4), "read alone, the same")
        // A stale copy saving again still bumps from what is stored.
        var stale = sample(tokens: 10)
        stale.saved(serial: 1, versionKeys: [])
        #expect(try await store.save(&stale, StateWrite(), at: 2000) == 5)
    }

    static func journalsAnApply(_ store: any StateStore) async throws {
        var state = sample(tokens: 10)
        let ops = [
            PlannedOperation(kind: .subscribe, target: "news", tokens: [token(0)]),
            PlannedOperation(kind: .subscribe, target: "news", tokens: [token(1), token(2)]),
        ]
        let plan = plan(ops, state: state)
        var write = writeAll(state)
        write.beginApply = ("apply-1", plan)
        try await store.save(&state, write, at: 1000)
        var unfinished = try #require(try await store.unfinishedApply())
        #expect(unfinished.id == "apply-1" && unfinished.done.isEmpty)
        #expect(unfinished.plan.operations == ops && unfinished.plan.operationsDigest == plan.operationsDigest)
        #expect(unfinished.startedAt == Date(timeIntervalSince1970: 1000))
        write = StateWrite()
        write.finishedOperations = [JournalEntry(applyID: "apply-1", index: 1, ok: 2, failed: 0)]
        try await store.save(&state, write, at: 1001)
        unfinished = try #require(try await store.unfinishedApply())
        #expect(unfinished.done == [1])
        write = StateWrite()
        write.finishApply = ("apply-1", .finished)
        try await store.save(&state, write, at: 1002)
        #expect(try await store.unfinishedApply() == nil)
    }

    /// A journaled plan comes back exactly: every operation's tokens in order, repeats across operations,
    /// tokens first written by the same save, and (kept whole) a plan naming a token state does not hold.
    static func journalsEveryTokenOfAPlan(_ store: any StateStore) async throws {
        var state = sample(tokens: 3000)
        var write = writeAll(state)
        try await store.save(&state, write, at: 1000)
        // Tokens new in this save: interned now, written with the journal's plan.
        for i in 3000..<3500 { state.intern(token(i)) }
        let ops = [
            PlannedOperation(kind: .unsubscribe, target: "news", tokens: (0..<1000).reversed().map(token)),
            PlannedOperation(kind: .subscribe, target: "sports", tokens: (2900..<3500).map(token)),
            PlannedOperation(kind: .subscribe, target: "news", tokens: [token(7), token(3499), token(0)]),
            PlannedOperation(kind: .groupAdd, target: "ios", tokens: [token(5)]),
        ]
        let plan = plan(ops, state: state)
        write = StateWrite()
        write.beginApply = ("apply-1", plan)
        try await store.save(&state, write, at: 1001)
        let unfinished = try #require(try await store.unfinishedApply())
        #expect(unfinished.plan.operations == ops)
        #expect(unfinished.plan.operationsDigest == plan.operationsDigest)
        #expect(unfinished.plan.lineage == plan.lineage && unfinished.plan.manifestsDigest == plan.manifestsDigest)
        write = StateWrite()
        write.finishApply = ("apply-1", .finished)
        try await store.save(&state, write, at: 1002)

        // A token the state does not hold (no plan tidemark makes has one): the plan is journaled whole.
        let stranger = [PlannedOperation(kind: .subscribe, target: "news", tokens: [token(1), "stranger:APA91b-x"])]
        write = StateWrite()
        write.beginApply = ("apply-2", Self.plan(stranger, state: state))
        try await store.save(&state, write, at: 1003)
        #expect(try await store.unfinishedApply()?.plan.operations == stranger)
    }

    static func keepsTheHistory(_ store: any StateStore) async throws {
        var state = sample(tokens: 10)
        let op = PlannedOperation(kind: .subscribe, target: "news", tokens: [token(0)])
        for (i, status) in [ApplyStatus.finished, .abandoned, .running].enumerated() {
            var write = StateWrite()
            write.beginApply = ("apply-\(i)", plan([op, op], state: state))
            try await store.save(&state, write, at: Int64(1000 + 10 * i))
            write = StateWrite()
            write.finishedOperations = [JournalEntry(applyID: "apply-\(i)", index: 0, ok: 1, failed: 0)]
            if status != .running { write.finishApply = ("apply-\(i)", status) }
            try await store.save(&state, write, at: Int64(1001 + 10 * i))
        }
        let history = try await store.applies(limit: 10)
        #expect(history.map(\.id) == ["apply-2", "apply-1", "apply-0"], "newest first")
        #expect(history.map(\.status) == [.running, .abandoned, .finished])
        #expect(history.allSatisfy { $0.operations == 2 && $0.done == 1 })
        #expect(history.last?.startedAt == 1000)
        #expect(try await store.applies(limit: 1).map(\.id) == ["apply-2"])
        #expect(try await store.unfinishedApply()?.id == "apply-2")

        // Trimmed to the newest applies (`history_keep`), oldest first; a running apply always stays.
        guard let store = store as? any HistoryTrimming else { return }
        #expect(try await store.trimHistory(keep: 2) == 1)
        #expect(try await store.applies(limit: 10).map(\.id) == ["apply-2", "apply-1"])
        #expect(try await store.trimHistory(keep: 0) == 1)
        #expect(try await store.applies(limit: 10).map(\.id) == ["apply-2"])
        #expect(try await store.applies(limit: 10).first?.done == 1)
        #expect(try await store.unfinishedApply()?.id == "apply-2")
        #expect(try await store.trimHistory(keep: 5) == 0)
    }

    /// A lock that ends with its process shows no lease and refuses to be broken; a lease is shown
    /// while held, is broken only by a prefix of its own id, and is gone once broken.
    static func leaseOperationsMatchTheLockKind(_ store: any StateStore) async throws {
        let breaker = LockHolder(
            operation: "tidemark state force-unlock", user: "oncall", host: "laptop", pid: 77,
            since: Date(timeIntervalSince1970: 1_800_000_300))
        guard let leases = store as? any LeaseKeeping else {
            // A lock that ends with its process: held until released, and nothing to break.
            #expect(store.lockKind == .process)
            let held = try await store.lock(holder)
            #expect(try await store.lockHolder() == holder)
            await held.release()
            #expect(try await store.lockHolder() == nil)
            return
        }
        #expect(store.lockKind == .lease)
        #expect(try await leases.lease() == nil)
        let held = try await store.lock(holder)
        let lease = try #require(try await leases.lease())
        #expect(lease.holder == holder)
        await #expect(throws: StateStoreError.self) { try await leases.forceUnlock("zz", by: breaker) }
        #expect(try await leases.forceUnlock(String(lease.id.prefix(8)), by: breaker) == holder)
        #expect(try await leases.lease() == nil)
        #expect(try await store.lockHolder() == nil)
        await held.release()
    }

    static func lockIsExclusiveAndNamesItsHolder(_ store: any StateStore) async throws {
        let lease = try await store.lock(holder)
        #expect(try await store.lockHolder() == holder)
        do {
            _ = try await store.lock(
                LockHolder(
                    operation: "tidemark import", user: "me", host: "laptop", pid: 1,
                    since: Date(timeIntervalSince1970: 1_800_000_100)))
            Issue.record("a second lock must be refused while the first is held")
        } catch let error as StateStoreError {
            #expect(error.code == .locked)
            #expect(error.holder == holder)
            #expect(error.description.contains("tidemark apply (pid 4242, user ci on runner-1)"))
        }
        await lease.release()
        #expect(try await store.lockHolder() == nil)
        // withLock releases however its body ends.
        struct Boom: Error {}
        await #expect(throws: Boom.self) { try await store.withLock(holder) { throw Boom() } }
        #expect(try await store.lockHolder() == nil)
        let value = try await store.withLock(holder) { 7 }
        #expect(value == 7)
        // --lock-timeout: a second run waits for the lock and gets it once the first lets go (here,
        // during its first wait: on a manual clock, so no real time passes and no scheduling matters) ...
        let other = LockHolder(
            operation: "tidemark apply", user: "ci", host: "runner-2", pid: 4343,
            since: Date(timeIntervalSince1970: 1_800_000_200))
        let first = try await store.lock(holder)
        let clock = ManualClock()
        let waits = Mutex(0)
        var timing = clock.timing
        timing.sleep = { duration in
            if waits.withLock({ count in
                count += 1
                return count == 1
            }) {
                await first.release()
            }
            clock.advance(duration)
        }
        #expect(try await store.withLock(other, waiting: 30, timing: timing) { 8 } == 8)
        #expect(waits.withLock { $0 } == 1, "one wait, then the lock was free")
        // ... and gives up after its timeout, naming the holder.
        let held = try await store.lock(holder)
        do {
            _ = try await store.withLock(other, waiting: 5, timing: ManualClock().timing) { 9 }
            Issue.record("the wait must end at its timeout")
        } catch let error as StateStoreError {
            #expect(error.code == .locked && error.holder == holder)
        }
        await held.release()
    }

    static func sessionResumesWhereItStopped(_ store: any StateStore) async throws {
        var state = State(lineage: lineage, serial: 0)
        for i in 0..<3 { state.intern(token(i)) }
        let desired = DesiredState(
            topics: [DesiredTopic(name: "t", members: TokenSet([0, 1, 2]))], groups: [],
            knownTokens: TokenSet([0, 1, 2]))
        let ops = [
            PlannedOperation(kind: .subscribe, target: "t", tokens: [token(0)]),
            PlannedOperation(kind: .subscribe, target: "t", tokens: [token(1), token(2)]),
        ]
        let clock = ManualClock()
        let session = try await ApplySession.begin(
            plan: plan(ops, state: state), desired: desired, store: store,
            state: state, timing: clock.timing)
        try await session.completed(index: 1, operation: ops[1], outcomes: [.ok, .ok], groupKey: nil)
        let unfinished = try #require(try await store.unfinishedApply())
        #expect(unfinished.id == session.id && unfinished.done == [1])
        let reloaded = try #require(try await store.load())
        #expect(reloaded.topics["t"]?.managed == TokenSet([1, 2]), "the finished operation is in state")
        #expect(reloaded.serial == 2)
        let resumed = ApplySession.resume(unfinished, store: store, state: reloaded, timing: clock.timing)
        try await resumed.completed(index: 0, operation: ops[0], outcomes: [.ok], groupKey: nil)
        try await resumed.finish()
        #expect(try await store.unfinishedApply() == nil)
        #expect(try await store.load()?.topics["t"]?.managed == TokenSet([0, 1, 2]))
        #expect(try await store.applies(limit: 5).first?.status == .finished)
    }

    /// Every save records, for the topics and groups it writes, the serial it wrote them at: what lets a
    /// saved plan survive an apply that changed only other topics.
    static func recordsWhenEachTopicAndGroupChanged(_ store: any StateStore) async throws {
        var state = sample(tokens: 10)
        try await store.save(&state, writeAll(state), at: 1000)
        let groups = ["group:family": 1, "group:kitchen": 1, "group:beta-testers": 1]
        #expect(state.versions == ["topic:news": 1, "topic:sports": 1].merging(groups) { a, _ in a })
        state.updateTopic("news") { $0.observed = TokenSet([1]) }
        var write = StateWrite()
        write.topics = ["news"]
        try await store.save(&state, write, at: 1001)
        try await store.save(&state, StateWrite(), at: 1002)
        state.setTopic("sports", nil)
        write = StateWrite()
        write.topics = ["sports"]
        try await store.save(&state, write, at: 1003)
        let expected = ["topic:news": 2, "topic:sports": 4].merging(groups) { a, _ in a }
        #expect(state.versions == expected, "the saving state knows its versions")
        #expect(try await store.load()?.versions == expected, "and so does the store")
    }

    /// A per-token transport journals an operation in steps: a resumed apply learns how far each
    /// unfinished operation got, with the counts so far, and the operation's last step finishes it.
    static func journalsStepsWithinAnOperation(_ store: any StateStore) async throws {
        var state = State(lineage: lineage, serial: 0)
        for i in 0..<5 { state.intern(token(i)) }
        let desired = DesiredState(
            topics: [DesiredTopic(name: "t", members: TokenSet(0..<5))], groups: [], knownTokens: TokenSet(0..<5))
        let op = PlannedOperation(kind: .subscribe, target: "t", tokens: (0..<5).map(token))
        let clock = ManualClock()
        let session = try await ApplySession.begin(
            plan: plan([op], state: state), desired: desired, store: store, state: state, timing: clock.timing)
        try await session.recorded(
            OperationStep(index: 0, operation: op, from: 0, outcomes: [.ok, .failed(.notFound)], groupKey: nil))
        var unfinished = try #require(try await store.unfinishedApply())
        #expect(unfinished.done.isEmpty)
        #expect(
            unfinished.progress[0] == OperationProgress(applyID: session.id, index: 0, tokensDone: 2, ok: 1, failed: 1))
        var reloaded = try #require(try await store.load())
        #expect(reloaded.topics["t"]?.managed.contains(0) == true, "the first step is in state")
        #expect(reloaded.dead.isEmpty, "an unregistered answer marks its token dead only when the apply finishes")
        // Resumed in another process: the next step continues the counts.
        let resumed = ApplySession.resume(unfinished, store: store, state: reloaded, timing: clock.timing)
        try await resumed.recorded(
            OperationStep(index: 0, operation: op, from: 2, outcomes: [.ok, .ok], groupKey: nil))
        unfinished = try #require(try await store.unfinishedApply())
        #expect(unfinished.tokensDone == [0: 4] && unfinished.progress[0]?.ok == 3)
        try await resumed.recorded(OperationStep(index: 0, operation: op, from: 4, outcomes: [.ok], groupKey: nil))
        unfinished = try #require(try await store.unfinishedApply())
        #expect(unfinished.done == [0] && unfinished.progress.isEmpty, "the last step finishes the operation")
        try await resumed.finish()
        reloaded = try #require(try await store.load())
        #expect(reloaded.topics["t"]?.managed == TokenSet([0, 2, 3, 4]))
        #expect(reloaded.dead.isEmpty, "the answer belonged to the run that stopped; a refresh finds it again")
        #expect(try await store.applies(limit: 1).first?.done == 1)
    }

    /// `state pull`, `push` and `migrate` copy a state whole: its serial and row versions are kept, so
    /// plans saved against it stay valid in the new store; the next save bumps from there.
    static func restoresAWholeStateKeepingItsSerial(_ store: any StateStore) async throws {
        let sample = sample(tokens: 30)
        let state = State(
            lineage: sample.lineage, serial: 41, tokens: sample.tokens, dead: sample.dead, topics: sample.topics,
            groups: sample.groups, backend: sample.backend,
            versions: ["topic:news": 12, "topic:sports": 40, "group:family": 3, "topic:gone": 7],
            inventoryRows: ["inventory/devices.csv": 3000, "exec devices.py": 12, "postgres \"app\"": 0])
        var copy = state
        try await store.save(&copy, .restoring(state), at: 1000)
        #expect(copy.serial == 41)
        let loaded = try #require(try await store.load())
        #expect(loaded.serial == 41 && loaded.lineage == lineage)
        #expect(loaded.versions == state.versions)
        #expect(loaded.topics == state.topics && loaded.groups == state.groups)
        #expect(loaded.tokens.count == 30 && loaded.dead == state.dead && loaded.seenAt == state.seenAt)
        #expect(loaded.backend == state.backend)
        #expect(loaded.inventoryRows == state.inventoryRows, "the shrink guard's counts")
        var next = loaded
        next.updateTopic("news") { $0.managed = TokenSet([1]) }
        next.recordInventoryRows(["inventory/devices.csv": 2990])
        var write = StateWrite()
        write.topics = ["news"]
        #expect(try await store.save(&next, write, at: 1001) == 42)
        #expect(try await store.load()?.versions["topic:news"] == 42)
        #expect(try await store.load()?.inventoryRows == ["inventory/devices.csv": 2990])
    }

    /// `serve`'s records: one owner at a time (renewed by itself, taken by another only once released or
    /// expired, each new owner a higher fence); a status kept only from the owner; suspend, resume and
    /// reconcile recorded with who asked; none of it makes a state. A store that keeps no records does
    /// not adopt `ServeRecordKeeping`.
    static func keepsServeRecords(_ store: any StateStore) async throws {
        // A capability: a store that does not adopt it has none of it to check.
        guard let store = store as? any ServeRecordKeeping else { return }
        let empty = try await store.serveRecord()
        #expect(empty.owner == nil && !empty.suspended && empty.status == nil && empty.reconcileRequestedAt == nil)
        // Claims for an hour: a loaded machine may take many seconds between two lines.
        let first = try await store.claimOwnership("replica-a", for: .seconds(3600))
        #expect(first.owner == "replica-a" && first.ownerFence == 1)
        #expect(first.isOwned(by: "replica-a", at: Date()))
        let refused = try await store.claimOwnership("replica-b", for: .seconds(3600))
        #expect(refused.owner == "replica-a" && !refused.isOwned(by: "replica-b", at: Date()))
        let renewed = try await store.claimOwnership("replica-a", for: .seconds(3600))
        #expect(renewed.ownerFence == 1 && renewed.ownerExpires.map { $0 >= first.ownerExpires! } == true)
        let status = Data(#"{"phase":"ready"}"#.utf8)
        #expect(try await !store.publishStatus(Data("{}".utf8), replica: "replica-b"))
        #expect(try await store.publishStatus(status, replica: "replica-a"))
        #expect(try await store.serveRecord().status == status)
        let suspended = try await store.requestControl(.suspend, by: "alice on laptop")
        #expect(suspended.suspended && suspended.suspendedBy?.hasPrefix("alice on laptop at ") == true)
        #expect(try await !store.requestControl(.resume, by: "bob").suspended)
        let asked = try await store.requestControl(.reconcile, by: "carol")
        #expect(asked.reconcileRequestedAt != nil && asked.reconcileRequestedBy == "carol")
        // Requests never move the owner or the status.
        #expect(asked.owner == "replica-a" && asked.status == status)
        try await store.releaseOwnership("replica-b")
        #expect(try await store.serveRecord().owner == "replica-a")
        try await store.releaseOwnership("replica-a")
        let taken = try await store.claimOwnership("replica-b", for: .milliseconds(50))
        #expect(taken.owner == "replica-b" && taken.ownerFence == 2)
        try await Task.sleep(for: .milliseconds(150))
        let afterExpiry = try await store.claimOwnership("replica-a", for: .seconds(3600))
        #expect(afterExpiry.owner == "replica-a" && afterExpiry.ownerFence == 3)
        // Presences: a replica standing by is recorded without taking the workspace; a handover ends the
        // claim and keeps the presence; a replica that leaves ends both; an ended presence is dropped.
        let standby = try await store.claimOwnership("replica-c", for: .seconds(3600), take: false)
        #expect(standby.owner == "replica-a" && standby.liveReplicas(at: Date()) == ["replica-a", "replica-c"])
        let kept = try await store.claimOwnership("replica-a", for: .seconds(3600), take: false)
        #expect(kept.owner == "replica-a" && kept.ownerFence == 3)
        try await store.releaseOwnership("replica-a", leaving: false)
        let handedOver = try await store.serveRecord()
        #expect(handedOver.owner == nil && handedOver.liveReplicas(at: Date()) == ["replica-a", "replica-c"])
        let notTaken = try await store.claimOwnership("replica-a", for: .seconds(3600), take: false)
        #expect(notTaken.owner == nil)
        let takenOver = try await store.claimOwnership("replica-c", for: .seconds(3600), take: true)
        #expect(takenOver.owner == "replica-c" && takenOver.ownerFence == 4)
        _ = try await store.claimOwnership("replica-d", for: .milliseconds(50), take: false)
        try await store.releaseOwnership("replica-a")
        try await Task.sleep(for: .milliseconds(150))
        let left = try await store.claimOwnership("replica-c", for: .seconds(3600), take: false)
        #expect(left.owner == "replica-c" && left.liveReplicas(at: Date()) == ["replica-c"])
        #expect(try await store.serveRecord().replicas.keys.sorted() == ["replica-c"])
        try await store.releaseOwnership("replica-c")
        _ = try await store.claimOwnership("replica-a", for: .seconds(3600))
        // Other workspaces of the same database may have records too.
        let mine = try await store.serveRecords().filter { $0.workspace == empty.workspace }
        #expect(mine.map(\.owner) == ["replica-a"])
        // Records alone are no state.
        #expect(try await store.load() == nil)
    }

    /// Two workspaces of one store (`dev`, `prod`, made by `workspace`): separate lineage, serial and
    /// state, and a lock each, so holding one never blocks the other (a second `dev` is refused).
    /// `named` gives the name the store keeps for a workspace (a shared test database prefixes them).
    public static func workspacesAreIndependent(
        named: (String) -> String = { $0 }, _ workspace: (String) throws -> any WorkspaceKeeping
    ) async throws {
        let dev = try workspace("dev")
        let prod = try workspace("prod")
        var state = sample(tokens: 20)
        try await dev.save(&state, writeAll(state), at: 1)
        try await dev.save(&state, StateWrite(), at: 2)
        #expect(try await prod.load() == nil)
        // Listed once saved, by either store of the file or database.
        let listed = try await prod.workspaces()
        #expect(listed.contains(named("dev")) && !listed.contains(named("prod")))
        var other = State(lineage: "other-lineage", serial: 0)
        other.intern(Fixtures.token(99))
        try await prod.save(&other, StateWrite(), at: 3)
        #expect(try await dev.load()?.serial == 2)
        #expect(try await prod.load()?.lineage == "other-lineage")
        let both = try await dev.workspaces().filter { [named("dev"), named("prod")].contains($0) }
        #expect(both == [named("dev"), named("prod")])
        // Deleting one, under its lock, leaves the other whole.
        let deleting = try await dev.lock(holder)
        try await dev.deleteWorkspace()
        await deleting.release()
        #expect(try await dev.load() == nil)
        #expect(try await dev.applies(limit: 10).isEmpty)
        #expect(try await prod.load()?.lineage == "other-lineage")
        #expect(try await prod.workspaces().filter { [named("dev"), named("prod")].contains($0) } == [named("prod")])
        var again = sample(tokens: 10)
        try await dev.save(&again, writeAll(again), at: 9)
        #expect(try await dev.load()?.serial == 1)
        let lease = try await dev.lock(holder)
        let second = try await prod.lock(holder)
        await #expect { _ = try await workspace("dev").lock(holder) } throws: {
            ($0 as? StateStoreError)?.code == .locked
        }
        await second.release()
        await lease.release()
    }
}
