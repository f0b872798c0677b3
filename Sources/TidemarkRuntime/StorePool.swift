import Synchronization
import TidemarkCore

/// The state stores of a long-running process (`serve`): one per state and workspace, shared by every
/// runtime the process loads for it (`Runtime.sharing`), so a workspace keeps one connection however
/// often its settings are reloaded; closed together when the process is done with them.
public final class StorePool: Sendable {
    /// Which store: the state's location (its path or its whole URL) and the workspace.
    struct Key: Hashable, Sendable {
        var state: String
        var workspace: String

        init(_ resolved: ResolvedSettings) {
            switch resolved.state {
            case .file(let path): state = path
            case .url(_, let text): state = text
            }
            workspace = resolved.workspace
        }
    }

    private let stores = Mutex<[Key: any StateStore]>([:])

    /// An empty pool.
    public init() {}

    /// How many stores the pool keeps.
    public var count: Int { stores.withLock { $0.count } }

    /// The pool's store for `key`, keeping `opened` as that store when it has none.
    func store(for key: Key, else opened: any StateStore) -> any StateStore {
        stores.withLock { stores in
            if let kept = stores[key] { return kept }
            stores[key] = opened
            return opened
        }
    }

    /// Closes every store and empties the pool (a runtime still holding one opens it again on use).
    public func close() async {
        let taken = stores.withLock { stores in
            defer { stores = [:] }
            return Array(stores.values)
        }
        for store in taken { await store.close() }
    }
}
