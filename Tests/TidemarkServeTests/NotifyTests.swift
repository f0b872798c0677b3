import Crypto
import Foundation
import Hummingbird
import Logging
import ServiceLifecycle
import Synchronization
import Testing
import TidemarkCore
import TidemarkRuntime
import TidemarkTesting

@testable import TidemarkServe

/// A webhook receiver on a free loopback port: it keeps every request, and answers the first
/// `failFirst` with 503.
final class WebhookReceiver: Sendable {
    struct Received: Sendable {
        var headers: [String: String]
        var body: Data
    }

    private let received = Mutex<[Received]>([])
    private let failures: Mutex<Int>
    private let group: Mutex<ServiceGroup?> = Mutex(nil)
    private let task: Mutex<Task<Void, any Error>?> = Mutex(nil)
    private let address = Mutex("")
    /// The address to send to.
    var url: String { address.withLock { $0 } }

    /// Every request so far, in order.
    var requests: [Received] { received.withLock { $0 } }

    init(failFirst: Int = 0) { failures = Mutex(failFirst) }

    func start() async throws {
        let router = Router()
        router.post("/hook") { [self] request, _ -> Response in
            let body = try await request.body.collect(upTo: 1 << 20)
            var headers: [String: String] = [:]
            for field in request.headers { headers[field.name.canonicalName] = field.value }
            received.withLock { $0.append(Received(headers: headers, body: Data(buffer: body))) }
            let fail = failures.withLock { left -> Bool in
                guard left > 0 else { return false }
                left -= 1
                return true
            }
            return Response(status: fail ? .serviceUnavailable : .noContent)
        }
        let (stream, continuation) = AsyncStream.makeStream(of: Int.self)
        let app = Application(
            router: router, configuration: .init(address: .hostname("127.0.0.1", port: 0)),
            onServerRunning: { channel in continuation.yield(channel.localAddress?.port ?? 0) },
            logger: Logger(label: "receiver", factory: { _ in SwiftLogNoOpLogHandler() }))
        let group = ServiceGroup(
            services: [app], logger: Logger(label: "receiver", factory: { _ in SwiftLogNoOpLogHandler() }))
        self.group.withLock { $0 = group }
        task.withLock { $0 = Task { try await group.run() } }
        var iterator = stream.makeAsyncIterator()
        let port = await iterator.next() ?? 0
        address.withLock { $0 = "http://127.0.0.1:\(port)/hook" }
    }

    func stop() async {
        await group.withLock { $0 }?.triggerGracefulShutdown()
        _ = try? await task.withLock { $0 }?.value
    }
}

@Suite struct NotifyTests {
    static let secret = "s3cret-for-tests"

    @Test func notifyEntriesAreReadAndTheirMistakesNamedByLine() throws {
        let text = """
            project: tidemark-test
            serve:
              interval: 1m
              notify:
                - url: https://hooks.example.com/T000/secret-path
                  secret_env: HOOK_SECRET
                  events: [blocked, apply_failed]
                - name: oncall
                  url_env: ONCALL_URL
                  secret_env: ONCALL_SECRET
                  renotify: 1h
            """
        let (settings, diagnostics) = ProjectSettings.decode(text, file: "tidemark.yaml")
        #expect(!diagnostics.hasErrors, "\(diagnostics)")
        let serve = try #require(settings.serve)
        #expect(serve.workspaces.isEmpty && serve.defaults.interval == .seconds(60))
        #expect(serve.notify.map(\.name) == ["hooks.example.com", "oncall"])
        #expect(serve.notify[0].events == [.blocked, .applyFailed] && serve.notify[0].location.line == 5)
        #expect(serve.notify[1].renotify == .seconds(3600) && serve.notify[1].events.count == 7)

        let mistakes: [(String, Int, String)] = [
            ("serve:\n  notify:\n    - url: https://x.example\n", 3, "needs 'secret_env'"),
            ("serve:\n  notify:\n    - secret_env: S\n", 3, "exactly one of 'url'"),
            (
                "serve:\n  notify:\n    - url: https://x.example\n      secret_env: S\n      events: [blokced]\n", 5,
                "did you mean 'blocked'"
            ),
            ("serve:\n  notify:\n    - url: ftp://x\n      secret_env: S\n", 3, "http:// or https://"),
            ("serve:\n  notify:\n    - url_env: A\n      secret_env: the secret\n", 4, "names an environment variable"),
            ("serve:\n  notify:\n    - url_env: A\n      secret_env: S\n      renotify: 5s\n", 5, "at least 1m"),
            (
                "serve:\n  notify:\n    - url_env: A\n      secret_env: S\n      workspaces: [prod]\n  workspaces:\n    - name: staging\n",
                3, "does not list"
            ),
        ]
        for (text, line, says) in mistakes {
            let errors = ProjectSettings.decode(text, file: "tidemark.yaml").1.filter { $0.severity == .error }
            #expect(errors.count == 1 && errors.first?.location?.line == line, "\(text): \(errors)")
            #expect(errors.first?.message.contains(says) == true, "\(errors.first?.message ?? "none")")
        }
    }

