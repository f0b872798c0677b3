import AsyncHTTPClient
import Crypto
import Foundation
import NIOCore
import ServiceLifecycle
import Synchronization
import TidemarkCore
import TidemarkRuntime

/// Something `serve` tells webhooks about: the JSON body of one delivery.
public struct ServeEvent: Sendable, Codable, Equatable {
    /// What happened.
    public var event: NotifyTarget.Event
    /// The workspace it happened in.
    public var workspace: String
    /// The same for as long as the problem is the same: the event, the workspace and the reason (or
    /// the drift's kinds), never a duration or a count, so one ongoing problem is one notification.
    public var dedupeKey: String
    /// Why, in a stable word (`rail.max_unsubscribes`, `state_unreachable`…), when there is one.
    public var reason: String?
    /// One sentence for a person, with no link and no token.
    public var summary: String
    /// The numbers behind it: `subscribed`, `unsubscribed`, `changes_waiting`, drift by kind…
    public var counts: [String: Int]
    /// The manifests' commit the reconcile used, when they come from git.
    public var commit: String?
    /// The replica that sent it.
    public var replica: String
    /// When the reconcile that found it ended.
    public var occurredAt: Date

    /// The events a reconcile's `result` raises in `workspace`; `troubled` says whether the workspace
    /// was failing or blocked (or held a topic) before, so that a success that holds nothing is told
    /// as `recovered`. `failures` is the
    /// failures in a row, `result` included: a reconcile that waited out its wait for the state lock
    /// (a person's apply, taking longer) raises `apply_failed` only from the second in a row, and one
    /// that lost its lease to a replica that took the workspace over raises none (the new owner tells).
    public static func events(
        of result: ReconcileResult, workspace: String, replica: String, troubled: Bool, failures: Int = 1
    ) -> [ServeEvent] {
        func event(
            _ kind: NotifyTarget.Event, _ detail: String?, _ summary: String, _ counts: [String: Int]
        )
            -> ServeEvent
        {
            ServeEvent(
                event: kind, workspace: workspace, detail: detail,
                reason: kind == .applyFailed || kind == .blocked ? result.reason : detail, summary: summary,
                counts: counts, commit: result.commit, replica: replica, occurredAt: result.finishedAt)
        }
        var events: [ServeEvent] = []
        let drift = (result.drift ?? [:]).filter { $0.value > 0 }
        switch result.outcome {
        case .failure where result.reason == FailureReason.stateLocked.rawValue && failures < 2:
            break
        case .failure where result.reason == FailureReason.leaseLost.rawValue:
            // This replica stalled and another took the workspace (and the lock) over: the new owner
            // reconciles it and tells what it finds; a second page for the same moment is noise.
            break
        case .failure:
            events.append(
                event(
                    .applyFailed, result.reason, "Workspace '\(workspace)': the reconcile failed: \(result.summary)",
                    ["subscribed": result.subscribed, "unsubscribed": result.unsubscribed]))
        case .blocked:
            events.append(
                event(
                    .blocked, result.reason,
                    "Workspace '\(workspace)' is blocked: \(result.summary) Nothing was applied; it stays blocked until a person runs 'tidemark apply' or raises the rail.",
                    ["changes_waiting": result.changesWaiting]))
        case .success:
            // Recovered once nothing is wrong: a topic still held (a batch of changed devices beside
            // it, a failure that ended with the hold still there) keeps the workspace troubled.
            if troubled, (result.held ?? []).isEmpty {
                events.append(
                    ServeEvent(
                        event: .recovered, workspace: workspace,
                        dedupeKey: "\(workspace)/recovered", reason: nil,
                        summary: "Workspace '\(workspace)' reconciled again: \(result.summary).",
                        counts: ["subscribed": result.subscribed, "unsubscribed": result.unsubscribed],
                        commit: result.commit, replica: replica, occurredAt: result.finishedAt))
            }
        }
        for hold in result.held ?? [] {
            // One event per held topic or group: its key names it, so each is sent once per renotify.
            let at = hold.at.map { " (\($0))" } ?? ""
            events.append(
                ServeEvent(
                    event: .blocked, workspace: workspace, detail: hold.subject.dedupeWord, reason: hold.rail,
                    summary:
                        "Workspace '\(workspace)': \(hold.subject.kind.rawValue) '\(hold.subject.name)' is held by \(hold.rail)\(at): \(hold.message) Its changes wait; everything else is applied. It is released when its plan passes the rail.",
                    counts: [:], commit: result.commit, replica: replica, occurredAt: result.finishedAt))
        }
        if result.driftFound > 0 {
            let kinds = drift.keys.filter { $0 != DriftReport.Kind.optedOut.rawValue }.sorted()
            if result.driftHealed {
                events.append(
                    event(
                        .driftHealed, nil,
                        "Workspace '\(workspace)': \(PlanRenderer.counted(result.driftFound, "drifted membership")) healed (\(kinds.joined(separator: ", "))).",
                        drift))
            } else {
                events.append(
                    event(
                        .driftFound, kinds.joined(separator: "+"),
                        "Workspace '\(workspace)': \(PlanRenderer.counted(result.driftFound, "drifted membership")) found (\(kinds.joined(separator: ", "))) and left alone (drift: warn).",
                        drift))
            }
        }
        if result.outcome == .success, result.changesWaiting > 0 {
            // Why they wait: the sync windows are closed (they are applied when one opens), or on_change: plan.
            let why: String
            if result.windowClosed {
                let opens = result.windowOpensAt.map { " until \(ISO8601DateFormatter().string(from: $0))" } ?? ""
                why =
                    "planned and waiting for the sync windows (closed\(opens)); they are applied when a window opens, or now by 'tidemark apply'."
            } else {
                why =
                    "planned and waiting for a person (on_change: plan); 'tidemark plan' shows them and 'tidemark apply' makes them."
            }
            events.append(
                event(
                    .changesWaiting, result.commit,
                    "Workspace '\(workspace)': \(PlanRenderer.counted(result.changesWaiting, "change")) \(why)",
                    ["changes_waiting": result.changesWaiting]))
        }
        for notice in result.deadlines {
            events.append(
                event(.deadlineApproaching, notice.code, "Workspace '\(workspace)': \(notice.message)", [:]))
        }
        return events
    }
}

