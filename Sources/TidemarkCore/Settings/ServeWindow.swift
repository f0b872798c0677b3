import Foundation
import Yams

/// A sync window of `serve` (as Argo CD's): when a workspace may apply changes on its own.
///
/// ```yaml
/// serve:
///   windows:
///     - {kind: allow, schedule: "0 9 * * 1-5", duration: 8h, time_zone: Europe/Berlin}
///     - {kind: deny, schedule: "0 0 24 12 *", duration: 48h}
///   heal_outside_windows: true
/// ```
///
/// With allow windows, changes are applied only while one is open; while a deny window is open,
/// never (deny wins). Outside, a reconcile still reads and plans: changes show as waiting, drift as
/// found, and with `heal_outside_windows: true` drift is still healed.
public struct ServeWindow: Sendable, Equatable {
    /// Whether the window lets changes through or holds them back.
    public enum Kind: String, Sendable, Equatable {
        /// Changes are applied only while an allow window is open.
        case allow
        /// No change is applied while it is open.
        case deny
    }

    /// Allow or deny.
    public var kind: Kind
    /// When it opens: a cron expression of five fields (minute hour day-of-month month day-of-week).
    public var schedule: CronSchedule
    /// How long it stays open.
    public var duration: Duration
    /// The time zone the schedule is read in (default UTC).
    public var timeZone: TimeZone
    /// Where it is written, for messages.
    public var location: SourceLocation

    /// A `kind` window opening as `schedule` says (read in `timeZone`) for `duration`, written at `location`.
    public init(
        kind: Kind, schedule: CronSchedule, duration: Duration, timeZone: TimeZone, location: SourceLocation
    ) {
        self.kind = kind
        self.schedule = schedule
        self.duration = duration
        self.timeZone = timeZone
        self.location = location
    }

    /// The keys a window may hold.
    public static let keys = ["kind", "schedule", "duration", "time_zone"]

    /// Whether the window is open at `date`: some start it schedules is at most `duration` before it.
    public func isOpen(at date: Date) -> Bool {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = timeZone
        let minutes = Int(Timing.seconds(duration) / 60)
        let now = Date(timeIntervalSince1970: (date.timeIntervalSince1970 / 60).rounded(.down) * 60)
        guard minutes > 0 else { return false }
        for back in 0..<minutes {
            if schedule.matches(now.addingTimeInterval(-Double(back) * 60), calendar: calendar) { return true }
        }
        return false
    }

    /// Whether `windows` let changes be applied at `date`: no deny window open, and an allow window
    /// open when there are any.
    public static func allowChanges(_ windows: [ServeWindow], at date: Date) -> Bool {
        if windows.contains(where: { $0.kind == .deny && $0.isOpen(at: date) }) { return false }
        let allows = windows.filter { $0.kind == .allow }
        return allows.isEmpty || allows.contains { $0.isOpen(at: date) }
    }

    /// The minutes from `from` to `to` at which the window opens.
    func starts(from: Date, to: Date) -> [Date] {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = timeZone
        var result: [Date] = []
        var minute = (from.timeIntervalSince1970 / 60).rounded(.up) * 60
        while minute <= to.timeIntervalSince1970 {
            let date = Date(timeIntervalSince1970: minute)
            if schedule.matches(date, calendar: calendar) { result.append(date) }
            minute += 60
        }
        return result
    }

