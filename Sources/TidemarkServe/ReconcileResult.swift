import Foundation
import TidemarkCore

/// How one reconcile of a workspace ended, and what it did.
public struct ReconcileResult: Sendable, Codable, Equatable {
    /// The three ways a reconcile ends (the `result` label of `tidemark_reconcile_total`).
    public enum Outcome: String, Sendable, Codable, CaseIterable {
        /// It did what its settings allow (which may be nothing).
        case success
        /// It stopped on an error; it is tried again after `retry_interval`, with backoff.
        case failure
        /// A rail refused the plan (`max_unsubscribes`, `protect`, `allow_empty`, the shrink or
        /// dead-token guard): nothing was applied, and it stays so until a person applies or raises the rail.
        case blocked
    }

    /// How it ended.
    public var outcome: Outcome
    /// Why, in a stable word (`TidemarkError.reason`, or the rail: `rail.max_unsubscribes`); nil on success.
    public var reason: String?
    /// What a person reads: the error or the rail's message (no token in the clear).
    public var message: String?
    /// When it began.
    public var startedAt: Date
    /// How long it took, in seconds.
    public var seconds: Double
    /// Memberships added in FCM.
    public var subscribed = 0
    /// Memberships removed in FCM.
    public var unsubscribed = 0
    /// Device-group calls made.
    public var groupCalls = 0
    /// Requests sent to FCM to change it.
    public var writeRequests = 0
    /// Requests the plans sent to FCM to read it (a refresh), when the backend counts them.
    public var readRequests = 0
    /// Registrations the drift check read, when one ran.
    public var driftChecked: Int? = nil
    /// Changes planned but not applied (`on_change: plan`, or the operations of a blocked plan).
    public var changesWaiting = 0
    /// Drift found, by kind (`dropped`, `self_subscribed`, `opted_out`…), when FCM was read for it.
    public var drift: [String: Int]? = nil
    /// Whether drift was corrected (`drift: heal` with drift found).
    public var driftHealed = false
    /// Whether the sync windows held changes back (they were planned and left waiting).
    public var windowClosed = false
    /// When the windows next let changes through, when they were closed (nil: not within 8 days).
    public var windowOpensAt: Date? = nil
    /// The memberships state holds after the reconcile, when it planned.
    public var managedMemberships: Int? = nil
    /// The manifests' commit, when they come from git.
    public var commit: String? = nil
    /// A batch of changed devices planned on their own (not a whole reconcile): how many devices.
    public var changedDevices: Int? = nil
    /// A whole reconcile after batches: devices whose memberships the batches had not brought to
    /// what the whole read says (a defect, or a change the cursor passed over); this reconcile
    /// corrected them.
    public var divergences: Int? = nil
    /// FCM deadlines the plan warned of (device groups, the Instance ID API), unless acknowledged.
    public var deadlines: [Notice] = []
    /// How far the drift sweep has read the fleet, as the reconcile's last read of FCM left it (nil:
    /// it read none).
    public var sweep: Sweep? = nil
    /// The topics and groups a rail held: their changes wait, everything else was applied (nil: the
    /// reconcile made no plan, so it does not know; the workspace keeps what it last knew).
    public var held: [HeldChange]? = nil

    /// The drift sweep's coverage: drift in a registration is seen (and healed) only once it is read.
    public struct Sweep: Sendable, Codable, Equatable {
        /// Registrations of the fleet (known, not held as dead).
        public var fleet: Int
        /// Of those, never read yet.
        public var neverRead: Int
        /// The oldest last read among the fleet's registrations that were read (every other one was
        /// read since).
        public var oldestReadAt: Date
        /// Registrations a reconcile reads for the sweep (`refresh_budget`); nil outside `sample`.
        public var budget: Int?
        /// Reconciles, at this budget, until every registration has been read once (nil: all have).
        public var reconcilesToComplete: Int?

        /// The coverage `coverage` reports.
        public init(_ coverage: RefreshCoverage) {
            fleet = coverage.fleet
            neverRead = coverage.read >= coverage.fleet ? 0 : coverage.neverRead
            oldestReadAt = Date(timeIntervalSince1970: TimeInterval(coverage.oldestUnread ?? coverage.at))
            budget = coverage.budget
            reconcilesToComplete = neverRead == 0 ? nil : coverage.runsToCompleteSweep
        }
    }

    /// A warning a reconcile passes on: its stable code and its sentence.
    public struct Notice: Sendable, Codable, Equatable {
        /// `deadline.device_groups`, `deadline.iid_transport`.
        public var code: String
        /// What a person reads.
        public var message: String
    }

    /// A result of `outcome` that began at `startedAt` and took `seconds`.
    public init(outcome: Outcome, startedAt: Date, seconds: Double) {
        self.outcome = outcome
        self.startedAt = startedAt
        self.seconds = seconds
    }

    /// When it ended.
    public var finishedAt: Date { startedAt.addingTimeInterval(seconds) }

    /// Drifted memberships found, opt-outs aside (they are a user's choice, not drift).
    public var driftFound: Int { DriftReport.found(in: drift) }

    /// One line for the log and the status: what happened, in numbers.
    public var summary: String {
        switch outcome {
        case .success:
            var parts: [String] = []
            if let changedDevices {
                parts.append("\(PlanRenderer.counted(changedDevices, "changed device")) planned on their own")
            }
            if let divergences {
                parts.append(
                    divergences == 0
                        ? "resync matched the batches"
                        : "resync: \(PlanRenderer.counted(divergences, "device")) the changes had not brought, corrected"
                )
            }
            if subscribed + unsubscribed + groupCalls > 0 {
                parts.append(
                    "applied \(PlanRenderer.counted(subscribed, "subscription")), \(PlanRenderer.counted(unsubscribed, "unsubscription"))"
                        + (groupCalls > 0 ? ", \(PlanRenderer.counted(groupCalls, "group call"))" : "")
                        + " in \(PlanRenderer.counted(writeRequests, "request"))")
            } else {
                parts.append("no changes")
            }
            if changesWaiting > 0 {
                let why =
                    windowClosed
                    ? "outside the sync windows, "
                        + (windowOpensAt.map { "until \(ISO8601DateFormatter().string(from: $0))" }
                            ?? "not within 8 days")
                    : "on_change: plan"
                parts.append("\(PlanRenderer.counted(changesWaiting, "change")) waiting (\(why))")
            } else if windowClosed {
                parts.append("outside the sync windows")
            }
            if driftFound > 0 {
                parts.append(
                    "\(PlanRenderer.counted(driftFound, "drifted membership")) \(driftHealed ? "healed" : windowClosed ? "reported (outside the sync windows)" : "reported (drift: warn)")"
                )
            }
            if let held, !held.isEmpty {
                let names = held.prefix(3).map { "\($0.subject) (\($0.rail))" }.joined(separator: ", ")
                parts.append("held by a rail: \(names)\(held.count > 3 ? " and \(held.count - 3) more" : "")")
            }
            return parts.joined(separator: "; ")
        case .failure, .blocked:
            return message ?? reason ?? outcome.rawValue
        }
    }
}