extension ServeEvent {
    /// An event whose dedupe key is the workspace, the event and `detail` (a reason, or the drift's
    /// kinds): what stays the same for as long as the problem does. `serve` and `tidemark notify`
    /// make theirs here.
    init(
        event: NotifyTarget.Event, workspace: String, detail: String?, reason: String?, summary: String,
        counts: [String: Int] = [:], commit: String?, replica: String, occurredAt: Date
    ) {
        self.event = event
        self.workspace = workspace
        dedupeKey = ([workspace, event.rawValue] + [detail].compactMap { $0 }).joined(separator: "/")
        self.reason = reason
        self.summary = summary
        self.counts = counts
        self.commit = commit
        self.replica = replica
        self.occurredAt = occurredAt
    }
}

/// What `serve` remembers of the notifications it sent for one workspace (published with its status,
/// so that a replica taking the workspace over does not send them again).
public struct NotifyLedger: Sendable, Codable, Equatable {
    /// When each ongoing problem was last sent to each target, by `target name` + space + dedupe key.
    public var sent: [String: Date] = [:]
    /// The dedupe keys the last reconcile raised.
    public var active: [String] = []

    /// An empty ledger.
    public init() {}

    /// The entry of `sent` for `event` told to `target`: the target's name, a space, the dedupe key.
    static func entry(_ target: NotifyTarget, _ event: ServeEvent) -> String { "\(target.name) \(event.dedupeKey)" }

    /// The dedupe key of an entry of `sent`: what follows its last space (a target's name may hold
    /// spaces; a dedupe key, made of a workspace name and stable words, holds none).
    static func dedupeKey(ofEntry entry: String) -> String {
        entry.lastIndex(of: " ").map { String(entry[entry.index(after: $0)...]) } ?? entry
    }

    /// Whether the last reconcile left the workspace failing or blocked.
    public var troubled: Bool {
        active.contains { $0.contains("/\(NotifyTarget.Event.applyFailed.rawValue)") || $0.contains("/blocked") }
    }

