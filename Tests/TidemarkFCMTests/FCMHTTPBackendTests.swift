import AsyncHTTPClient
import Foundation
import Synchronization
import Testing
import TidemarkAuth
import TidemarkCore
import TidemarkEmulator
import TidemarkTesting

@testable import TidemarkFCM

/// tidemark's HTTP client against the emulator on a live socket, over both transports.
@Suite struct FCMHTTPBackendTests {
    static func token(_ i: Int) -> String { "http\(i):APA91bH" + String(repeating: "h", count: 60) }

    func withBackend(
        _ transport: TopicTransport, policy: RetryPolicy = RetryPolicy(baseDelay: .milliseconds(5)),
        configure: (inout FCMHTTPBackend.Options) -> Void = { _ in },
        _ body: (FCMHTTPBackend, EmulatorServer) async throws -> Void
    ) async throws {
        try await AccessTokenProviderTests().withEmulator { server, client in
            let key = try ServiceAccountKey.load(path: server.keyFilePath)
            let base = server.emulator.control.baseURL
            var options = FCMHTTPBackend.Options()
            options.transport = transport
            options.limiter = RateLimiter(rate: 5000)
            options.policy = policy
            options.concurrency = 16
            configure(&options)
            let backend = FCMHTTPBackend(
                kind: .emulator, project: "fcm-test", endpoints: .emulator(host: base),
                client: client, credentials: AccessTokenProvider(key: key, client: client), options: options)
            try await server.emulator.engine.register(
                (0..<40).map { FCMEngine.Instance(token: Self.token($0)) },
                project: "fcm-test")
            try await body(backend, server)
        }
    }

    @Test(arguments: TopicTransport.builtIn)
    func topicsRoundTrip(_ transport: TopicTransport) async throws {
        try await withBackend(transport) { backend, server in
            let tokens = (0..<30).map { Self.token($0) } + ["nobody:APA91bH" + String(repeating: "n", count: 60)]
            let added = try await backend.subscribe(topic: "news", tokens: tokens)
            #expect(added.prefix(30).allSatisfy { $0.isOK })
            #expect(added.last == .failed(.notFound))
            // Again: already subscribed is success.
            #expect(try await backend.subscribe(topic: "news", tokens: [Self.token(0)]) == [.ok])
            #expect(
                Set(await server.emulator.engine.subscribers(of: "news", project: "fcm-test")) == Set(tokens.prefix(30))
            )

            let removed = try await backend.unsubscribe(topic: "news", tokens: Array(tokens.prefix(10)))
            #expect(removed.allSatisfy { $0.isOK })
            let statuses = try await backend.refresh([Self.token(0), Self.token(15), tokens.last!])
            #expect(statuses == [.active(topics: []), .active(topics: ["news"]), .notFound])
        }
    }

    @Test(arguments: TopicTransport.builtIn)
    func retriesThroughInjected429sAnd503s(_ transport: TopicTransport) async throws {
        try await withBackend(transport) { backend, server in
            var faults = FaultSettings()
            faults.http429 = 0.3
            faults.http503 = 0.1
            faults.seed = 11
            server.emulator.control.faults = faults
            let tokens = (0..<40).map { Self.token($0) }
            // Retry-After: 1 from the emulator is honoured, so keep the call count small.
            let outcomes = try await backend.subscribe(
                topic: "flaky", tokens: Array(tokens.prefix(transport == .v1 ? 8 : 40)))
            #expect(outcomes.allSatisfy { $0.isOK })
            server.emulator.control.faults = FaultSettings()
            let statuses = try await backend.refresh(Array(tokens.prefix(transport == .v1 ? 8 : 40)))
            #expect(statuses.allSatisfy { $0 == .active(topics: ["flaky"]) })
        }
    }

    /// The retry loop sleeps on the injected clock: Retry-After is honoured as a floor, and no test time passes.
    @Test func retryLoopUsesTheInjectedClock() async throws {
        let clock = ManualClock(seed: 3)
        try await withBackend(.iid, configure: { $0.timing = clock.timing }) { backend, server in
            var faults = FaultSettings()
            faults.http429 = 0.5
            faults.seed = 5
            server.emulator.control.faults = faults
            for round in 0..<6 {
                let outcomes = try await backend.subscribe(topic: "t\(round)", tokens: [Self.token(round)])
                #expect(outcomes == [.ok])
            }
            let sleeps = clock.sleeps
            #expect(!sleeps.isEmpty, "a 50% 429 rate over six calls must have been retried")
            #expect(sleeps.allSatisfy { $0 >= .seconds(1) }, "the emulator's Retry-After: 1 is a floor: \(sleeps)")
            // Every attempt is a request: six successes plus one per retry.
            #expect(backend.requestCount() == 6 + sleeps.count)
        }
    }

    /// `--qps-unit requests` charges an IID batch once; `tokens` charges every token in it.
    @Test(arguments: QuotaUnit.allCases)
    func quotaUnitDecidesWhatABatchCosts(_ unit: QuotaUnit) async throws {
        let limiter = RateLimiter(rate: 100_000)
        try await withBackend(
            .iid,
            configure: {
                $0.limiter = limiter
                $0.quotaUnit = unit
            }
        ) { backend, _ in
            for round in 0..<3 {
                let outcomes = try await backend.subscribe(topic: "q\(round)", tokens: (0..<40).map { Self.token($0) })
                #expect(outcomes.allSatisfy { $0.isOK })
            }
            // Reads are not subscription changes: a refresh is not charged.
            _ = try await backend.refresh([Self.token(0)])
            #expect(await limiter.charged == (unit == .tokens ? 120 : 3))
            #expect(backend.requestCount() == 4)
        }
    }
}

