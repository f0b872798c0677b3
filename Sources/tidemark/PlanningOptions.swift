import ArgumentParser
import TidemarkCore
import TidemarkRuntime

/// `--target` / `--exclude`: which topics and groups a command covers.
struct TargetOptions: ParsableArguments {
    @Option(
        name: .long,
        help: ArgumentHelp(
            "Only these topics or groups: topic:GLOB, group:GLOB or GLOB (both kinds); * and ? are wildcards. Repeatable.",
            valueName: "SEL"))
    var target: [String] = []

    @Option(
        name: .long,
        help: ArgumentHelp(
            "Leave these topics or groups out (same syntax as --target). Repeatable.",
            valueName: "SEL"))
    var exclude: [String] = []

    func validate() throws { _ = try targets() }

    func targets() throws -> Targets {
        do {
            return try Targets(include: target, exclude: exclude)
        } catch {
            throw ValidationError(error.description)
        }
    }
}

/// What a plan covers and how far it may reach: the target selection and `--max-unsubscribes`.
struct PlanningOptions: ParsableArguments {
    @OptionGroup var selection: TargetOptions

    @Option(
        name: .long,
        help: ArgumentHelp(
            "Refuse a plan that unsubscribes more than N memberships, or more than P% of the memberships tidemark knows; rotated tokens are not counted (default: 'max_unsubscribes' in tidemark.yaml, else no limit).",
            valueName: "N|P%"))
    var maxUnsubscribes: String?

    @Flag(
        help:
            "Plan even when an inventory source read far fewer devices than the last apply recorded for it (more than 'max_shrink', 10% by default): the devices really left."
    )
    var allowShrink = false

    @Flag(
        help:
            "When a rail refuses only some topics or groups (their own max_unsubscribes, protect, allow_empty), hold those and plan the rest, as 'tidemark serve' does; a rail about the whole workspace still refuses everything."
    )
    var skipHeld = false

    func validate() throws { _ = try limit() }

    func limit() throws -> UnsubscribeLimit? { try Self.limit(maxUnsubscribes) }

    /// What `reading`'s flags and these ask of a plan, for the runtime to merge with tidemark.yaml.
    func flags(_ reading: RefreshModeOptions) throws -> PlanningFlags {
        var flags = try reading.flags()
        flags.maxUnsubscribes = try limit()
        return flags
    }

    /// A `--max-unsubscribes` value, or a usage error naming it.
    static func limit(_ text: String?) throws -> UnsubscribeLimit? {
        guard let text else { return nil }
        do {
            return try UnsubscribeLimit(parsing: text)
        } catch {
            throw ValidationError(error.description)
        }
    }
}

/// `--format` and where markdown parts go, for commands that render plans or reports.
struct RenderOptions: ParsableArguments {
    @Option(help: "Output format: text, markdown (pull-request comments) or json (full data, full tokens).")
    var format: OutputFormat = .text

    @Option(
        name: .long,
        help: ArgumentHelp(
            "With --format markdown: write each comment-sized part to DIR/part-1.md, part-2.md, … as well.",
            valueName: "DIR"))
    var partsDir: String?

    func validate() throws {
        if partsDir != nil, format != .markdown {
            throw ValidationError("--parts-dir needs --format markdown.")
        }
    }
}

/// How a refresh's findings are trusted.
struct RefreshOptions: ParsableArguments {
    @Flag(
        help: ArgumentHelp(
            "Accept a refresh in which many devices come back dead at once (by default more than 20% and 50 of those read is refused as a likely misconfiguration; 'dead_share' and 'dead_minimum' in tidemark.yaml)."
        ))
    var acceptDead = false

    @Option(
        help: ArgumentHelp(
            "Reads per second sent to FCM while refreshing (emulator and fcm backends; default: 'read_qps' in tidemark.yaml, else no limit). FCM documents no read quota; this keeps refreshes polite and separate from the write quota.",
            valueName: "N"))
    var readQps: Double?

    func validate() throws {
        if let readQps, !FCMLimits.isRate(readQps) {
            throw ValidationError(
                "--read-qps must be a number of reads per second from above 0 to \(FCMLimits.maxRate), not \(readQps).")
        }
    }
}

extension RefreshMode: ExpressibleByArgument {}

/// `--refresh`, `--refresh-budget`, `--no-refresh`: how much of FCM plan, apply and drift read.
struct RefreshModeOptions: ParsableArguments {
    @Option(
        help: ArgumentHelp(
            "What to read from FCM first: touched (the registrations the plan would change, and any read longer ago than 'refresh_max_age'), sample (touched plus the sweep's slice of the rest, oldest read first, within the budget), all (every registration) or none. Default: 'refresh' in tidemark.yaml, else sample.",
            valueName: "MODE"))
    var refresh: RefreshMode?

    @Option(
        help: ArgumentHelp(
            "Reads a sample refresh spends on the sweep beyond the touched registrations: a number, or a share of the fleet such as 5%. Default: 'refresh_budget' in tidemark.yaml, else 2% (at least 1,000).",
            valueName: "N|P%"))
    var refreshBudget: String?

    @Flag(help: "Plan from state alone, without reading FCM (the same as --refresh none).")
    var noRefresh = false

    func validate() throws {
        if noRefresh, let refresh, refresh != .none {
            throw ValidationError("--no-refresh contradicts --refresh \(refresh.rawValue); give one of them.")
        }
        if let refreshBudget {
            do {
                _ = try RefreshBudget(parsing: refreshBudget)
            } catch {
                throw ValidationError("--refresh-budget: \(error.description)")
            }
        }
    }

    /// Whether a mode was asked for on the command line.
    var given: Bool { refresh != nil || noRefresh || refreshBudget != nil }

    /// What the flags ask for, for the runtime to merge with tidemark.yaml (`Runtime.refreshPolicy`).
    func flags() throws -> PlanningFlags {
        PlanningFlags(
            refresh: noRefresh ? RefreshMode.none : refresh,
            refreshBudget: try refreshBudget.map { try RefreshBudget(parsing: $0) })
    }
}

/// `--drift-only`: correct drift from what the last apply established, and nothing else.
struct DriftOnlyOption: ParsableArguments {
    @Flag(
        help: ArgumentHelp(
            "Re-assert only what the last apply established (the memberships and groups state records): drift is corrected, while manifest edits and inventory churn wait for a normal apply. Needs a refresh that reads FCM."
        ))
    var driftOnly = false

    /// Refuses `--drift-only` with what contradicts it.
    func check(reading: RefreshModeOptions, conflicts: [(given: Bool, flag: String)]) throws {
        guard driftOnly else { return }
        if reading.noRefresh || reading.refresh == RefreshMode.none {
            throw ValidationError(
                "--drift-only finds drift by reading FCM; it cannot be combined with --no-refresh or --refresh none.")
        }
        for conflict in conflicts where conflict.given {
            throw ValidationError("--drift-only cannot be combined with \(conflict.flag).")
        }
    }
}