    /// The deliveries `events` call for to `targets` at `now`: each ongoing problem once, then again
    /// after its target's `renotify`; recorded as sent. Problems no longer raised are forgotten, so one
    /// that comes back is sent again at once; a deadline is kept until its renotify (it does not end
    /// when a reconcile that plans nothing whole does not raise it).
    public mutating func due(_ events: [ServeEvent], targets: [NotifyTarget], now: Date) -> [(NotifyTarget, ServeEvent)]
    {
        var due: [(NotifyTarget, ServeEvent)] = []
        for event in events {
            for target in targets where target.wants(event.event, workspace: event.workspace) {
                let id = Self.entry(target, event)
                if event.event != .recovered, let last = sent[id],
                    now.timeIntervalSince(last) < Timing.seconds(target.renotify)
                {
                    continue
                }
                if event.event != .recovered { sent[id] = now }
                due.append((target, event))
            }
        }
        let keys = Set(events.filter { $0.event != .recovered }.map(\.dedupeKey))
        sent = sent.filter { id, at in
            let key = Self.dedupeKey(ofEntry: id)
            if keys.contains(key) { return true }
            // A deadline does not end when a reconcile does not raise it (a batch of changed devices or a
            // failure plans nothing whole): it is kept until its target's renotify, so it is sent once per
            // renotify whatever the reconciles in between were.
            guard key.contains("/\(NotifyTarget.Event.deadlineApproaching.rawValue)/"),
                let target = targets.first(where: { id.hasPrefix($0.name + " ") })
            else { return false }
            return now.timeIntervalSince(at) < Timing.seconds(target.renotify)
        }
        active = keys.sorted()
        return due
    }
}

/// Sends `serve`'s events to the webhooks of `serve.notify`: a JSON body signed with HMAC-SHA256,
/// retried with backoff, in the background, so a webhook that is down never holds up a reconcile.
///
/// Each request carries `X-Tidemark-Timestamp` (seconds since 1970) and `X-Tidemark-Signature:
/// sha256=HEX`, the HMAC-SHA256 of `TIMESTAMP.BODY` under the target's secret, with
/// `X-Tidemark-Event` and `X-Tidemark-Delivery` (an id that stays the same over the retries).
public final class Notifier: Service, Sendable {
    /// A webhook with its address and secret read from the environment.
    public struct Target: Sendable {
        /// As tidemark.yaml writes it.
        public var settings: NotifyTarget
        /// Where to send.
        public var url: String
        /// The signing key (with `signature: standard`, the first of `keys`).
        public var secret: SymmetricKey
        /// With `signature: standard`, every key a delivery is signed with (a rotation's old and new).
        public var keys: [SymmetricKey] = []
    }

    struct Delivery: Sendable {
        var target: Target
        var event: ServeEvent
        var id: String
        var givenUp: @Sendable () -> Void
    }

    /// The targets, in the file's order (replaced when the settings are reloaded).
    public var targets: [Target] { current.withLock { $0 } }
    private let current: Mutex<[Target]>
    private let timing: Timing
    private let log: ServeLog
    private let metrics: ServeMetrics
    private let stream: AsyncStream<Delivery>
    private let continuation: AsyncStream<Delivery>.Continuation
    /// How many attempts a delivery gets (the first, then retries after 1 s, 2 s, 4 s… at most 60 s apart).
    let attempts: Int
    /// How long one attempt may take.
    let requestTimeout: Duration

    /// A notifier for `targets`, waiting by `timing`.
    public init(
        targets: [Target], timing: Timing, metrics: ServeMetrics, attempts: Int = 8,
        requestTimeout: Duration = .seconds(10), log: ServeLog
    ) {
        self.current = Mutex(targets)
        self.timing = timing
        self.metrics = metrics
        self.attempts = attempts
        self.requestTimeout = requestTimeout
        self.log = log
        (stream, continuation) = AsyncStream.makeStream(of: Delivery.self)
        for target in targets {
            metrics.declareNotifications(target: target.settings.name, events: target.settings.events)
        }
    }

    /// Reloaded settings: later events go to `targets` (deliveries under way finish).
    public func update(_ targets: [Target]) {
        for target in targets {
            metrics.declareNotifications(target: target.settings.name, events: target.settings.events)
        }
        current.withLock { $0 = targets }
    }

    /// The targets of `settings`, with their address and secret read from `environment`; an unset
    /// variable is an error naming the file and line.
    public static func targets(_ settings: [NotifyTarget], environment: [String: String]) throws -> [Target] {
        try settings.map { target in
            func value(_ variable: String, _ what: String) throws -> String {
                guard let value = environment[variable], !value.isEmpty else {
                    throw RuntimeError(
                        "\(target.location): webhook '\(target.name)' takes its \(what) from the environment variable \(variable), which is not set."
                    )
                }
                return value
            }
            let url = try target.url ?? value(target.urlEnv ?? "", "address ('url_env')")
            if target.url == nil, let problem = NotifyTarget.urlProblem(url) {
                throw RuntimeError(
                    "\(target.location): webhook '\(target.name)': the address in \(target.urlEnv ?? "") \(problem).")
            }
            let secret = try value(target.secretEnv, "signing secret ('secret_env')")
            guard target.signature == .standard else {
                return Target(settings: target, url: url, secret: SymmetricKey(data: Data(secret.utf8)))
            }
            let keys = try secret.split(whereSeparator: \.isWhitespace).map { word -> SymmetricKey in
                guard word.hasPrefix("whsec_"), let key = Data(base64Encoded: String(word.dropFirst(6))), !key.isEmpty
                else {
                    throw RuntimeError(
                        "\(target.location): webhook '\(target.name)' signs as Standard Webhooks, so \(target.secretEnv) must hold one or more secrets 'whsec_' + base64, separated by spaces; one of them is not."
                    )
                }
                return SymmetricKey(data: key)
            }
            guard let first = keys.first else {
                throw RuntimeError("\(target.location): webhook '\(target.name)': \(target.secretEnv) holds no secret.")
            }
            return Target(settings: target, url: url, secret: first, keys: keys)
        }
    }