extension FCMHTTPBackendTests {
    /// `read_qps`: every read (a registration's topics on either transport, a group's key) draws from
    /// its own limiter; writes never do.
    @Test(arguments: TopicTransport.builtIn)
    func readsDrawFromTheReadLimiter(_ transport: TopicTransport) async throws {
        let reads = RateLimiter(rate: 100_000)
        let writes = RateLimiter(rate: 100_000)
        try await withBackend(
            transport,
            configure: {
                $0.readLimiter = reads
                $0.limiter = writes
            }
        ) { backend, _ in
            _ = try await backend.subscribe(topic: "r", tokens: (0..<5).map { Self.token($0) })
            _ = try await backend.refresh((0..<5).map { Self.token($0) })
            _ = try await backend.groupKey(name: "no-such-group")
            #expect(await reads.charged == 6, "5 registrations and 1 group look-up")
            #expect(await writes.charged == 5, "the subscriptions only")
        }
    }

    @Test func validateOnlySendChecksTargetingWithoutDelivering() async throws {
        try await withBackend(.v1) { backend, server in
            _ = try await backend.subscribe(topic: "weather", tokens: [Self.token(1)])
            let name = try await backend.send(
                to: .condition("'weather' in topics && !('news' in topics)"),
                title: "Storm", validateOnly: true)
            #expect(name == "projects/fcm-test/messages/fake_message_id")
            #expect(server.emulator.deliveries.deliveries(project: "fcm-test", token: nil).isEmpty)
            await #expect(throws: FCMHTTPBackend.SendError.self) {
                try await backend.send(to: .condition("\"weather\" in topics"), validateOnly: true)
            }
            let sent = try await backend.send(to: .topic("weather"), body: "Gale warning", validateOnly: false)
            #expect(sent.hasPrefix("projects/fcm-test/messages/") && !sent.hasSuffix("fake_message_id"))
            #expect(
                server.emulator.deliveries.deliveries(project: "fcm-test", token: nil).first?.recipients == [
                    Self.token(1)
                ])
        }
    }

    /// A server that answers its headers, then drips the body a byte every 300 ms for ever: no read
    /// timeout fires, so only the bound on the whole exchange ends the attempt, and the command fails
    /// naming the cause and the setting instead of hanging.
    @Test func aServerThatDripsItsAnswerEndsAtTheExchangeLimit() async throws {
        let drip = try LoopbackServer.drip()
        defer { drip.stop() }
        try await AccessTokenProviderTests().withEmulator { server, client in
            let key = try ServiceAccountKey.load(path: server.keyFilePath)
            var options = FCMHTTPBackend.Options()
            options.exchangeLimit = .seconds(2)
            options.policy = RetryPolicy(baseDelay: .milliseconds(5))
            let backend = FCMHTTPBackend(
                kind: .emulator, project: "fcm-test", endpoints: .emulator(host: "http://127.0.0.1:\(drip.port)"),
                client: client, credentials: AccessTokenProvider(key: key, client: client), options: options)
            let started = ContinuousClock.now
            let error = await #expect(throws: FCMCallError.self) {
                _ = try await backend.refresh([Self.token(1)])
            }
            // Loose: the whole suite can starve this process for tens of seconds; the retry budget is 300 s.
            #expect(ContinuousClock.now - started < .seconds(150), "the 2 s bound, not the retry budget")
            #expect(error?.message.contains("did not answer within 2 s") == true, "\(error?.message ?? "")")
            #expect(error?.message.contains("FCM_EMULATOR_HOST") == true, "\(error?.message ?? "")")
            #expect(drip.accepted() >= 1)
        }
    }
}

