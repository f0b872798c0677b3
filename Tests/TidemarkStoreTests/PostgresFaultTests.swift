import Foundation
import Synchronization
import Testing
import TidemarkCore
import TidemarkTesting

@testable import TidemarkStore

#if canImport(Glibc)
import Glibc
#endif

/// The lease and the connection when things go wrong, against the real server: a holder that lost its
/// lease stops its requests, holders are told apart by more than a host name, the heartbeat outlives
/// a dropped connection, and a query that gets no answer ends within its timeout.
@Suite(.enabled(if: TestPostgres.enabled)) struct PostgresFaultTests {
    static func holder(_ name: String, namespace: String? = nil, pid: Int32 = 4242) -> LockHolder {
        LockHolder(
            operation: "tidemark apply", user: "ci", host: ProcessInfo.processInfo.hostName, pid: pid,
            since: Date(), instance: UUID().uuidString, namespace: namespace)
    }

    /// Broken by another run (as a lease that expired while its holder was paused is taken): the
    /// holder's next request learns it from the server within a second and sends nothing.
    @Test func aHolderWhoseLeaseWasTakenStopsItsRequests() async throws {
        let name = "zombie-\(UUID().uuidString.prefix(8))"
        let runner = try TestPostgres.store(name, lease: .seconds(3600))
        let other = try TestPostgres.store(name, lease: .seconds(3600))
        let lease = try await runner.lock(Self.holder("runner"))
        let gate = LeaseGate()
        gate.testHold(lease)
        try await gate.check()
        // Its lease lapses on the server (a pause past its expiry), and another run takes it.
        try await runner.execute("UPDATE tidemark_leases SET expires_at = 0 WHERE workspace = '\(name)'")
        let taker = try await other.lock(Self.holder("other"))
        try await Task.sleep(for: .milliseconds(1100))
        await #expect { try await gate.check() } throws: { error in
            let e = error as? StateStoreError
            return e?.code == .leaseLost && e!.description.contains("taken by tidemark apply")
                && e!.description.contains("stopped before sending anything more to FCM")
        }
        // And it stays lost: no later check lets a request through.
        await #expect(throws: StateStoreError.self) { try await gate.check() }
        await taker.release()
        await lease.release()
        await runner.close()
        await other.close()
    }

    /// Two holders with one host name (two containers) whose process ids mean different processes: a
    /// live lease is never taken as its holder's process being gone. Within one namespace it still is.
    @Test func holdersWithOneHostNameAreToldApartByTheirNamespace() async throws {
        let name = "host-\(UUID().uuidString.prefix(8))"
        let first = try TestPostgres.store(name)
        let second = try TestPostgres.store(name)
        // A process id that exists nowhere in this namespace.
        let absent: Int32 = 4_000_000
        #expect(kill(absent, 0) != 0)
        let elsewhere = Self.holder("elsewhere", namespace: "another-boot/pid:[1]", pid: absent)
        let lease = try await first.lock(elsewhere)
        await #expect {
            _ = try await second.lock(Self.holder("here", namespace: LockHolder.currentNamespace))
        } throws: {
            ($0 as? StateStoreError)?.code == .locked
        }
        #expect(!PostgresStateStore.isDeadLocalProcess(Self.holder("old", namespace: nil, pid: absent)))
        if let here = LockHolder.currentNamespace {
            #expect(PostgresStateStore.isDeadLocalProcess(Self.holder("gone", namespace: here, pid: absent)))
            #expect(!PostgresStateStore.isDeadLocalProcess(Self.holder("alive", namespace: here, pid: getpid())))
        }
        await lease.release()
        await first.close()
        await second.close()
    }

    /// The app's database ends the connection in the middle of a large inventory read (a failover, a
    /// PgBouncer restart, `idle_session_timeout`; here `pg_terminate_backend`), many times: each read
    /// fails with one line naming the source and what happened, and the process lives on. (PostgresNIO
    /// trapped in its row stream when SwiftNIO drained the socket at the end of the stream, unless
    /// `ReadCompleteGuard` sits next to the socket.)
    @Test func aConnectionEndedMidReadIsAnErrorNotACrash() async throws {
        let url = try #require(TestPostgres.url)
        let table = "tm_drop_\(UUID().uuidString.prefix(8).lowercased())"
        // 200,000 devices of about 230 bytes: about 46 MB, many read cycles per page.
        try await TestPostgres.execute([
            "CREATE TABLE \(table) (n int primary key, device_id text, token text, platform text)",
            "INSERT INTO \(table) SELECT n, 'device-' || n, 't' || lpad(n::text, 7, '0') || ':APA91b' || repeat('x', 200), 'ios' FROM generate_series(1, 200000) AS n",
        ])
        var source = PostgresInventorySource(
            name: "app-db", url: url, query: "select device_id, token, platform from \(table) order by n")
        source.pageSize = 50_000
        let reading = source
        var ended = 0
        for round in 0..<12 {
            let read = Task { () -> String? in
                var builder = InventoryBuilder()
                do {
                    _ = try await reading.load(into: &builder)
                    return nil
                } catch {
                    return "\(error)"
                }
            }
            // The backend that holds the table (its cursor's lock) is ended part-way through the read.
            try await Task.sleep(for: .milliseconds(40 + 35 * round))
            try await TestPostgres.execute([
                "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE relation = '\(table)'::regclass AND pid <> pg_backend_pid()"
            ])
            let ending = ContinuousClock.now
            guard let message = await read.value else { continue }
            // Named within seconds, not after the URL's timeout (600 s here): a query written after
            // the close waited in the driver until the timeout before ConnectionEnded.
            #expect(ContinuousClock.now - ending < .seconds(30), "round \(round) waited for the timeout: \(message)")
            ended += 1
            #expect(message.contains("127.0.0.1"), "round \(round) names the database: \(message)")
            #expect(
                message.contains("terminating connection") || message.contains("closed the connection"),
                "round \(round): \(message)")
            #expect(!message.contains("APA91b") && !message.contains("DataRow"), "round \(round): \(message)")
        }
        #expect(ended >= 4, "the reads were ended part-way \(ended) times of 12; the check needs more")
        // And the next read, on a new connection, reads every device.
        var builder = InventoryBuilder()
        _ = try await source.load(into: &builder)
        #expect(builder.inventory.count == 200_000)
        try await TestPostgres.execute(["DROP TABLE \(table)"])
    }

    /// A query that got no answer says whose fault it may be: a timer that fired long after the limit
    /// means tidemark itself was stopped (SIGSTOP, a frozen VM), not that the server is down.
    @Test func aTimeoutThatFiredLateSaysTidemarkWasPaused() {
        let onTime = PostgresURL.NoAnswer(limit: .seconds(30), elapsed: .milliseconds(30_200))
        #expect(onTime.pausedFor == nil && onTime.words.contains("did not answer within 30 s"), "\(onTime.words)")
        let paused = PostgresURL.NoAnswer(limit: .seconds(30), elapsed: .seconds(400))
        #expect(paused.pausedFor == 370, "\(paused)")
        #expect(paused.words.contains("tidemark itself was stopped or starved for about 370 s"), "\(paused.words)")
        #expect(!paused.words.contains("overloaded"))
    }

    /// A workspace whose token table holds a value that is no registration token (edited by hand) is
    /// named as damaged, with the store, the workspace, the table and the id; nothing is planned.
    @Test func aMalformedTokenInTheStoreIsNamedNotPlanned() async throws {
        let name = "malformed-\(UUID().uuidString.prefix(8))"
        let store = try TestPostgres.store(name)
        var state = StateStoreConformance.sample(tokens: 10)
        _ = try await store.save(&state, StateStoreConformance.writeAll(state), at: 1)
        try await store.execute(
            "UPDATE tidemark_tokens SET token = 'not a token' WHERE workspace = '\(name)' AND id = 3")
        await #expect {
            _ = try await TestPostgres.store(name).load()
        } throws: { error in
            let e = error as? StateStoreError
            return e?.code == .damaged && e!.description.contains("tidemark_tokens") && e!.description.contains("id 3")
                && e!.description.contains(name) && !e!.description.contains("not a token")
        }
        // Put back: the database is shared, and commands that read every workspace (workspace list)
        // would meet the damaged one.
        try await store.execute(
            "UPDATE tidemark_tokens SET token = '\(Fixtures.token(3))' WHERE workspace = '\(name)' AND id = 3")
        #expect(try await TestPostgres.store(name).load() != nil)
        await store.close()
    }

    /// A dropped connection (pg_terminate_backend, a server restart) neither ends the lease's renewals
    /// for good nor wedges the store: a renewal on the dropped connection fails as unreachable (the
    /// heartbeat tries again two seconds later, where it used to stop), the next one reconnects and
    /// renews, and the next save opens a new connection. (Renewals are called directly: a heartbeat on
    /// a short lease cannot be timed in a process that blocking CLI tests starve for a minute.)
    @Test func renewalsAndTheStoreOutliveADroppedConnection() async throws {
        let name = "drop-\(UUID().uuidString.prefix(8))"
        // A statement sent on a connection the server just dropped can wait in the driver until the
        // store's timeout: a short one keeps this test short.
        var url = try PostgresURL(try #require(TestPostgres.url))
        url.timeout = .seconds(60)
        let store = PostgresStateStore(url: url, workspace: name, leaseDuration: .seconds(600))
        let admin = try TestPostgres.store("admin-\(UUID().uuidString.prefix(8))")
        var state = StateStoreConformance.sample(tokens: 10)
        // A process the suite starves can pass even a minute's timeout: each step may be tried again.
        func retrying<T: Sendable>(_ body: () async throws -> T) async throws -> T {
            for _ in 0..<4 { if let value = try? await body() { return value } }
            return try await body()
        }
        let lease = try #require(try await retrying { try await store.lock(Self.holder("runner")) } as? PostgresLease)
        let initial = state
        _ = try await retrying {
            var copy = initial
            return try await store.save(&copy, StateStoreConformance.writeAll(copy), at: 1)
        }
        state = try #require(try await store.load())
        for round in 0..<3 {
            let pids = try await retrying { try await store.connectionPIDs() }
            #expect(pids.count == 2, "the store and its lease have a connection each")
            try await admin.execute("SELECT pg_terminate_backend(pid) FROM unnest(ARRAY\(pids)::int[]) AS pid")
            var renewed = false
            for _ in 0..<5 where !renewed {
                switch await store.renew(lease.id, fence: lease.fence) {
                case .held: renewed = true
                case .unreachable: continue
                case .lost(let why): Issue.record("round \(round): the lease was lost: \(why)")
                }
            }
            #expect(renewed, "round \(round): a renewal after the drop reconnects")
            // A save after the drop may fail (its connection was cut, or timed out), then reconnects.
            var saved = false
            for attempt in 0..<5 where !saved {
                saved = (try? await store.save(&state, StateWrite(), at: Int64(2 + attempt))) != nil
            }
            #expect(saved, "round \(round): a save after the drop reconnects")
        }
        try await retrying { try await lease.ensureHeld() }
        #expect(try await retrying { try await store.lockHolder() } != nil)
        await lease.release()
        await store.close()
        await admin.close()
    }

    /// A lease is held only by work that moves: a run whose work stops moving (no request, no state
    /// written) for longer than the URL's stall limit stops renewing its lease, says so, and stops at its
    /// next request; the lease lapses and another run takes the workspace. Each committed state
    /// transaction counts as the work moving.
    @Test func aLeaseWhoseWorkIsStuckLapses() async throws {
        // A commit moves the work (a lease that cannot lapse here: the suite may starve this process).
        let moving = try TestPostgres.store("moving-\(UUID().uuidString.prefix(8))")
        let held = try #require(try await moving.lock(Self.holder("moving")) as? PostgresLease)
        let activity = try #require(held.activity)
        try await Task.sleep(for: .milliseconds(300))
        let before = ContinuousClock.now
        var state = StateStoreConformance.sample(tokens: 10)
        try await moving.save(&state, StateStoreConformance.writeAll(state), at: 1)
        #expect(try #require(activity.idle()) <= .now - before)
        await held.release()
        await moving.close()

        // Nothing moves under this one: its heartbeat lets it go instead of renewing it.
        let name = "stall-\(UUID().uuidString.prefix(8))"
        var url = try PostgresURL(try #require(TestPostgres.url))
        url.stall = .seconds(1)
        let store = PostgresStateStore(url: url, workspace: name, leaseDuration: .seconds(6))
        let other = try TestPostgres.store(name)
        let lease = try #require(try await store.lock(Self.holder("stuck")) as? PostgresLease)
        // Not renewed, it expires on the server and another run takes the workspace.
        let taken = try await withThrowingTaskGroup(of: Void.self) { group -> (any StateLease)? in
            group.addTask { await lease.keepAlive() }
            defer { group.cancelAll() }
            var taken: (any StateLease)?
            for _ in 0..<600 where taken == nil {
                taken = try? await other.lock(Self.holder("next"))
                if taken == nil { try await Task.sleep(for: .milliseconds(200)) }
            }
            return taken
        }
        let next = try #require(taken)
        // The heartbeat's first look found the work stuck: that, not a renewal, is why it stopped.
        let reason = try #require(lease.lost)
        #expect(reason.code == .leaseLost)
        #expect(reason.description.contains("nothing moved under this run's lease"), "\(reason)")
        #expect(reason.description.contains("stall=1"))
        await #expect(throws: StateStoreError.self) { try await lease.ensureHeld() }
        await next.release()
        await lease.release()
        await store.close()
        await other.close()
    }

    /// The timeout bounds the wait for an answer, not the transaction: four statements of 2 s each
    /// (8 s in all) pass under `timeout=6`, as the first save of millions of tokens (hundreds of
    /// statements) does under the default; one statement of 14 s is cut off, naming the limit. (Each
    /// statement has 4 s to spare: the whole suite runs beside it on two cores.)
    @Test func aLongTransactionWhoseStatementsEachAnswerIsNotCutOff() async throws {
        let base = try #require(TestPostgres.url)
        let url = try PostgresURL(base + (base.contains("?") ? "&" : "?") + "timeout=6")
        let link = PostgresLink(url: url, location: url.display)
        let started = ContinuousClock.now
        let rows = try await link.transaction { c in
            for _ in 0..<4 { try await c.run("SELECT pg_sleep(2)") }
            return try await c.query("SELECT g FROM generate_series(1, 5000) g").collect().count
        }
        #expect(rows == 5000)
        #expect(ContinuousClock.now - started > .seconds(8), "the transaction outlasted the timeout")
        await #expect {
            try await link.transaction { c in try await c.run("SELECT pg_sleep(14)") }
        } throws: { error in
            "\(error)".contains("did not answer within 6 s")
                || "\(error)".contains("no answer within 6 s, but tidemark itself was stopped or starved")
        }
        await link.close()
    }

    /// A server that accepts the connection and never answers: the read ends within the URL's timeout,
    /// naming the server and the setting.
    @Test func aServerThatNeverAnswersEndsWithinTheTimeout() async throws {
        let listener = try SilentListener()
        defer { listener.close() }
        let url = try PostgresURL(
            "postgres://tidemark@127.0.0.1:\(listener.port)/db?sslmode=disable&timeout=2&connect_timeout=2")
        let store = PostgresStateStore(url: url, workspace: "silent")
        let started = ContinuousClock.now
        await #expect { _ = try await store.load() } throws: { error in
            let text = (error as? StateStoreError)?.description ?? "\(error)"
            return text.contains("127.0.0.1:\(listener.port)")
        }
        #expect(ContinuousClock.now - started < .seconds(120), "without a timeout it never ends")
        await store.close()
    }
}

