import Foundation

/// Why a file cannot be read as a saved plan.
public struct SavedPlanError: TidemarkError {
    /// `unreadable_plan`.
    public var reason: FailureReason { "unreadable_plan" }

    /// The reason, as a sentence naming the file's problem.
    public var description: String

    /// An error whose whole message is `description`.
    public init(description: String) { self.description = description }
}

extension Plan {
    /// `"kind"` keys in a plan outside its operations (the backend's, the coverage's), at most.
    static let otherKinds = 100

    /// How many `"kind"` keys `data` holds (one per operation, and a few more), counting up to one
    /// past `limit`.
    static func operationCount(_ data: Data, atMost limit: Int) -> Int {
        let needle = Array(#""kind""#.utf8)
        return data.withUnsafeBytes { (raw: UnsafeRawBufferPointer) -> Int in
            let bytes = raw.bindMemory(to: UInt8.self)
            guard bytes.count >= needle.count, let base = bytes.baseAddress else { return 0 }
            var count = 0
            var i = 0
            while i <= bytes.count - needle.count, count <= limit {
                guard let hit = memchr(base + i, Int32(needle[0]), bytes.count - needle.count + 1 - i) else { break }
                let at = UnsafeRawPointer(hit).assumingMemoryBound(to: UInt8.self) - base
                if memcmp(base + at, needle, needle.count) == 0 { count += 1 }
                i = at + 1
            }
            return count
        }
    }

    /// Reads a plan saved with `tidemark plan --out FILE`, refusing what is not one, a newer format, or
    /// an invalid selection; `file` names it in messages.
    public static func decodeSaved(
        _ data: Data, file: String, maxOperations: Int = InputLimits().planOperations
    ) throws(SavedPlanError) -> Plan {
        struct Header: Decodable { var formatVersion: Int? }
        // tidemark writes plans as UTF-8; another encoding (a UTF-16 re-save) is not the file it wrote.
        if data.starts(with: [0xFE, 0xFF]) || data.starts(with: [0xFF, 0xFE]) || data.prefix(4).contains(0) {
            throw SavedPlanError(
                description:
                    "\(file) is not UTF-8 (it looks like UTF-16, as some editors re-save files); apply the file 'tidemark plan --out' wrote, unchanged."
            )
        }
        // Counted before anything is decoded: decoding (even of the header) costs several times the
        // file's size in memory. A few other parts of a plan have a "kind" too, hence the slack.
        let operations = Self.operationCount(data, atMost: maxOperations + Self.otherKinds)
        guard operations <= maxOperations + Self.otherKinds else {
            throw SavedPlanError(
                description:
                    "\(file) has more than \(maxOperations) operations, more than any plan tidemark makes here; if it is meant to be this large, raise limits.plan_operations in tidemark.yaml."
            )
        }
        let header = try? Plan.decoder().decode(Header.self, from: data)
        guard let version = header?.formatVersion else {
            throw SavedPlanError(
                description:
                    "\(file) is not a tidemark plan file (no format_version); save a plan with 'tidemark plan --out plan.json' and apply that file."
            )
        }
        guard version >= 1 else {
            throw SavedPlanError(
                description:
                    "\(file) has plan format \(version), which no tidemark writes; apply the file 'tidemark plan --out' wrote, unchanged."
            )
        }
        guard version <= Plan.currentFormatVersion else {
            throw SavedPlanError(
                description:
                    "\(file) has plan format \(version); this tidemark reads up to \(Plan.currentFormatVersion). Upgrade tidemark."
            )
        }
        let plan: Plan
        do {
            plan = try Plan.decoder().decode(Plan.self, from: data)
        } catch {
            throw SavedPlanError(
                description:
                    "\(file) is not a valid tidemark plan: \((error as? DecodingError).map { ErrorText.describe($0, snakeCase: true) } ?? ErrorText.describe(error)). Make a new plan with 'tidemark plan --out'."
            )
        }
        guard plan.serial >= 0 else {
            throw SavedPlanError(
                description:
                    "\(file) names state serial \(plan.serial), which no state has; apply the file 'tidemark plan --out' wrote, unchanged."
            )
        }
        if let recorded = plan.operationsDigestWhenMade, recorded != plan.operationsDigest {
            throw SavedPlanError(
                description:
                    "\(file) was edited or damaged after it was made: its operations no longer match the digest it was saved with. Apply only plans as 'tidemark plan --out' wrote them; make a new plan."
            )
        }
        if let problem = plan.shapeProblem {
            throw SavedPlanError(
                description:
                    "\(file) is not a plan tidemark could have written: \(problem). Apply only plans as 'tidemark plan --out' wrote them; make a new plan."
            )
        }
        do {
            _ = try plan.selection
        } catch {
            throw SavedPlanError(description: "\(file) has an invalid target selection: \(error.description)")
        }
        var coalesced = plan
        coalesced.operations = Plan.coalesced(plan.operations)
        return coalesced
    }
}