    /// The first moment after `date` at which `windows` allow changes, looking at most 8 days ahead
    /// (nil: not within them). Whether changes are allowed changes only where a window opens or
    /// closes, so only those moments are tried.
    public static func nextAllowed(_ windows: [ServeWindow], after date: Date) -> Date? {
        let horizon = date.addingTimeInterval(8 * 86_400)
        // Each window's starts, in order; its spans all last as long, so the last start at or before a
        // moment tells whether the window is open then.
        let starts = windows.map { window in
            (window, window.starts(from: date.addingTimeInterval(-Timing.seconds(window.duration)), to: horizon))
        }
        func open(_ window: ServeWindow, _ starts: [Date], at moment: Date) -> Bool {
            var (low, high) = (0, starts.count)
            while low < high {
                let middle = (low + high) / 2
                if starts[middle] <= moment { low = middle + 1 } else { high = middle }
            }
            guard low > 0 else { return false }
            return moment < starts[low - 1].addingTimeInterval(Timing.seconds(window.duration))
        }
        let hasAllow = windows.contains { $0.kind == .allow }
        func allowed(_ moment: Date) -> Bool {
            if starts.contains(where: { $0.0.kind == .deny && open($0.0, $0.1, at: moment) }) { return false }
            return !hasAllow || starts.contains { $0.0.kind == .allow && open($0.0, $0.1, at: moment) }
        }
        let moments = starts.flatMap { window, starts in
            starts.flatMap { [$0, $0.addingTimeInterval(Timing.seconds(window.duration))] }
        }.filter { $0 > date && $0 <= horizon }
        return Set(moments).sorted().first(where: allowed)
    }

    /// Decodes `windows:` from `node`; problems go to `doc`.
    static func decodeList(_ node: Node, _ what: String, _ doc: inout YAMLDocument) -> [ServeWindow] {
        var windows: [ServeWindow] = []
        for item in doc.sequence(node, "'\(what)'") ?? [] {
            guard let pairs = doc.mapping(item, "a window of '\(what)'", allowed: keys) else { continue }
            func value(_ key: String) -> Node? { pairs.first { $0.key == key }?.value }
            guard let kindNode = value("kind"), let scheduleNode = value("schedule"),
                let durationNode = value("duration")
            else {
                doc.error(
                    "a window of '\(what)' needs 'kind' (allow or deny), 'schedule' (cron, such as \"0 9 * * 1-5\") and 'duration' (such as 8h).",
                    item)
                continue
            }
            guard let kindText = doc.string(kindNode, "'kind'"),
                let scheduleText = doc.string(scheduleNode, "'schedule'"),
                let durationText = doc.string(durationNode, "'duration'")
            else { continue }
            guard let kind = Kind(rawValue: kindText) else {
                doc.error("a window's 'kind' must be allow or deny, not '\(kindText.escapedOnOneLine)'.", kindNode)
                continue
            }
            let schedule: CronSchedule
            do {
                schedule = try CronSchedule(parsing: scheduleText)
            } catch let error as CronSchedule.ParseError {
                doc.error("a window's 'schedule' \(error.description)", scheduleNode)
                continue
            } catch {
                continue
            }
            guard let duration = ServeSettings.duration(durationText), duration >= .seconds(60),
                duration <= .seconds(7 * 86_400)
            else {
                doc.error(
                    "a window's 'duration' must be from 1m to 7d, such as 8h, not '\(durationText.escapedOnOneLine)'.",
                    durationNode)
                continue
            }
            var timeZone = TimeZone(identifier: "UTC")!
            if let zoneNode = value("time_zone") {
                guard let name = doc.string(zoneNode, "'time_zone'") else { continue }
                guard let zone = TimeZone(identifier: name) else {
                    doc.error(
                        "a window's 'time_zone' must be a time zone such as Europe/Berlin or America/New_York, not '\(name.escapedOnOneLine)'.",
                        zoneNode)
                    continue
                }
                timeZone = zone
            }
            windows.append(
                ServeWindow(
                    kind: kind, schedule: schedule, duration: duration, timeZone: timeZone,
                    location: doc.location(item)))
        }
        return windows
    }
}

/// A cron expression of five fields: minute (0–59), hour (0–23), day of the month (1–31), month
/// (1–12 or JAN–DEC) and day of the week (0–7, 0 and 7 being Sunday, or SUN–SAT). Each field is `*`,
/// a value, a range `a-b`, a step `*/n` or `a-b/n`, or a list of these separated by commas. As in
/// cron, when both day fields are restricted a day matches when either does.
public struct CronSchedule: Sendable, Equatable, CustomStringConvertible {
    /// The expression as written.
    public var description: String
    private var minutes: Set<Int>
    private var hours: Set<Int>
    private var days: Set<Int>
    private var months: Set<Int>
    private var weekdays: Set<Int>
    private var daysRestricted: Bool
    private var weekdaysRestricted: Bool

