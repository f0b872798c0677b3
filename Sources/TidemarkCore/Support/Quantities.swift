import Foundation

/// The quantities tidemark.yaml and the flags write as text: durations such as `270d` and shares such
/// as `25%`.
public enum Quantities {
    /// Seconds in a duration such as `270d`, `12h`, `30m`, `90s` or `2w`; nil when it is not one.
    public static func seconds(_ text: String) -> Int64? {
        let units: [(Character, Int64)] = [("s", 1), ("m", 60), ("h", 3600), ("d", 86_400), ("w", 604_800)]
        guard let last = text.last, let unit = units.first(where: { $0.0 == last }),
            let number = Int64(text.dropLast()), number > 0, number < Int64.max / unit.1
        else { return nil }
        return number * unit.1
    }

    /// A share as tidemark.yaml writes one (`max_shrink`, `dead_share`): `25%` or `0.25`, from 0 to 100%.
    public static func share(_ text: String) -> Double? {
        let number = text.hasSuffix("%") ? Double(text.dropLast()).map { $0 / 100 } : Double(text)
        guard let number, number.isFinite, number >= 0, number <= 1 else { return nil }
        return number
    }
}
