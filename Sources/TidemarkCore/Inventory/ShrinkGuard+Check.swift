import Foundation

extension ShrinkGuard {
    /// The sources in `snapshots` that shrank past their limit against `recorded` (`State.inventoryRows`).
    public func check(_ snapshots: [String: InventorySnapshot], against recorded: [String: Int]) -> [Shrink] {
        var found: [Shrink] = []
        for (source, snapshot) in snapshots.sorted(by: { $0.key < $1.key }) {
            guard let now = snapshot.rows else { continue }
            let limit = share(for: source)
            let excluded = snapshot.excluded ?? 0
            if let before = recorded[source], before > 0 {
                let lost = before - now
                if lost > minimum, Double(lost) > Double(before) * limit {
                    found.append(Shrink(source: source, before: before, now: now, excluded: excluded, limit: limit))
                }
            } else if excluded > minimum, Double(excluded) > Double(now + excluded) * limit {
                found.append(Shrink(source: source, before: nil, now: now, excluded: excluded, limit: limit))
            }
        }
        return found
    }
}
