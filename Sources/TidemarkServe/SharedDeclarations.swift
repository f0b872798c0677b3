import Synchronization
import TidemarkRuntime

/// The topics and device groups that two of serve's workspaces declare in one FCM project, as serve
/// knows their manifests: on disk for most, and for a workspace whose manifests come from git
/// (`source:`), the checkout its last reconcile fetched. Each workspace plans against its own state,
/// so one's apply undoes the other's (`Runtime.sharedDeclarations`).
///
/// Each overlap is warned of once: a reload of tidemark.yaml or a fetch that leaves it as it was says
/// nothing again, and the log says when none is left.
final class SharedDeclarations: Sendable {
    private struct Known {
        /// The workspaces whose manifests are on disk, as last planned.
        var onDisk: [Runtime] = []
        /// Each git-sourced workspace's runtime reading its last checkout, with the commit.
        var fetched: [String: (commit: String, runtime: Runtime)] = [:]
        /// What the last look warned of.
        var said: Set<String> = []
    }

    private let known = Mutex(Known())
    private let log: ServeLog

    init(log: ServeLog) { self.log = log }

    /// The workspaces as serve planned them at start or at a reload: a git-sourced one no longer
    /// listed (or no longer git-sourced) is forgotten with its checkout.
    func planned(_ planned: [Serve.Planned]) {
        let fromGit = Set(planned.filter { $0.source != nil }.map(\.runtime.workspaceName))
        look { known in
            known.onDisk = planned.filter { $0.source == nil }.map(\.runtime)
            known.fetched = known.fetched.filter { fromGit.contains($0.key) }
            return true
        }
    }

    /// A git-sourced workspace's reconcile fetched `commit`; `runtime` reads its checkout. Looks again
    /// only when the commit is new for it.
    func fetched(_ runtime: Runtime, commit: String) {
        look { known in
            guard known.fetched[runtime.workspaceName]?.commit != commit else { return false }
            known.fetched[runtime.workspaceName] = (commit, runtime)
            return true
        }
    }

    /// Updates what is known with `change` (false: nothing changed) and warns of what is new.
    private func look(_ change: (inout Known) -> Bool) {
        let (new, ended) = known.withLock { known -> ([String], Bool) in
            guard change(&known) else { return ([], false) }
            let runtimes = known.onDisk + known.fetched.keys.sorted().compactMap { known.fetched[$0]?.runtime }
            let now = Runtime.sharedDeclarations(runtimes)
            let before = known.said
            known.said = Set(now)
            return (now.filter { !before.contains($0) }, !before.isEmpty && now.isEmpty)
        }
        for sentence in new { log(.warning, sentence) }
        if ended { log("no two workspaces declare one topic or device group in one FCM project any more") }
    }
}
