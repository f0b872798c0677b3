import Foundation
import ServiceLifecycle
import Synchronization
import TidemarkCore
import TidemarkRuntime

/// What `/status` and `tidemark status` say of one workspace.
public struct WorkspaceStatus: Sendable, Codable, Equatable {
    /// Where the workspace is: `pending` (before its first reconcile), `reconciling`, `ready` (the
    /// last reconcile succeeded), `failing`, `blocked` (a rail refused the plan) or `suspended`.
    public var phase: String
    /// Whether the last reconcile succeeded.
    public var ready: Bool
    /// The workspace's name in state.
    public var workspace: String
    /// The state, as shown (never a password).
    public var state: String
    /// The manifests directory.
    public var manifests: String
    /// The backend and FCM project.
    public var backend: String
    /// The settings it runs with: `interval`, `drift`, `on_change`.
    public var settings: [String: String]
    /// Whether it is suspended.
    public var suspended: Bool
    /// The last reconcile, when one ran.
    public var last: ReconcileResult?
    /// When the last successful reconcile ended.
    public var lastSuccessAt: Date?
    /// Failures in a row (retried after `retry_interval`, doubling, at most `interval`).
    public var consecutiveFailures = 0
    /// When the next reconcile starts.
    public var nextRunAt: Date?
    /// The replica that reconciles it (host and process).
    public var replica: String
}

/// Reconciles one workspace on its schedule, as a service of `serve`'s service group: the first
/// reconcile at start-up, then every `interval` (plus jitter), sooner after a failure, until the
/// group shuts down. A shutdown that comes during an apply stops it between journal steps, as it
/// stops a CLI apply.
public final class WorkspaceRunner: Service, Sendable {
    /// The workspace's name.
    public let name: String
    private let reconciler: Reconciler
    private let metrics: ServeMetrics
    private let log: @Sendable (String) -> Void
    private let current: Mutex<WorkspaceStatus>

    /// A runner for the workspace `status` describes, reconciling with `reconciler`; it waits, draws
    /// its jitter and stamps the next run by the reconciler's `timing`.
    public init(
        status: WorkspaceStatus, reconciler: Reconciler, metrics: ServeMetrics,
        log: @escaping @Sendable (String) -> Void
    ) {
        self.name = status.workspace
        self.reconciler = reconciler
        self.metrics = metrics
        self.log = log
        self.current = Mutex(status)
    }

    private var timing: Timing { reconciler.timing }

    /// The workspace's status now.
    public var status: WorkspaceStatus { current.withLock { $0 } }

    /// Reconciles until the service group shuts down.
    public func run() async throws {
        let settings = reconciler.settings
        var generator = timing.generator
        while !Task.isShuttingDownGracefully, !Task.isCancelled {
            if current.withLock({ $0.suspended }) {
                await pause(settings.interval)
                continue
            }
            current.withLock { $0.phase = "reconciling" }
            let result = await reconciler.reconcile()
            if Task.isShuttingDownGracefully, result.outcome != .success {
                // Stopped between journal steps by the shutdown: not a failure of the workspace.
                current.withLock { $0.phase = "stopped" }
                log(
                    "reconcile workspace=\(name) stopped by the shutdown: what finished is journaled, and the next start resumes it"
                )
                return
            }
            metrics.record(workspace: name, result)
            let failures = current.withLock { status -> Int in
                status.last = result
                status.ready = result.outcome == .success
                switch result.outcome {
                case .success:
                    status.phase = "ready"
                    status.consecutiveFailures = 0
                    status.lastSuccessAt = result.finishedAt
                case .blocked:
                    status.phase = "blocked"
                    status.consecutiveFailures = 0
                case .failure:
                    status.phase = "failing"
                    status.consecutiveFailures += 1
                }
                return status.consecutiveFailures
            }
            var wait = settings.wait(afterFailures: failures)
            let jitterMilliseconds = Int64(Timing.seconds(settings.jitter) * 1000)
            if jitterMilliseconds > 0 {
                wait += .milliseconds(Int64.random(in: 0...jitterMilliseconds, using: &generator))
            }
            let next = timing.wallClock().addingTimeInterval(Timing.seconds(wait))
            current.withLock { $0.nextRunAt = next }
            log(Self.line(workspace: name, result, next: wait))
            await pause(wait)
        }
    }

    /// Waits `duration`, or less when the group shuts down.
    private func pause(_ duration: Duration) async {
        let timing = self.timing
        try? await cancelWhenGracefulShutdown { try await timing.sleep(duration) }
    }

    /// The log line of a reconcile: `workspace=… result=… seconds=… reason=… next=…: summary`.
    static func line(workspace: String, _ result: ReconcileResult, next: Duration) -> String {
        var fields = [
            "workspace=\(workspace)", "result=\(result.outcome.rawValue)",
            "seconds=\(String(format: "%.2f", result.seconds))",
        ]
        if let reason = result.reason { fields.append("reason=\(reason)") }
        fields.append("next_in=\(ServeSettings.describe(next))")
        return "reconcile " + fields.joined(separator: " ") + ": " + result.summary
    }
}