/// An inventory read under a lease: a query the server does not answer in time ends the command
/// within the URL's timeout, naming it, instead of hanging while the lease is renewed.
@Suite(.enabled(if: TestPostgres.enabled)) struct PostgresInventoryFaultTests {
    @Test func anInventoryQueryWithNoAnswerEndsWithinTheTimeout() async throws {
        let base = try #require(TestPostgres.url)
        let url = base + (base.contains("?") ? "&" : "?") + "timeout=2"
        let source = PostgresInventorySource(
            name: "app-db", url: url,
            query: "select 'd' || g as device_id, 'tok' || g as token from generate_series(1, 3) g, pg_sleep(900)")
        var builder = InventoryBuilder()
        let started = ContinuousClock.now
        await #expect { _ = try await source.load(into: &builder) } throws: { error in
            // A test process starved by the suite beside it is told apart, and says so.
            "\(error)".contains("did not answer within 2 s")
                || "\(error)".contains("no answer within 2 s, but tidemark itself was stopped or starved")
        }
        // Bounded: without the timeout the query runs 15 minutes (a starved test process may add seconds).
        #expect(ContinuousClock.now - started < .seconds(120))
        // The server notices the closed connection only when the sleep ends: end it now.
        try await TestPostgres.execute([
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(900)%' AND pid <> pg_backend_pid()"
        ])
    }

    @Test func anInventoryServerThatNeverAnswersEndsWithinTheConnectTimeout() async throws {
        let listener = try SilentListener()
        defer { listener.close() }
        let source = PostgresInventorySource(
            name: "app-db", url: "postgres://app@127.0.0.1:\(listener.port)/app?sslmode=disable&connect_timeout=2",
            query: "select 1")
        var builder = InventoryBuilder()
        let started = ContinuousClock.now
        // Past connect_timeout, in the TCP connect (a full accept queue) or in the start-up after it.
        await #expect { _ = try await source.load(into: &builder) } throws: { error in
            "\(error)".contains("did not answer within 2 s") || "\(error)".contains("connecting timed out")
        }
        #expect(ContinuousClock.now - started < .seconds(120), "without a timeout it never ends")
    }
}