    /// Why an expression is not one.
    public struct ParseError: Error, CustomStringConvertible {
        /// What is wrong, as the end of a sentence.
        public var description: String
    }

    /// Reads `text`; throws a `ParseError` saying which field is wrong.
    public init(parsing text: String) throws {
        description = text
        let fields = text.split(whereSeparator: \.isWhitespace).map(String.init)
        guard fields.count == 5 else {
            throw ParseError(
                description:
                    "must be a cron expression of five fields (minute hour day-of-month month day-of-week), such as \"0 9 * * 1-5\", not '\(text.escapedOnOneLine)'."
            )
        }
        let monthNames = ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"]
        let dayNames = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"]
        minutes = try Self.field(fields[0], "minute", 0...59)
        hours = try Self.field(fields[1], "hour", 0...23)
        days = try Self.field(fields[2], "day of the month", 1...31)
        months = try Self.field(fields[3], "month", 1...12, names: monthNames, firstName: 1)
        weekdays = Set(
            try Self.field(fields[4], "day of the week", 0...7, names: dayNames, firstName: 0).map { $0 % 7 })
        daysRestricted = fields[2] != "*"
        weekdaysRestricted = fields[4] != "*"
    }

    /// Whether the minute of `date` (read in `calendar`'s time zone) is one the schedule names.
    public func matches(_ date: Date, calendar: Calendar) -> Bool {
        let parts = calendar.dateComponents([.minute, .hour, .day, .month, .weekday], from: date)
        guard let minute = parts.minute, let hour = parts.hour, let day = parts.day, let month = parts.month,
            let weekday = parts.weekday
        else { return false }
        guard minutes.contains(minute), hours.contains(hour), months.contains(month) else { return false }
        let dayMatches = days.contains(day)
        let weekdayMatches = weekdays.contains(weekday - 1)
        if daysRestricted, weekdaysRestricted { return dayMatches || weekdayMatches }
        return dayMatches && weekdayMatches
    }

    private static func field(
        _ text: String, _ name: String, _ range: ClosedRange<Int>, names: [String] = [], firstName: Int = 0
    ) throws -> Set<Int> {
        func number(_ word: Substring) throws -> Int {
            if let value = Int(word), range.contains(value) { return value }
            if let index = names.firstIndex(of: word.uppercased()) { return index + firstName }
            throw ParseError(
                description:
                    "has '\(word)' as its \(name), which must be from \(range.lowerBound) to \(range.upperBound)\(names.isEmpty ? "" : " or a name such as \(names[1])")."
            )
        }
        var values = Set<Int>()
        for part in text.split(separator: ",", omittingEmptySubsequences: false) {
            let pieces = part.split(separator: "/", omittingEmptySubsequences: false)
            guard pieces.count <= 2, !pieces[0].isEmpty else {
                throw ParseError(description: "has '\(part)' as its \(name), which cron does not read.")
            }
            var step = 1
            if pieces.count == 2 {
                guard let value = Int(pieces[1]), value > 0 else {
                    throw ParseError(
                        description: "has the step '\(pieces[1])' in its \(name); a step is a number from 1.")
                }
                step = value
            }
            let bounds: ClosedRange<Int>
            if pieces[0] == "*" {
                bounds = range
            } else if let dash = pieces[0].firstIndex(of: "-") {
                let low = try number(pieces[0][..<dash])
                let high = try number(pieces[0][pieces[0].index(after: dash)...])
                guard low <= high else {
                    throw ParseError(description: "has the range '\(pieces[0])' in its \(name), which runs backwards.")
                }
                bounds = low...high
            } else {
                let value = try number(pieces[0])
                bounds = value...(pieces.count == 2 ? range.upperBound : value)
            }
            values.formUnion(stride(from: bounds.lowerBound, through: bounds.upperBound, by: step))
        }
        return values
    }
}
