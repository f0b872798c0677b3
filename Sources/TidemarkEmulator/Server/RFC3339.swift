import Foundation

/// Timestamps as Google's JSON APIs write them: `2026-01-15T01:30:15.010Z`, and IID's `addDate` (`2026-01-15`).
enum RFC3339 {
    static func timestamp(_ date: Date) -> String {
        let (day, seconds, millis) = parts(date)
        return day + "T" + digits(seconds / 3600, 2) + ":" + digits(seconds / 60 % 60, 2) + ":"
            + digits(seconds % 60, 2)
            + "." + digits(millis, 3) + "Z"
    }

    private static func digits(_ value: Int, _ width: Int) -> String {
        let text = String(value)
        return text.count >= width ? text : String(repeating: "0", count: width - text.count) + text
    }

    static func date(_ date: Date) -> String { parts(date).day }

    private static func parts(_ date: Date) -> (day: String, seconds: Int, millis: Int) {
        let total = date.timeIntervalSince1970
        let whole = Int(total.rounded(.down))
        let millis = min(999, Int(((total - Double(whole)) * 1000).rounded(.down)))
        var days = whole.quotientAndRemainder(dividingBy: 86_400)
        if days.remainder < 0 { days = (days.quotient - 1, days.remainder + 86_400) }
        // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
        let z = days.quotient + 719_468
        let era = (z >= 0 ? z : z - 146_096) / 146_097
        let doe = z - era * 146_097
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100)
        let mp = (5 * doy + 2) / 153
        let d = doy - (153 * mp + 2) / 5 + 1
        let m = mp < 10 ? mp + 3 : mp - 9
        let y = yoe + era * 400 + (m <= 2 ? 1 : 0)
        return (digits(y, 4) + "-" + digits(m, 2) + "-" + digits(d, 2), days.remainder, millis)
    }
}