/// A TCP listener on a loopback port that accepts connections and never writes a byte.
final class SilentListener: Sendable {
    let port: Int
    private let socket: Int32

    init() throws {
        let fd = Glibc.socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = 0
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) }
        }
        guard bound == 0, listen(fd, 16) == 0 else { throw POSIXError(.EADDRINUSE) }
        withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { _ = getsockname(fd, $0, &length) }
        }
        port = Int(UInt16(bigEndian: address.sin_port))
        socket = fd
    }

    func close() { _ = Glibc.close(socket) }
}

/// What a lease holder's requests do, from what it knows of its lease (no server needed).
@Suite struct LeaseStandingTests {
    func kind(_ next: LeaseStanding.Next) -> String {
        switch next {
        case .held: "held"
        case .confirm: "confirm"
        case .lost: "lost"
        }
    }

    @Test func oneRequestAsksTheServerAndTheRestGoOnWhileTheLeaseIsSurelyValid() {
        let start = ContinuousClock.now
        let standing = LeaseStanding(duration: .seconds(60), validUntil: start + .seconds(54))
        #expect(kind(standing.next(at: start)) == "held", "fresh")
        let later = start + .seconds(2)
        #expect(kind(standing.next(at: later)) == "confirm", "stale: one request asks the server")
        #expect(kind(standing.next(at: later)) == "held", "the others go on meanwhile")
        standing.confirmed(at: later, remaining: .seconds(60))
        #expect(kind(standing.next(at: later + .milliseconds(500))) == "held", "confirmed")
        // Past the bound the server last granted, every request waits for an answer.
        let past = standing.validUntil + .milliseconds(1)
        #expect(kind(standing.next(at: past)) == "confirm")
        #expect(kind(standing.next(at: past)) == "confirm")
        standing.lose(StateStoreError(.leaseLost, path: "p", "lost"))
        #expect(kind(standing.next(at: later)) == "lost", "a lost lease stays lost")
    }