    /// The settings of the targets.
    public var settings: [NotifyTarget] { targets.map(\.settings) }

    /// Queues `event` for `target`; `givenUp` runs when every attempt failed.
    func send(_ event: ServeEvent, to target: NotifyTarget, givenUp: @escaping @Sendable () -> Void) {
        guard let resolved = targets.first(where: { $0.settings.name == target.name }) else { return }
        continuation.yield(Delivery(target: resolved, event: event, id: UUID().uuidString, givenUp: givenUp))
    }

    /// The signature header's value for `body` sent at `timestamp` under `secret`: `sha256=HEX`.
    public static func signature(body: Data, timestamp: Int64, secret: SymmetricKey) -> String {
        var signed = Data("\(timestamp).".utf8)
        signed.append(body)
        let mac = HMAC<SHA256>.authenticationCode(for: signed, using: secret)
        return "sha256=" + mac.map { String(format: "%02x", $0) }.joined()
    }

    /// The Standard Webhooks `webhook-signature` value for `body` of delivery `id` sent at `timestamp`:
    /// `v1,BASE64` for each of `keys`, separated by spaces.
    public static func standardSignature(id: String, body: Data, timestamp: Int64, keys: [SymmetricKey]) -> String {
        var signed = Data("\(id).\(timestamp).".utf8)
        signed.append(body)
        return keys.map { "v1," + Data(HMAC<SHA256>.authenticationCode(for: signed, using: $0)).base64EncodedString() }
            .joined(separator: " ")
    }

    /// The JSON body of `event`.
    public static func body(_ event: ServeEvent) -> Data {
        let encoder = JSONEncoder()
        encoder.keyEncodingStrategy = .convertToSnakeCase
        encoder.dateEncodingStrategy = .iso8601
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return (try? encoder.encode(event)) ?? Data("{}".utf8)
    }

    /// POSTs `event`, signed under `secret`, to `url`: up to `attempts` tries, 1 s, 2 s, 4 s… (at most
    /// 60 s) apart, each within `requestTimeout`; any 2xx answer delivers it. Returns the attempt that
    /// delivered it, or the last problem. Stops early when the process is shutting down.
    static func post(
        _ event: ServeEvent, id: String, url: String, secret: SymmetricKey, standard: [SymmetricKey]? = nil,
        attempts: Int, requestTimeout: Duration, timing: Timing
    ) async -> (deliveredAt: Int?, problem: String) {
        let body = Self.body(event)
        var wait = Duration.seconds(1)
        var problem = ""
        for attempt in 1...max(1, attempts) {
            if attempt > 1 {
                do {
                    try await timing.sleep(wait)
                } catch {
                    break
                }
                if Task.isShuttingDownGracefully { break }
                wait = min(wait * 2, .seconds(60))
            }
            let timestamp = timing.unixTime()
            var request = HTTPClientRequest(url: url)
            request.method = .POST
            request.headers.add(name: "Content-Type", value: "application/json")
            request.headers.add(name: "User-Agent", value: "tidemark/\(Runtime.version)")
            request.headers.add(name: "X-Tidemark-Event", value: event.event.rawValue)
            request.headers.add(name: "X-Tidemark-Delivery", value: id)
            if let standard {
                request.headers.add(name: "webhook-id", value: id)
                request.headers.add(name: "webhook-timestamp", value: String(timestamp))
                request.headers.add(
                    name: "webhook-signature",
                    value: Self.standardSignature(id: id, body: body, timestamp: timestamp, keys: standard))
            } else {
                request.headers.add(name: "X-Tidemark-Timestamp", value: String(timestamp))
                request.headers.add(
                    name: "X-Tidemark-Signature",
                    value: Self.signature(body: body, timestamp: timestamp, secret: secret))
            }
            request.body = .bytes(ByteBuffer(data: body))
            do {
                let seconds = Int64(Timing.seconds(requestTimeout).rounded(.up))
                let response = try await HTTPClient.shared.execute(request, timeout: .seconds(seconds))
                _ = try? await response.body.collect(upTo: 64 * 1024)
                if (200..<300).contains(response.status.code) { return (attempt, "") }
                problem = "the webhook answered \(response.status.code)"
            } catch {
                problem = "\(error)"
            }
        }
        return (nil, problem)
    }

