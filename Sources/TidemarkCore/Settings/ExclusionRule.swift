import Foundation

/// Devices a source leaves out: those whose `column` (a time) is older than `maxAge` seconds.
public struct ExclusionRule: Sendable, Equatable {
    /// The label (or column) holding when the device was last seen.
    public var column: String
    /// Devices last seen longer ago than this many seconds are left out.
    public var maxAge: Int64
    /// The original wording (`270d`), for messages.
    public var text: String

    /// A rule on `column` (default `last_seen`).
    public init(column: String = "last_seen", maxAge: Int64, text: String) {
        self.column = column
        self.maxAge = maxAge
        self.text = text
    }

    /// Epoch seconds from a number in seconds, milliseconds, microseconds or nanoseconds.
    static func epoch(_ number: Double) -> Int64? {
        let magnitude = abs(number)
        let seconds: Double
        switch magnitude {
        case ..<1e11: seconds = number
        case ..<1e14: seconds = number / 1e3
        case ..<1e17: seconds = number / 1e6
        case ..<1e20: seconds = number / 1e9
        default: return nil
        }
        return Int64(seconds.rounded(.down))
    }

    /// What `exclude_if` makes of a device seen at `value`, at `now` (seconds since 1970).
    public enum Verdict: Sendable, Equatable {
        case keep, exclude
        /// Not a time tidemark reads.
        case unreadable
        /// A time no device was seen at (before FCM existed, or in the future): read in a unit it is not
        /// written in, or a placeholder such as 1970-01-01; the seconds it read as.
        case implausible(Int64)
    }

    /// The earliest time a device can have been seen (2008-01-01, before FCM and GCM existed).
    public static let earliest: Int64 = 1_199_145_600

    /// What the rule makes of a device last seen at `value` (a time as the source writes it), at `now`.
    public func verdict(_ value: String, now: Int64) -> Verdict {
        if value.isEmpty { return .keep }  // nothing says it is stale
        guard let seen = Self.time(value) else { return .unreadable }
        // A clock a day or two ahead of this machine's is not an error; a time years ahead is.
        guard seen >= Self.earliest, seen <= now + 2 * 86_400 else { return .implausible(seen) }
        return now - seen > maxAge ? .exclude : .keep
    }

    /// Whether a device seen at `value` is excluded at `now` (seconds since 1970); nil when `value`
    /// is not a plausible time. An empty value keeps the device (nothing says it is stale).
    public func excludes(_ value: String, now: Int64) -> Bool? {
        switch verdict(value, now: now) {
        case .keep: false
        case .exclude: true
        case .unreadable, .implausible: nil
        }
    }

    /// Seconds since 1970 in the forms databases and exports write: epoch seconds, milliseconds,
    /// microseconds or nanoseconds (told apart by magnitude: from 2001 to 5138 each unit has its own
    /// number of digits), `2026-05-01`, `2026-05-01T10:00:00Z`, `2026-05-01 10:00:00.123+00`
    /// (PostgreSQL's text form).
    public static func time(_ text: String) -> Int64? {
        if let number = Int64(text) { return epoch(Double(number)) }
        if let first = text.utf8.first, first == UInt8(ascii: "-") || (first >= 48 && first <= 57),
            let number = Double(text), number.isFinite
        {
            return epoch(number)
        }
        let bytes = Array(text.utf8)
        func number(_ range: Range<Int>) -> Int? {
            guard range.upperBound <= bytes.count else { return nil }
            var value = 0
            for b in bytes[range] {
                guard b >= 48, b <= 57 else { return nil }
                value = value * 10 + Int(b - 48)
            }
            return value
        }
        guard bytes.count >= 10, bytes[4] == UInt8(ascii: "-"), bytes[7] == UInt8(ascii: "-"),
            let year = number(0..<4), let month = number(5..<7), let day = number(8..<10), (1...12).contains(month),
            (1...31).contains(day)
        else { return nil }
        var seconds = 0
        var offset = 0
        if bytes.count > 10 {
            guard bytes[10] == UInt8(ascii: "T") || bytes[10] == UInt8(ascii: " "), let hour = number(11..<13),
                bytes.count >= 19, let minute = number(14..<16), let second = number(17..<19)
            else { return nil }
            seconds = hour * 3600 + minute * 60 + second
            var i = 19
            if i < bytes.count, bytes[i] == UInt8(ascii: ".") {
                i += 1
                while i < bytes.count, bytes[i] >= 48, bytes[i] <= 57 { i += 1 }
            }
            if i < bytes.count {
                switch bytes[i] {
                case UInt8(ascii: "Z"), UInt8(ascii: "z"): i += 1
                case UInt8(ascii: "+"), UInt8(ascii: "-"):
                    let sign = bytes[i] == UInt8(ascii: "+") ? 1 : -1
                    guard let hours = number((i + 1)..<(i + 3)) else { return nil }
                    i += 3
                    var minutes = 0
                    if i < bytes.count, bytes[i] == UInt8(ascii: ":") { i += 1 }
                    if i + 2 <= bytes.count, let m = number(i..<(i + 2)) {
                        minutes = m
                        i += 2
                    }
                    offset = sign * (hours * 3600 + minutes * 60)
                default: return nil
                }
            }
            guard i == bytes.count else { return nil }
        }
        // Days from the civil date (Howard Hinnant's algorithm).
        let y = month <= 2 ? year - 1 : year
        let era = (y >= 0 ? y : y - 399) / 400
        let yoe = y - era * 400
        let mp = (month + 9) % 12
        let doy = (153 * mp + 2) / 5 + day - 1
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy
        let days = era * 146_097 + doe - 719_468
        return Int64(days * 86_400 + seconds - offset)
    }
}
