import Foundation

/// FCM's 2027 deadlines for what tidemark manages (firebase.google.com/docs/cloud-messaging/device-group
/// and /migrate-off-device-groups; the Instance ID server reference):
/// - device groups: closed to new projects on 1 December 2026, turned down on 29 September 2027,
///   with the call that lists a group's tokens (their data is not kept);
/// - the Instance ID batch API (tidemark's `iid` transport): closed to new projects on 1 October
///   2026, turned down on 29 September 2027.
public enum FCMDeadlines {
    static func day(_ year: Int, _ month: Int, _ day: Int) -> Date {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(identifier: "UTC")!
        return calendar.date(from: DateComponents(year: year, month: month, day: day))!
    }

    /// From this day new Firebase projects cannot create device groups.
    public static let deviceGroupsClosedToNewProjects = day(2026, 12, 1)
    /// From this day device groups, and the call that lists a group's tokens, stop working.
    public static let deviceGroupsTurnedDown = day(2027, 9, 29)
    /// From this day new Firebase projects cannot use the Instance ID API.
    public static let iidClosedToNewProjects = day(2026, 10, 1)
    /// From this day the Instance ID API stops working.
    public static let iidTurnedDown = day(2027, 9, 29)

    /// A day written YYYY-MM-DD, at midnight UTC; nil for anything else (`TIDEMARK_AS_OF`,
    /// `--as-of`, `--created`, and the days of `acknowledge:` in tidemark.yaml).
    public static func parseDay(_ text: String) -> Date? {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "UTC")
        formatter.dateFormat = "yyyy-MM-dd"
        return formatter.date(from: text)
    }

    /// "29 September 2027".
    public static func format(_ date: Date) -> String {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "UTC")
        formatter.dateFormat = "d MMMM yyyy"
        return formatter.string(from: date)
    }
}

/// Which deadlines a run checks, and against which date.
public struct DeadlineCheck: Sendable, Equatable {
    /// The topic API the run uses.
    public var transport: TopicTransport
    /// The date the deadline rules see: the real date for the `fcm` backend; for the embedded
    /// backend and the emulator only a date the user gave (`TIDEMARK_AS_OF`), so that the demo and
    /// tests keep working after 2027. nil: warn, never refuse.
    public var enforcedAt: Date?
    /// The date the wording is in (today, or the date given).
    public var now: Date
    /// false checks nothing (tests of other things, and commands that do not plan).
    public var enabled: Bool
    /// Notices acknowledged in tidemark.yaml (`acknowledge:`), by deadline ("device_groups",
    /// "iid_transport"), until the day given: until then plans and applies leave the notice out.
    public var acknowledged: [String: Date] = [:]

    /// The deadlines of a run on `transport`, refused from `enforcedAt` (nil: only warned about).
    public init(transport: TopicTransport, enforcedAt: Date?, now: Date, enabled: Bool = true) {
        self.transport = transport
        self.enforcedAt = enforcedAt
        self.now = now
        self.enabled = enabled
    }

    /// Checks nothing.
    public static let off = DeadlineCheck(
        transport: .v1, enforcedAt: nil, now: Date(timeIntervalSince1970: 0), enabled: false)

    /// Once per run: a warning for each deadline the project meets, with its dates and the way off;
    /// past a deadline (when enforced) an error with the migration path instead, so nothing is sent
    /// to an API that is gone.
    /// Whether device groups are past their turn-down at the enforced date.
    public var groupsTurnedDown: Bool {
        guard enabled, let enforcedAt else { return false }
        return enforcedAt >= FCMDeadlines.deviceGroupsTurnedDown
    }

    /// Whether the Instance ID API is past its turn-down at the enforced date.
    public var iidTurnedDown: Bool {
        guard enabled, let enforcedAt else { return false }
        return enforcedAt >= FCMDeadlines.iidTurnedDown
    }

    /// The deadlines one can acknowledge, as `acknowledge:` in tidemark.yaml names them.
    public static let acknowledgeable = ["device_groups", "iid_transport"]

    /// Whether the notice of `deadline` is acknowledged on the date the wording is in.
    func isAcknowledged(_ deadline: String) -> Bool { acknowledged[deadline].map { now < $0 } ?? false }