extension FCMHTTPBackendTests {
    /// A backend aimed at `server` (not FCM), its access tokens from the emulator, its retries said to
    /// `output` on `clock`.
    func aimedAt(
        _ server: LoopbackServer, client: HTTPClient, emulator: EmulatorServer, clock: ManualClock,
        output: RecordingOutput, policy: RetryPolicy, observer: FCMAttemptObserver? = nil
    ) throws -> FCMHTTPBackend {
        let key = try ServiceAccountKey.load(path: emulator.keyFilePath)
        var options = FCMHTTPBackend.Options()
        options.policy = policy
        options.timing = clock.timing
        options.concurrency = 1
        options.narrator = RetryNarrator(output: output, timing: clock.timing)
        options.observer = observer
        return FCMHTTPBackend(
            kind: .emulator, project: "fcm-test", endpoints: .emulator(host: "http://127.0.0.1:\(server.port)"),
            client: client, credentials: AccessTokenProvider(key: key, client: client), options: options)
    }

    /// A proxy's error page (502, HTML) where FCM should be, before anything answered as FCM: the run
    /// ends after a short retry, naming what answered and the setting, not after the retry budget.
    @Test func anErrorPageWhereFCMShouldBeEndsTheRunAfterAShortRetry() async throws {
        let page = try LoopbackServer.canned(
            status: "502 Bad Gateway", contentType: "text/html", body: "<html><body>Bad gateway</body></html>")
        defer { page.stop() }
        try await AccessTokenProviderTests().withEmulator { emulator, client in
            let clock = ManualClock()
            let backend = try aimedAt(
                page, client: client, emulator: emulator, clock: clock, output: RecordingOutput(),
                policy: RetryPolicy())
            let error = await #expect(throws: FCMCallError.self) { _ = try await backend.refresh([Self.token(1)]) }
            let message = error?.message ?? ""
            #expect(page.accepted() == 3, "three attempts, not five minutes of them")
            #expect(clock.now < .seconds(30))
            #expect(message.contains("HTTP 502"), "\(message)")
            #expect(message.contains("not JSON (text/html)"), "\(message)")
            #expect(message.contains("has answered as FCM"), "\(message)")
            // The token (percent-encoded in the path) shows the fingerprint plans and state show for it.
            #expect(message.contains(Redaction.redact(Self.token(1))), "\(message)")
            #expect(message.contains("FCM_EMULATOR_HOST (now http://127.0.0.1:\(page.port))"), "\(message)")
        }
    }

