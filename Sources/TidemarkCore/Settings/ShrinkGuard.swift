import Foundation

/// Refuses an inventory read that lost far more devices than the last apply recorded for its source:
/// an export that printed 1% of its rows and exited 0, a query against an emptied replica, an
/// `exclude_if` whose column changed its unit all look like devices leaving, and the plan would
/// unsubscribe them. Past the limit, plan and apply stop before anything is read from FCM, with the
/// two counts and how to accept them.
public struct ShrinkGuard: Sendable, Equatable {
    /// The share of a source's devices that may go between applies (`max_shrink`, default 10%).
    public var share = 0.1
    /// `max_shrink` of a configured source, by source name.
    public var perSource: [String: Double] = [:]
    /// A source may lose this many devices whatever its share (a test cohort of five losing one is
    /// not a broken export).
    public var minimum = 10

    /// The defaults: 10% per source, and at least 10 devices.
    public init() {}

    /// The share `source` may lose: its own `max_shrink`, else the project's.
    public func share(for source: String) -> Double { perSource[source] ?? share }

    /// What `max_shrink` must be, for `whose` (a source, or every source), in its error.
    static func meaning(_ whose: String) -> String {
        "the share of its devices \(whose) may lose between applies, such as 10% or 0.1 (100% turns the check off)"
    }

    /// One source that read too few devices.
    public struct Shrink: Sendable, Equatable, CustomStringConvertible {
        /// The source's name.
        public var source: String
        /// Devices the last apply recorded for the source; nil when it recorded none (a first apply).
        public var before: Int?
        /// Devices read now, after `exclude_if`.
        public var now: Int
        /// Rows `exclude_if` left out now.
        public var excluded: Int
        /// The share it was allowed to lose.
        public var limit: Double

        /// The refusal, as a sentence with both counts and how to accept them.
        public var description: String {
            let percent = "\(Int((limit * 100).rounded()))%"
            let excludedNote =
                excluded > 0
                ? "; exclude_if left out \(PlanRenderer.formatCount(excluded)) of its \(PlanRenderer.formatCount(now + excluded)) rows"
                : ""
            if let before {
                let lost = Double(before - now) / Double(before)
                return
                    "inventory source '\(source)' read \(PlanRenderer.formatCount(now)) devices, \(Int((lost * 100).rounded()))% fewer than the \(PlanRenderer.formatCount(before)) the last apply recorded (max_shrink allows \(percent))\(excludedNote)"
            }
            return
                "inventory source '\(source)': exclude_if left out \(PlanRenderer.formatCount(excluded)) of its \(PlanRenderer.formatCount(now + excluded)) rows, more than the \(percent) max_shrink allows, and no apply recorded this source before"
        }
    }

    /// The error for `shrinks`: each source, why it matters, and how to accept it.
    public static func message(_ shrinks: [Shrink]) -> String {
        let lines = shrinks.map { "  - \($0.description)" }.joined(separator: "\n")
        return """
            the inventory shrank more than tidemark accepts without being told:
            \(lines)
            A broken export or query looks exactly like devices leaving, and the plan would unsubscribe them; nothing was read from FCM or changed. Check the source. If the devices really left, run again with --allow-shrink, or raise 'max_shrink' (on the source in tidemark.yaml, or for every source at the top level).
            """
    }
}