    /// The server's answer vouches for the lease from when it was asked: one that arrives after the
    /// time it vouches for (the holder paused, SIGSTOP, while it travelled; the lease taken over
    /// meanwhile) lets no request go: the server is asked again, and says the lease is lost.
    @Test func anAnswerThatArrivesAfterTheTimeItVouchesForIsAskedAgain() async throws {
        let lost = { (why: String) in StateStoreError(.leaseLost, path: "p", "lost: \(why)") }
        let late = LeaseStanding(duration: .seconds(3), validUntil: .now)
        let asked = Mutex(0)
        await #expect {
            try await late.ensure(
                ask: {
                    let n = asked.withLock {
                        $0 += 1
                        return $0
                    }
                    guard n == 1 else { return .lost("taken over") }
                    // 'held for 400 ms more' (300 ms of which are the margin), arriving 300 ms later.
                    try? await Task.sleep(for: .milliseconds(300))
                    return .held(remaining: .milliseconds(400))
                }, lost: lost)
        } throws: { ($0 as? StateStoreError)?.description.contains("taken over") == true }
        #expect(asked.withLock { $0 } == 2)

        // An answer in time lets the request go, after one question.
        let prompt = LeaseStanding(duration: .seconds(3), validUntil: .now)
        let once = Mutex(0)
        try await prompt.ensure(
            ask: {
                once.withLock { $0 += 1 }
                return .held(remaining: .seconds(3))
            }, lost: lost)
        #expect(once.withLock { $0 } == 1)
    }
}