    /// FCM's own 503 is worth the retry budget, and a wait of more than a few seconds is said: the call,
    /// FCM's status, the attempt, the wait and the setting; then at most one notice every ten seconds.
    @Test func fcmsOwnUnavailableIsRetriedAndTheWaitIsSaid() async throws {
        // Retry-After: 5 makes every wait 5 s, so the first retry is already worth a notice.
        let unavailable = try LoopbackServer.canned(
            status: "503 Service Unavailable", contentType: "application/json", headers: "Retry-After: 5\r\n",
            body: #"{"error":{"code":503,"message":"The service is currently unavailable.","status":"UNAVAILABLE"}}"#)
        defer { unavailable.stop() }
        try await AccessTokenProviderTests().withEmulator { emulator, client in
            let clock = ManualClock()
            let output = RecordingOutput()
            let attempts = Mutex<[FCMAttempt]>([])
            let backend = try aimedAt(
                unavailable, client: client, emulator: emulator, clock: clock, output: output,
                policy: RetryPolicy(baseDelay: .seconds(1), maxDelay: .seconds(4), budget: .seconds(40)),
                observer: { attempt in attempts.withLock { $0.append(attempt) } })
            let error = await #expect(throws: (any Error).self) { _ = try await backend.refresh([Self.token(1)]) }
            #expect(unavailable.accepted() > 3, "FCM's own answer is retried past the short retry")
            // Every attempt is told as it ends: retried with its status class, the last one failed.
            let told = attempts.withLock { $0 }
            #expect(told.count == unavailable.accepted())
            #expect(told.dropLast().allSatisfy { $0.kind == .read && $0.outcome == .retried && $0.code == "5xx" })
            #expect(told.last?.outcome == .failed && told.last?.code == "5xx")
            #expect(told.first?.cause == "HTTP 503 (UNAVAILABLE)")
            #expect(zip(told, told.dropFirst()).allSatisfy { $0.elapsed <= $1.elapsed })
            let notices = output.events.compactMap { if case .retrying(let notice) = $0 { notice } else { nil } }
            #expect(!notices.isEmpty, "\(String(describing: error)); sleeps \(clock.sleeps)")
            #expect(notices.count <= Int(Timing.seconds(clock.now) / 10) + 1, "no more than one every 10 s")
            let first = try #require(notices.first)
            #expect(first.cause == "HTTP 503 (UNAVAILABLE)")
            #expect(
                first.call.hasPrefix("GET http://127.0.0.1:\(unavailable.port)/v1/projects/fcm-test/registrations/"))
            #expect(!first.call.contains(Self.token(1)), "the token is redacted")
            #expect(first.attempt == 1 && first.nextIn == 5)
            #expect(first.setting.contains("FCM_EMULATOR_HOST"))
            // FCM's own 503 says the address is right: the advice is FCM's health, not the host variable.
            #expect(first.answeredByFCM && first.advice.contains("status.firebase.google.com"))
            #expect(!first.advice.contains("FCM_EMULATOR_HOST"))
            var elsewhere = first
            elsewhere.answeredByFCM = false
            #expect(elsewhere.advice == "check \(first.setting)")
        }
    }
}

/// A loopback server that hands every connection, with the request read, to `answer`: it drips a body
/// for ever (`drip`), or answers one fixed answer and closes (`canned`).
final class LoopbackServer: @unchecked Sendable {
    let port: Int
    private let listener: Int32
    private let lock = NSLock()
    private var stopped = false
    private var count = 0
    private let answer: @Sendable (Int32, LoopbackServer) -> Void

    init(answer: @escaping @Sendable (Int32, LoopbackServer) -> Void) throws {
        self.answer = answer
        let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        self.listener = listener
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listener, $0, length) }
        }
        guard bound == 0, listen(listener, 64) == 0 else { throw POSIXError(.EADDRINUSE) }
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(listener, $0, &length) }
        }
        port = Int(UInt16(bigEndian: address.sin_port))
        Thread.detachNewThread { [self] in serve() }
    }

    /// Answers headers, then one body byte every 300 ms, never finishing.
    static func drip() throws -> LoopbackServer {
        try LoopbackServer { connection, server in
            let head = Array(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n".utf8)
            guard send(connection, head, head.count, Int32(MSG_NOSIGNAL)) == head.count else { return }
            while !server.isStopped {
                Thread.sleep(forTimeInterval: 0.3)
                guard send(connection, [UInt8(ascii: " ")], 1, Int32(MSG_NOSIGNAL)) == 1 else { return }
            }
        }
    }

    /// Answers every request with `status` (`502 Bad Gateway`), `contentType`, `headers` and `body`,
    /// and closes.
    static func canned(
        status: String, contentType: String, headers: String = "", body: String
    ) throws
        -> LoopbackServer
    {
        try LoopbackServer { connection, _ in
            let bytes = Array(
                "HTTP/1.1 \(status)\r\nContent-Type: \(contentType)\r\n\(headers)Content-Length: \(body.utf8.count)\r\nConnection: close\r\n\r\n\(body)"
                    .utf8)
            _ = send(connection, bytes, bytes.count, Int32(MSG_NOSIGNAL))
        }
    }

    /// Connections accepted so far.
    func accepted() -> Int { lock.withLock { count } }

    var isStopped: Bool { lock.withLock { stopped } }

    private func serve() {
        while !isStopped {
            let connection = accept(listener, nil, nil)
            guard connection >= 0 else { return }
            lock.withLock { count += 1 }
            Thread.detachNewThread { [self] in
                defer { close(connection) }
                var request = [UInt8](repeating: 0, count: 4096)
                _ = recv(connection, &request, request.count, 0)
                answer(connection, self)
            }
        }
    }

    func stop() {
        lock.withLock { stopped = true }
        shutdown(listener, Int32(SHUT_RDWR))
        close(listener)
    }
}
