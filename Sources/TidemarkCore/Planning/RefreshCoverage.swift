import Foundation

/// What a refresh covered: recorded in plans and drift reports so a verdict says how far it looked.
public struct RefreshCoverage: Sendable, Codable, Equatable {
    /// The mode the refresh ran in.
    public var mode: RefreshMode
    /// Registrations tidemark knows and does not hold as dead: the fleet.
    public var fleet: Int
    /// Registrations read by this refresh.
    public var read: Int
    /// Of those, the ones the plan would change (before reading).
    public var touched: Int
    /// Of those, read because their last read was older than `refresh_max_age`.
    public var stale: Int
    /// Of those, read as the sweep's slice.
    public var sampled: Int
    /// The sweep's budget for this run (sample only).
    public var budget: Int?
    /// Registrations of the fleet not read now that were never read before.
    public var neverRead: Int
    /// The oldest last read (seconds since 1970) among the fleet's registrations not read now that
    /// were read before; nil when there are none.
    public var oldestUnread: Int64?
    /// When the refresh ran (seconds since 1970).
    public var at: Int64

    /// A coverage report.
    public init(
        mode: RefreshMode, fleet: Int, read: Int, touched: Int = 0, stale: Int = 0, sampled: Int = 0,
        budget: Int? = nil, neverRead: Int = 0, oldestUnread: Int64? = nil, at: Int64
    ) {
        self.mode = mode
        self.fleet = fleet
        self.read = read
        self.touched = touched
        self.stale = stale
        self.sampled = sampled
        self.budget = budget
        self.neverRead = neverRead
        self.oldestUnread = oldestUnread
        self.at = at
    }

    /// Every registration of the fleet was read now, or has been read before (a completed sweep).
    public var coversFleet: Bool { read >= fleet || neverRead == 0 }

    /// Every registration of the fleet was read by this refresh.
    public var readWholeFleet: Bool { read >= fleet }

    /// Applies (at this budget) until every registration has been read at least once.
    public var runsToCompleteSweep: Int? {
        guard neverRead > 0, let budget, budget > 0 else { return nil }
        return (neverRead + budget - 1) / budget
    }
}

extension State {
    /// The registrations of the fleet: every token known that is not held as dead.
    public func fleet() -> TokenSet {
        TokenSet(sorted: (0..<UInt32(tokens.count)).filter { !dead.contains($0) })
    }

    /// The registrations a refresh under `policy` reads when the plan would change `touched`, and what
    /// that covers (before the read; `read` is what was chosen). `salt` orders registrations read at
    /// the same time, so each slice of the sweep is spread over the fleet rather than in inventory order.
    public func refreshSelection(
        _ policy: RefreshPolicy, touched: TokenSet, now: Int64, salt: UInt64 = 0
    ) -> (ids: TokenSet, coverage: RefreshCoverage, sampled: TokenSet) {
        let copy = self
        let fleet = copy.fleet()
        switch policy.mode {
        case .none:
            return (TokenSet(), copy.coverage(policy, fleet: fleet, read: TokenSet(), now: now), TokenSet())
        case .all:
            let all = TokenSet(sorted: Array(0..<UInt32(copy.tokens.count)))
            var coverage = copy.coverage(policy, fleet: fleet, read: all, now: now)
            coverage.touched = touched.count
            return (all, coverage, TokenSet())
        case .touched, .sample:
            var chosen = touched
            var stale: [UInt32] = []
            if let maxAge = policy.maxAge {
                let cutoff = now - maxAge
                for id in fleet.subtracting(touched) where copy.seenAt[Int(id)] < cutoff { stale.append(id) }
                chosen.formUnion(TokenSet(sorted: stale))
            }
            var sampled = TokenSet()
            var budget: Int?
            if policy.mode == .sample {
                let reads = policy.budget.reads(fleet: fleet.count)
                budget = reads
                sampled = TokenSet(copy.sweepSlice(reads, fleet: fleet, skipping: chosen, salt: salt))
                chosen.formUnion(sampled)
            }
            var coverage = copy.coverage(policy, fleet: fleet, read: chosen, now: now)
            coverage.touched = touched.count
            coverage.stale = stale.count
            coverage.sampled = sampled.count
            coverage.budget = budget
            return (chosen, coverage, sampled)
        }
    }

    /// The `count` registrations of `fleet` not in `skipping` read longest ago (never read first),
    /// ties in an order drawn from `salt`.
    func sweepSlice(_ count: Int, fleet: TokenSet, skipping: TokenSet, salt: UInt64) -> [UInt32] {
        guard count > 0 else { return [] }
        var keys: [(key: UInt64, id: UInt32)] = []
        keys.reserveCapacity(fleet.count)
        for id in fleet.subtracting(skipping) {
            let seen = UInt64(clamping: max(0, seenAt[Int(id)]))
            keys.append(((min(seen, 0xFFFF_FFFF) << 32) | (Self.mix(UInt64(id) ^ salt) & 0xFFFF_FFFF), id))
        }
        if keys.count <= count { return keys.map(\.id) }
        keys.sort { $0.key < $1.key }
        return keys.prefix(count).map(\.id)
    }

    /// SplitMix64's step: a cheap, well-spread permutation of ids.
    static func mix(_ value: UInt64) -> UInt64 { StringIndex.mix(value &+ 0x9E37_79B9_7F4A_7C15) }

    func coverage(_ policy: RefreshPolicy, fleet: TokenSet, read: TokenSet, now: Int64) -> RefreshCoverage {
        var neverRead = 0
        var oldest: Int64?
        for id in fleet.subtracting(read) {
            let seen = seenAt[Int(id)]
            if seen <= 0 {
                neverRead += 1
            } else {
                oldest = min(oldest ?? seen, seen)
            }
        }
        return RefreshCoverage(
            mode: policy.mode, fleet: fleet.count, read: read.count, neverRead: neverRead, oldestUnread: oldest,
            at: now)
    }
}