    /// `groups` declared in the manifests; `rememberedGroups` more that only state remembers (an
    /// apply would delete them). Before a turn-down, each deadline is one short line (`full`: the
    /// whole paragraph, as `validate` says it), left out while acknowledged; past it, the error is
    /// never left out.
    public func diagnostics(groups: Int, rememberedGroups: Int = 0, full: Bool = false) -> [Diagnostic] {
        guard enabled else { return [] }
        var result: [Diagnostic] = []
        /// A diagnostic about one deadline, structured for scripts (both turn-downs fall on 29 September 2027).
        func say(_ severity: Diagnostic.Severity, _ code: String, _ message: String) {
            var diagnostic = Diagnostic(severity, message)
            diagnostic.code = code
            diagnostic.deadline = "2027-09-29"
            result.append(diagnostic)
        }
        /// "since 1 December 2026" once the date is past, "from …" before.
        func sinceOrFrom(_ date: Date) -> String {
            "\((enforcedAt ?? now) >= date ? "since" : "from") \(FCMDeadlines.format(date))"
        }
        let turnedDown = FCMDeadlines.format(FCMDeadlines.deviceGroupsTurnedDown)
        let all = groups + rememberedGroups
        if groupsTurnedDown, groups == 0, rememberedGroups > 0 {
            // Nothing to stop: the groups are gone from FCM, and no call is planned for them.
            say(
                .warning, "deadline.device_groups",
                "FCM turned device groups down on \(turnedDown); the \(rememberedGroups) group\(rememberedGroups == 1 ? "" : "s") state remembers \(rememberedGroups == 1 ? "is" : "are") no longer planned, and no call is made for \(rememberedGroups == 1 ? "it" : "them")."
            )
        } else if all > 0, groupsTurnedDown {
            say(
                .error, "deadline.device_groups",
                "FCM turned device groups down on \(turnedDown), and the manifests declare \(groups) device group\(groups == 1 ? "" : "s"): they cannot be planned or applied. Remove them from the manifests and send to their devices' tokens (or a topic) instead; docs/migrating.md says how."
            )
        } else if all > 0, !full {
            if !isAcknowledged("device_groups") {
                say(
                    .warning, "deadline.device_groups",
                    "FCM ends device groups on \(turnedDown), and this project manages \(all); 'tidemark validate' and docs/migrating.md say what to do (to quiet this line for a while: 'acknowledge: {device_groups: YYYY-MM-DD}' in tidemark.yaml)."
                )
            }
        } else if all > 0 {
            say(
                .warning, "deadline.device_groups",
                "this project manages \(all) device group\(all == 1 ? "" : "s"), and FCM is ending device groups: new projects cannot use them \(sinceOrFrom(FCMDeadlines.deviceGroupsClosedToNewProjects)), and they stop working on \(turnedDown), together with the call that lists a group's tokens (FCM keeps no copy). Export every group's tokens before then ('tidemark groups export --out groups.ndjson'), keep the mapping in the app and send to each token or a topic instead; docs/migrating.md says how."
            )
        }
        guard transport == .iid else { return full ? acknowledging(result) : result }
        let iidDown = FCMDeadlines.format(FCMDeadlines.iidTurnedDown)
        if iidTurnedDown {
            say(
                .error, "deadline.iid_transport",
                "FCM turned the Instance ID API down on \(iidDown), so the iid transport cannot reach FCM. Switch to the v1 API: set 'transport: v1' in tidemark.yaml (or --transport v1) and run 'tidemark plan --transport v1 --refresh all' first; docs/migrating.md says how."
            )
        } else if !full {
            if !isAcknowledged("iid_transport") {
                say(
                    .warning, "deadline.iid_transport",
                    "FCM ends the Instance ID API, which the iid transport uses, on \(iidDown); 'tidemark validate' and docs/migrating.md say how to move to v1 (to quiet this line for a while: 'acknowledge: {iid_transport: YYYY-MM-DD}' in tidemark.yaml)."
                )
            }
        } else {
            say(
                .warning, "deadline.iid_transport",
                "this project uses the iid transport, FCM's Instance ID batch API: closed to new projects \(sinceOrFrom(FCMDeadlines.iidClosedToNewProjects)), and turned down on \(iidDown). Switch to the v1 API before then: 'tidemark plan --transport v1 --refresh all' reads every registration through v1 and shows any difference from state; then set 'transport: v1' in tidemark.yaml. docs/migrating.md says how."
            )
        }
        return full ? acknowledging(result) : result
    }

    /// The full notices, each saying until when plans and applies leave it out, when acknowledged.
    private func acknowledging(_ diagnostics: [Diagnostic]) -> [Diagnostic] {
        diagnostics.map { diagnostic in
            guard diagnostic.severity == .warning, let code = diagnostic.code,
                let name = code.split(separator: ".").last.map(String.init), isAcknowledged(name),
                let until = acknowledged[name]
            else { return diagnostic }
            var acknowledged = diagnostic
            acknowledged.message +=
                " (Acknowledged in tidemark.yaml until \(FCMDeadlines.format(until)): plans and applies leave this notice out until then.)"
            return acknowledged
        }
    }
}