    /// `tidemark notify`: one event from a pipeline (a failed job), with `serve`'s body, headers and
    /// signature, to the address in the variable `urlEnv` of `environment` under the secret in
    /// `secretEnv`; three tries. Returns false, sending nothing, when `urlEnv` is unset and
    /// `ifConfigured`; throws when it is unset otherwise, when either is wrong, or when no try delivered.
    public static func notifyFromPipeline(
        _ kind: NotifyTarget.Event, workspace: String, reason: String?, summary: String, commit: String?,
        urlEnv: String, secretEnv: String, ifConfigured: Bool,
        environment: [String: String] = ProcessInfo.processInfo.environment, timing: Timing = .live
    ) async throws -> Bool {
        func value(_ name: String) -> String? { environment[name].flatMap { $0.isEmpty ? nil : $0 } }
        guard let url = value(urlEnv) else {
            if ifConfigured { return false }
            throw RuntimeError("\(urlEnv) is not set: it holds the webhook's address.")
        }
        if let problem = NotifyTarget.urlProblem(url) { throw RuntimeError("the address in \(urlEnv) \(problem).") }
        guard let secret = value(secretEnv) else {
            throw RuntimeError("\(secretEnv) is not set: it holds the secret the event is signed with.")
        }
        let event = ServeEvent(
            event: kind, workspace: workspace, detail: reason, reason: reason, summary: summary,
            commit: commit ?? Runtime.ciCommit(in: environment),
            replica: value("GITHUB_WORKFLOW").map { "github:\($0)" } ?? value("CI_JOB_NAME").map { "gitlab:\($0)" }
                ?? ProcessInfo.processInfo.hostName,
            occurredAt: timing.wallClock())
        let outcome = await post(
            event, id: UUID().uuidString, url: url, secret: SymmetricKey(data: Data(secret.utf8)), attempts: 3,
            requestTimeout: .seconds(10), timing: timing)
        guard outcome.deliveredAt != nil else {
            throw RuntimeError(
                "the \(kind.rawValue) event was not delivered after 3 tries (\(outcome.problem)); check the address in \(urlEnv)."
            )
        }
        return true
    }

    /// Delivers what is queued, each delivery beside the others, until the service group shuts down.
    public func run() async throws {
        try await withGracefulShutdownHandler {
            await withDiscardingTaskGroup { group in
                for await delivery in stream {
                    group.addTask { await self.deliver(delivery) }
                }
            }
        } onGracefulShutdown: {
            self.continuation.finish()
        }
    }

    private func deliver(_ delivery: Delivery) async {
        let name = delivery.target.settings.name
        let event = delivery.event.event.rawValue
        let outcome = await Self.post(
            delivery.event, id: delivery.id, url: delivery.target.url, secret: delivery.target.secret,
            standard: delivery.target.settings.signature == .standard ? delivery.target.keys : nil,
            attempts: attempts, requestTimeout: requestTimeout, timing: timing)
        if let attempt = outcome.deliveredAt {
            metrics.notification(target: name, event: event, delivered: true)
            log(
                "notify target=\(name) event=\(event) workspace=\(delivery.event.workspace) delivered (attempt \(attempt))"
            )
            return
        }
        let problem = outcome.problem
        metrics.notification(target: name, event: event, delivered: false)
        log.error(
            "notify target=\(name) event=\(event) workspace=\(delivery.event.workspace) not delivered after \(attempts) attempts (\(problem)); the next reconcile raises it again. Check the address in serve.notify '\(name)' (\(delivery.target.settings.location))."
        )
        delivery.givenUp()
    }
}

extension Targets.Subject {
    /// "topic:weather" as one word of a dedupe key: no space and no '/' (a device group's name may
    /// have them), percent-encoded.
    var dedupeWord: String {
        var word = "\(kind.rawValue):"
        for scalar in name.unicodeScalars {
            if scalar == " " || scalar == "/" || scalar == "%" || scalar.properties.generalCategory == .control {
                word += String(format: "%%%02X", scalar.value)
            } else {
                word.unicodeScalars.append(scalar)
            }
        }
        return word
    }
}
