import Foundation

/// What `tidemark serve` may do on its own with one workspace, and when it runs.
public struct ServeSettings: Sendable, Equatable {
    /// What a reconcile does about drift (memberships FCM lost or gained that nobody planned).
    public enum DriftPolicy: String, Sendable, CaseIterable {
        /// Re-assert what the last apply established (`apply --drift-only`); opt-outs stay respected.
        case heal
        /// Read FCM and report drift (status, metrics, logs); change nothing for it.
        case warn
        /// Do not read FCM for drift.
        case off
    }

    /// What a reconcile does with changes of the manifests or the inventory.
    public enum ChangePolicy: String, Sendable, CaseIterable {
        /// Apply them, within the rails.
        case apply
        /// Plan them and report them as waiting; a person applies them.
        case plan
    }

    /// Time between the start of one reconcile and the next (default 5 minutes).
    public var interval: Duration = .seconds(300)
    /// Up to this much is added to each interval at random, so replicas and workspaces spread out.
    public var jitter: Duration = .zero
    /// After a failure, the first retry comes this soon, then twice as long each time, never longer
    /// than `interval` (default 30 seconds).
    public var retryInterval: Duration = .seconds(30)
    /// A reconcile whose requests FCM has failed (and tidemark retried) for this long without one
    /// answer between makes the workspace `degraded` (not ready) before it fails (`degraded_after`,
    /// default 60 seconds).
    public var degradedAfter: Duration = .seconds(60)
    /// What to do about drift.
    public var drift: DriftPolicy = .heal
    /// What to do with manifest and inventory changes.
    public var onChange: ChangePolicy = .apply
    /// The most a reconcile may unsubscribe (a number or a share); nil: `max_unsubscribes` in
    /// tidemark.yaml, else no limit. A plan past it is not applied: the workspace is `blocked`.
    public var maxUnsubscribes: UnsubscribeLimit?
    /// Whether the workspace is suspended: nothing is reconciled until it is resumed.
    public var suspend = false
    /// How many applies the state's history keeps (`history_keep`, default 500): after each reconcile
    /// that applied, older ones go with their journal rows, since a reconciler applies all day.
    public var historyKeep = 500
    /// Sync windows (`windows:`): when changes may be applied on their own; none: at any time.
    public var windows: [ServeWindow] = []
    /// Whether drift is healed outside the windows too (`heal_outside_windows`, default false).
    public var healOutsideWindows = false

    /// The defaults: every 5 minutes, drift healed, changes applied.
    public init() {}

    /// The wait before the reconcile that follows `failures` failures in a row (0: the last one
    /// succeeded or was blocked), before jitter.
    public func wait(afterFailures failures: Int) -> Duration {
        guard failures > 0 else { return interval }
        let doubling = min(failures - 1, 20)
        let seconds = Timing.seconds(retryInterval) * Double(1 << doubling)
        return min(.milliseconds(Int64(seconds * 1000)), interval)
    }

    /// A duration as tidemark.yaml and the flags write it: `90s`, `5m`, `1h`, `1d`; nil for anything else.
    public static func duration(_ text: String) -> Duration? {
        if text == "0" || text == "0s" { return .zero }
        guard let seconds = Quantities.seconds(text) else { return nil }
        return .seconds(seconds)
    }

    /// A duration as a person writes it: `5m`, `90s`, `1h30m`.
    public static func describe(_ duration: Duration) -> String {
        let total = Int64(Timing.seconds(duration).rounded())
        if total == 0 { return "0s" }
        let (hours, minutes, seconds) = (total / 3600, total % 3600 / 60, total % 60)
        return (hours > 0 ? "\(hours)h" : "") + (minutes > 0 ? "\(minutes)m" : "") + (seconds > 0 ? "\(seconds)s" : "")
    }

    /// Settings given on the command line (`tidemark serve --interval …`): each one given wins over
    /// every workspace's own, as flags win over tidemark.yaml everywhere.
    public struct Overrides: Sendable, Equatable {
        /// `--interval`.
        public var interval: Duration?
        /// `--jitter`.
        public var jitter: Duration?
        /// `--retry-interval`.
        public var retryInterval: Duration?
        /// `--drift`.
        public var drift: DriftPolicy?
        /// `--on-change`.
        public var onChange: ChangePolicy?
        /// `--max-unsubscribes`.
        public var maxUnsubscribes: UnsubscribeLimit?

        /// No flag given.
        public init() {}

        /// `settings` with every given flag in place of its value.
        public func applied(to settings: ServeSettings) -> ServeSettings {
            var settings = settings
            if let interval { settings.interval = interval }
            if let jitter { settings.jitter = jitter }
            if let retryInterval { settings.retryInterval = retryInterval }
            if let drift { settings.drift = drift }
            if let onChange { settings.onChange = onChange }
            if let maxUnsubscribes { settings.maxUnsubscribes = maxUnsubscribes }
            return settings
        }
    }
}