    @Test func anUnsetVariableOfAWebhookIsAnErrorNamingTheFileAndLine() throws {
        let (settings, _) = ProjectSettings.decode(
            "serve:\n  notify:\n    - url_env: HOOK_URL\n      secret_env: HOOK_SECRET\n", file: "tidemark.yaml")
        let targets = try #require(settings.serve?.notify)
        #expect {
            try Notifier.targets(targets, environment: ["HOOK_URL": "https://x.example/h"])
        } throws: { error in
            "\(error)".contains("tidemark.yaml:3") && "\(error)".contains("HOOK_SECRET")
        }
        #expect {
            try Notifier.targets(targets, environment: ["HOOK_URL": "not a url", "HOOK_SECRET": "s"])
        } throws: { error in "\(error)".contains("http:// or https://") }
        let resolved = try Notifier.targets(
            targets, environment: ["HOOK_URL": "https://x.example/h", "HOOK_SECRET": "s"])
        #expect(resolved.map(\.url) == ["https://x.example/h"])
    }

    /// HMAC-SHA256 of `1700000000.{"a":1}` under `secret`, as Python's hmac module computes it.
    @Test func theSignatureIsHMACSHA256OfTheTimestampAndTheBody() {
        let signature = Notifier.signature(
            body: Data(#"{"a":1}"#.utf8), timestamp: 1_700_000_000, secret: SymmetricKey(data: Data("secret".utf8)))
        #expect(signature == "sha256=49f24e537407743fa4a0242bb63b94b9a47ee99cbbe071ccd8a22550ae411686")
    }

    /// The Standard Webhooks specification's own test vector, and a delivery signed that way: one
    /// `v1,` signature per secret (a rotation), over `ID.TIMESTAMP.BODY`, with the delivery's id.
    @Test func standardWebhooksSignaturesMatchTheSpecAndSignWithEverySecret() async throws {
        let key = try #require(Data(base64Encoded: "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"))
        #expect(
            Notifier.standardSignature(
                id: "msg_p5jXN8AQM9LWM0D4loKWxJek", body: Data(#"{"test": 2432232314}"#.utf8),
                timestamp: 1_614_265_330, keys: [SymmetricKey(data: key)])
                == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
        let (settings, diagnostics) = ProjectSettings.decode(
            "serve:\n  notify:\n    - url_env: HOOK_URL\n      secret_env: HOOK_SECRET\n      signature: standard\n",
            file: "tidemark.yaml")
        #expect(diagnostics.isEmpty, "\(diagnostics)")
        let entries = try #require(settings.serve?.notify)
        let (typo, problems) = ProjectSettings.decode(
            "serve:\n  notify:\n    - url_env: HOOK_URL\n      secret_env: HOOK_SECRET\n      signature: svix\n",
            file: "tidemark.yaml")
        #expect(typo.serve?.notify.isEmpty != false)
        #expect(problems.contains { $0.description.contains("tidemark.yaml:5") && $0.description.contains("'svix'") })
        #expect {
            try Notifier.targets(entries, environment: ["HOOK_URL": "https://x.example/h", "HOOK_SECRET": "plain"])
        } throws: { error in "\(error)".contains("whsec_") && !"\(error)".contains("plain") }

        let receiver = WebhookReceiver()
        try await receiver.start()
        defer { Task { await receiver.stop() } }
        let old = "whsec_" + Data("old-secret-0123456789".utf8).base64EncodedString()
        let new = "whsec_" + Data("new-secret-0123456789".utf8).base64EncodedString()
        let targets = try Notifier.targets(
            entries, environment: ["HOOK_URL": receiver.url, "HOOK_SECRET": "\(old) \(new)"])
        let target = try #require(targets.first)
        #expect(target.keys.count == 2)
        let event = ServeEvent(
            event: .blocked, workspace: "prod", detail: "rail.max_unsubscribes", reason: "rail.max_unsubscribes",
            summary: "blocked", commit: nil, replica: "r", occurredAt: Date(timeIntervalSince1970: 1_800_000_000))
        let outcome = await Notifier.post(
            event, id: "delivery-1", url: target.url, secret: target.secret, standard: target.keys, attempts: 1,
            requestTimeout: .seconds(10), timing: .live)
        #expect(outcome.deliveredAt == 1, "\(outcome.problem)")
        let delivery = try #require(receiver.requests.first)
        #expect(delivery.headers["webhook-id"] == "delivery-1" && delivery.headers["x-tidemark-signature"] == nil)
        let timestamp = try #require(delivery.headers["webhook-timestamp"].flatMap { Int64($0) })
        let signatures = (delivery.headers["webhook-signature"] ?? "").split(separator: " ").map(String.init)
        for secret in [old, new] {
            let key = SymmetricKey(data: try #require(Data(base64Encoded: String(secret.dropFirst(6)))))
            var signed = Data("delivery-1.\(timestamp).".utf8)
            signed.append(delivery.body)
            let expected = "v1," + Data(HMAC<SHA256>.authenticationCode(for: signed, using: key)).base64EncodedString()
            #expect(signatures.contains(expected), "\(signatures)")
        }
    }

    @Test func anOngoingProblemIsToldOnceThenAfterRenotifyAndAgainWhenItComesBack() throws {
        var target = NotifyTarget(
            name: "hook", location: SourceLocation(file: "tidemark.yaml", line: 1, column: 1),
            url: "https://x.example", secretEnv: "S")
        target.renotify = .seconds(3600)
        var blocked = ReconcileResult(outcome: .blocked, startedAt: Date(timeIntervalSince1970: 0), seconds: 1)
        blocked.reason = "rail.max_unsubscribes"
        blocked.message = "the plan would unsubscribe 6, more than max_unsubscribes (2)."
        var ledger = NotifyLedger()
        let start = Date(timeIntervalSince1970: 1_000_000)
        func events(_ result: ReconcileResult) -> [ServeEvent] {
            ServeEvent.events(of: result, workspace: "prod", replica: "r", troubled: ledger.troubled)
        }
        let first = ledger.due(events(blocked), targets: [target], now: start)
        #expect(first.map(\.1.event) == [.blocked] && first[0].1.dedupeKey == "prod/blocked/rail.max_unsubscribes")
        // The same problem with other numbers is the same problem.
        blocked.message = "the plan would unsubscribe 7, more than max_unsubscribes (2)."
        #expect(ledger.due(events(blocked), targets: [target], now: start.addingTimeInterval(600)).isEmpty)
        #expect(ledger.due(events(blocked), targets: [target], now: start.addingTimeInterval(3600)).count == 1)
        // A success ends it (told as recovered); when it comes back, it is told at once.
        let success = ReconcileResult(outcome: .success, startedAt: start, seconds: 1)
        let recovered = ledger.due(events(success), targets: [target], now: start.addingTimeInterval(3700))
        #expect(recovered.map(\.1.event) == [.recovered])
        #expect(ledger.due(events(success), targets: [target], now: start.addingTimeInterval(3800)).isEmpty)
        #expect(ledger.due(events(blocked), targets: [target], now: start.addingTimeInterval(3900)).count == 1)
        // A target whose name holds a space keeps its ledger all the same.
        var spaced = target
        spaced.name = "on call"
        var named = NotifyLedger()
        #expect(named.due(events(blocked), targets: [spaced], now: start).count == 1)
        #expect(named.due(events(blocked), targets: [spaced], now: start.addingTimeInterval(600)).isEmpty)
        // A reconcile that waited out a person's apply holding the state lock is not a failure to page
        // for; a second in a row is (the lock is held for long).
        var locked = ReconcileResult(outcome: .failure, startedAt: start, seconds: 120)
        locked.reason = "state_locked"
        locked.message = "the state is locked by tidemark apply (ana@laptop)"
        #expect(ServeEvent.events(of: locked, workspace: "prod", replica: "r", troubled: false, failures: 1).isEmpty)
        #expect(
            ServeEvent.events(of: locked, workspace: "prod", replica: "r", troubled: false, failures: 2).map(\.event)
                == [.applyFailed])
        #expect(WorkspaceMachine.level(of: locked) == .warning)
        // A replica that stalled and lost its lease to the new owner does not page: the new owner tells.
        var fenced = locked
        fenced.reason = "lease_lost"
        #expect(ServeEvent.events(of: fenced, workspace: "prod", replica: "r", troubled: false, failures: 3).isEmpty)
        #expect(WorkspaceMachine.level(of: fenced) == .warning)
        // A deadline is sent once per renotify, even when reconciles in between (batches of changed
        // devices, failures) do not raise it.
        var deadlines = NotifyLedger()
        var whole = ReconcileResult(outcome: .success, startedAt: start, seconds: 1)
        whole.deadlines = [.init(code: "deadline.device_groups", message: "device groups end on 29 Sep 2027")]
        let batch = ReconcileResult(outcome: .success, startedAt: start, seconds: 1)
        var told = 0
        for minute in 0..<120 {
            let result = minute % 3 == 0 ? whole : batch
            told +=
                deadlines.due(events(result), targets: [target], now: start.addingTimeInterval(Double(minute * 60)))
                .filter { $0.1.event == .deadlineApproaching }.count
        }
        #expect(told == 2, "once per hour's renotify over two hours, not at each whole reconcile")
        // Changes that wait say why: the sync windows (until when), or on_change: plan.
        var waiting = ReconcileResult(outcome: .success, startedAt: start, seconds: 1)
        waiting.changesWaiting = 4
        let planned = ServeEvent.events(of: waiting, workspace: "prod", replica: "r", troubled: false)
        #expect(planned.map(\.event) == [.changesWaiting] && planned[0].summary.contains("(on_change: plan)"))
        waiting.windowClosed = true
        waiting.windowOpensAt = Date(timeIntervalSince1970: 1_800_000_000)
        let held = ServeEvent.events(of: waiting, workspace: "prod", replica: "r", troubled: false)
        #expect(
            held.first?.summary.contains("waiting for the sync windows (closed until 2027-01-15T08:00:00Z)") == true
                && held.first?.summary.contains("on_change") == false, "\(held)")
        // A target that does not want the event, or the workspace, hears nothing.
        target.events = [.applyFailed]
        var other = NotifyLedger()
        #expect(
            other.due(
                ServeEvent.events(of: blocked, workspace: "prod", replica: "r", troubled: false), targets: [target],
                now: start
            ).isEmpty)
    }

    @Test func aBlockedWorkspaceSendsOneSignedWebhookRetriedPastAnOutageAndOneRecovered() async throws {
        let receiver = WebhookReceiver(failFirst: 2)
        try await receiver.start()
        let project = try ServeProject()
        defer { project.remove() }
        try project.writeDevices(Array(0..<10))
        #expect(try await project.reconciler().reconcile().outcome == .success)
        // Six phones become tablets: six unsubscriptions, past a rail of 2.
        try project.writeDevices(Array(0..<10), phones: [0, 1, 2, 3])

        var target = NotifyTarget(
            name: "hook", location: SourceLocation(file: "tidemark.yaml", line: 1, column: 1), url: receiver.url,
            secretEnv: "S")
        target.events = [.blocked, .recovered]
        let metrics = ServeMetrics()
        let notifier = Notifier(
            targets: try Notifier.targets([target], environment: ["S": Self.secret]), timing: .live,
            metrics: metrics, log: ServeLog(lines: { _ in }))
        let sending = Task { try await notifier.run() }
        let reconciles = Mutex(0)
        let flags = project.flags
        var settings = ServeSettings()
        settings.interval = .milliseconds(200)
        settings.maxUnsubscribes = try UnsubscribeLimit(parsing: "2")
        let runner = WorkspaceRunner(
            status: Serve.initialStatus(try project.runtime(), settings: settings),
            reconciler: Reconciler(
                runtime: try Runtime.load(flags, environment: [:]), settings: settings),
            ownership: .init(records: InMemoryStateStore(workspace: "default"), replica: "r1", poll: .milliseconds(50)),
            metrics: metrics, notifier: notifier,
            log: ServeLog(lines: { line in if line.hasPrefix("reconcile ") { reconciles.withLock { $0 += 1 } } }))
        let running = Task { try await runner.run() }
        // The one event is retried past two 503s (1 s, then 2 s later); meanwhile several reconciles
        // find the same blocked plan, and raise no second event.
        try await waitUntil { receiver.requests.count >= 3 }
        let before = reconciles.withLock { $0 }
        try await waitUntil { reconciles.withLock { $0 } >= before + 3 }
        #expect(runner.status.last?.outcome == .blocked)
        let requests = receiver.requests
        #expect(requests.count == 3, "\(requests.map { String(decoding: $0.body, as: UTF8.self) })")
        let delivery = try #require(requests.last)
        #expect(Set(requests.map { $0.headers["x-tidemark-delivery"] ?? "" }).count == 1)
        let timestamp = try #require(delivery.headers["x-tidemark-timestamp"].flatMap { Int64($0) })
        #expect(
            delivery.headers["x-tidemark-signature"]
                == Notifier.signature(
                    body: delivery.body, timestamp: timestamp, secret: SymmetricKey(data: Data(Self.secret.utf8))))
        #expect(delivery.headers["x-tidemark-event"] == "blocked")
        let body = try #require(JSONSerialization.jsonObject(with: delivery.body) as? [String: Any])
        #expect(body["workspace"] as? String == "default" && body["reason"] as? String == "rail.max_unsubscribes")
        #expect(body["dedupe_key"] as? String == "default/blocked/rail.max_unsubscribes")
        #expect((body["summary"] as? String)?.contains("blocked") == true)
        #expect(!String(decoding: delivery.body, as: UTF8.self).contains(Fixtures.token(0)))

        // Put back as it was: the next reconcile succeeds, told once as recovered.
        try project.writeDevices(Array(0..<10))
        try await waitUntil { receiver.requests.count >= 4 }
        try await Task.sleep(for: .milliseconds(600))
        #expect(receiver.requests.count == 4)
        #expect(receiver.requests.last?.headers["x-tidemark-event"] == "recovered")
        let exposition = String(decoding: metrics.exposition(), as: UTF8.self)
        #expect(
            exposition.contains(#"tidemark_notifications_total{target="hook",event="blocked",outcome="delivered"} 1"#))

        running.cancel()
        _ = try? await running.value
        sending.cancel()
        _ = try? await sending.value
        await receiver.stop()
    }

    @Test func aWebhookThatIsDownNeverStopsReconcilingAndIsRaisedAgain() async throws {
        // A port nothing listens on: bound, then closed.
        let receiver = WebhookReceiver()
        try await receiver.start()
        let url = receiver.url
        await receiver.stop()
        let project = try ServeProject()
        defer { project.remove() }
        try project.writeDevices([0, 1])
        try project.writeDevices([0, 1], topics: ServeProject.phones + "\n    protect: true")
        #expect(try await project.reconciler().reconcile().outcome == .success)
        try project.writeDevices([0, 1], topics: ServeProject.phones.replacingOccurrences(of: "phones", with: "other"))

        let target = NotifyTarget(
            name: "down", location: SourceLocation(file: "tidemark.yaml", line: 1, column: 1), url: url,
            secretEnv: "S")
        let lines = Mutex<[String]>([])
        let metrics = ServeMetrics()
        let notifier = Notifier(
            targets: try Notifier.targets([target], environment: ["S": "x"]), timing: .live, metrics: metrics,
            attempts: 2, requestTimeout: .seconds(2),
            log: ServeLog(lines: { line in lines.withLock { $0.append(line) } }))
        let sending = Task { try await notifier.run() }
        var settings = ServeSettings()
        settings.interval = .milliseconds(300)
        let flags = project.flags
        let runner = WorkspaceRunner(
            status: Serve.initialStatus(try project.runtime(), settings: settings),
            reconciler: Reconciler(runtime: try Runtime.load(flags, environment: [:]), settings: settings),
            ownership: .init(records: InMemoryStateStore(workspace: "default"), replica: "r1", poll: .milliseconds(50)),
            metrics: metrics, notifier: notifier, log: ServeLog(lines: { line in lines.withLock { $0.append(line) } }))
        let running = Task { try await runner.run() }
        // Two deliveries given up (each after its retry), while reconciles go on.
        try await waitUntil {
            lines.withLock { $0.filter { $0.contains("not delivered after 2 attempts") }.count >= 2 }
        }
        let reconciles = lines.withLock { $0.filter { $0.hasPrefix("reconcile ") }.count }
        #expect(reconciles >= 3)
        // The protected topic is held (the rest applied), and its `blocked` event raised.
        #expect(runner.status.last?.outcome == .success)
        #expect(runner.status.held?.map(\.subject) == [Targets.Subject(.topic, "phones")])
        #expect(!lines.withLock { $0.joined() }.contains("/hook"))
        let exposition = String(decoding: metrics.exposition(), as: UTF8.self)
        #expect(exposition.contains(#"tidemark_notifications_total{target="down",event="blocked",outcome="failed"}"#))
        running.cancel()
        _ = try? await running.value
        sending.cancel()
        _ = try? await sending.value
    }

    private func waitUntil(seconds: Double = 60, _ condition: () -> Bool) async throws {
        let end = ContinuousClock.now + .seconds(seconds)
        while !condition() {
            guard ContinuousClock.now < end else {
                Issue.record("condition not met within \(seconds) s")
                return
            }
            try await Task.sleep(for: .milliseconds(20))
        }
    }
}
