import TidemarkCore

/// What a command's flags ask of its plans before tidemark.yaml fills the rest in: `--refresh`
/// (`--no-refresh` is `.none`), `--refresh-budget`, `--max-unsubscribes`. The runtime merges them
/// with tidemark.yaml in one place (`Runtime.refreshPolicy`, `unsubscribeLimit`, `planRequest`),
/// for the CLI's `plan`, `apply` and `drift` and for `serve` alike: a flag wins over tidemark.yaml,
/// which wins over tidemark's defaults.
public struct PlanningFlags: Sendable, Equatable {
    /// `--refresh MODE`, or `.none` for `--no-refresh`; nil: tidemark.yaml's `refresh`.
    public var refresh: RefreshMode?
    /// `--refresh-budget`; nil: tidemark.yaml's `refresh_budget`.
    public var refreshBudget: RefreshBudget?
    /// `--max-unsubscribes` (for `serve`, its flag or the workspace's `max_unsubscribes`); nil:
    /// `max_unsubscribes` of tidemark.yaml, else no limit.
    public var maxUnsubscribes: UnsubscribeLimit?

    /// Flags as given (none: tidemark.yaml decides everything).
    public init(
        refresh: RefreshMode? = nil, refreshBudget: RefreshBudget? = nil, maxUnsubscribes: UnsubscribeLimit? = nil
    ) {
        self.refresh = refresh
        self.refreshBudget = refreshBudget
        self.maxUnsubscribes = maxUnsubscribes
    }
}

extension Runtime {
    /// How much of FCM a plan reads: the flags, else tidemark.yaml's `refresh` and `refresh_budget`
    /// (a `serve.workspaces` entry's own, when the run is one), else sample within 2%.
    public func refreshPolicy(_ flags: PlanningFlags) -> RefreshPolicy {
        var policy = settings.refresh
        if let mode = flags.refresh { policy.mode = mode }
        if let budget = flags.refreshBudget { policy.budget = budget }
        return policy
    }

    /// The most a plan may unsubscribe: the flag, else `max_unsubscribes` of tidemark.yaml, else no limit.
    public func unsubscribeLimit(_ flags: PlanningFlags) -> UnsubscribeLimit? {
        flags.maxUnsubscribes ?? settings.maxUnsubscribes
    }

    /// The rail `serve` puts on each topic whose manifests set no `max_unsubscribes`: its default
    /// (`UnattendedRail.serveDefault`) unless a rail is set for the workspace (`flags`, tidemark.yaml's
    /// `max_unsubscribes`, `serve`'s), `none` included. The CLI has none: a person reviews its plans.
    public func unattendedRail(_ flags: PlanningFlags) -> UnattendedRail? {
        unsubscribeLimit(flags) == nil ? .serveDefault : nil
    }

    /// A plan request for `targets` as `flags` and tidemark.yaml say.
    public func planRequest(_ flags: PlanningFlags, targets: Targets = .all, driftOnly: Bool = false) -> PlanRequest {
        PlanRequest(
            policy: refreshPolicy(flags), targets: targets, maxUnsubscribes: unsubscribeLimit(flags),
            driftOnly: driftOnly)
    }

    /// How long a token gone from the inventory, or dead, stays in state before `tidemark state prune`
    /// forgets it: `olderThan` (`--older-than`, as written), else `prune_after` of tidemark.yaml,
    /// else 90 days; its seconds and how a person writes it.
    public func pruneRetention(_ olderThan: String?) -> (seconds: Int64, text: String) {
        if let olderThan, let seconds = Quantities.seconds(olderThan) { return (seconds, olderThan) }
        if let seconds = settings.pruneAfter { return (seconds, settings.pruneAfterText ?? "\(seconds)s") }
        return (90 * 86_400, "90d")
    }
}
