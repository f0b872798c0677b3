/// Copies a whole state between stores (`state pull`, `push` and `migrate`), keeping its lineage,
/// serial and row versions, so plans saved against it stay valid. Both stores are locked for the
/// copy. The journal's history is not copied, so a state with an unfinished apply is refused: the
/// copy could not resume it.
public struct StateCopyWorkflow: Sendable {
    /// What the target may already hold.
    public enum Rule: Sendable {
        /// Nothing: the target must hold no state (pull, migrate).
        case emptyTarget
        /// The same lineage at an older serial (push: an older snapshot never overwrites newer state).
        case newerThanTarget
    }

    /// Why a copy was refused; nothing was written.
    public struct Refusal: TidemarkError {
        /// `state_copy_refused`.
        public var reason: FailureReason { "state_copy_refused" }

        /// The refusal, as a sentence that says what to do.
        public let description: String
    }

    /// The store copied from.
    public var source: any StateStore
    /// The store copied to.
    public var target: any StateStore
    /// The clock of the copy's write.
    public var timing: Timing

    /// A copy from `source` to `target`, timed by `timing`.
    public init(from source: any StateStore, to target: any StateStore, timing: Timing) {
        self.source = source
        self.target = target
        self.timing = timing
    }

    /// Copies under both locks, taken for `holder`; returns the state copied.
    public func run(_ rule: Rule, holder: LockHolder) async throws -> State {
        let (source, target) = (self.source, self.target)
        return try await source.withLock(holder) {
            try await target.withLock(holder) {
                guard let state = try await source.load() else {
                    throw Refusal(description: "there is no state at \(source.location) to copy.")
                }
                if let unfinished = try await source.unfinishedApply() {
                    if let move = unfinished.plan.move { throw WorkflowError.interruptedMove(move) }
                    throw Refusal(
                        description:
                            "\(source.location) has an unfinished apply (\(unfinished.id.prefix(8))); run 'tidemark apply' to finish it (or abandon it) before copying the state."
                    )
                }
                if let existing = try await target.load() {
                    try Self.check(rule, copying: state, from: source.location, over: existing, at: target.location)
                }
                var copy = state
                try await target.save(&copy, .restoring(state), at: timing.unixTime())
                return state
            }
        }
    }

    /// Refuses a copy `rule` does not allow over the `existing` state of the target.
    static func check(
        _ rule: Rule, copying state: State, from source: String, over existing: State, at target: String
    ) throws {
        switch rule {
        case .emptyTarget:
            throw Refusal(
                description:
                    "\(target) already holds a state (lineage \(existing.lineage.prefix(8)), serial \(existing.serial)); copy into an empty store or workspace."
            )
        case .newerThanTarget:
            guard existing.lineage == state.lineage else {
                throw Refusal(
                    description:
                        "\(source) is another state (lineage \(state.lineage.prefix(8))) than \(target) (lineage \(existing.lineage.prefix(8))); nothing was pushed."
                )
            }
            guard state.serial > existing.serial else {
                throw Refusal(
                    description:
                        "\(source) is at serial \(state.serial), not newer than \(target) at serial \(existing.serial); nothing was pushed."
                )
            }
        }
    }
}
