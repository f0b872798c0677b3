import Foundation
import TidemarkCore
import TidemarkRuntime

/// The use cases of the commands that talk to a running `serve` through its state store (`status`,
/// `suspend`, `resume`, `reconcile`): the workspaces tidemark.yaml lists under `serve.workspaces`, or
/// without that section the project's workspace (`--workspace`, `--state`).
public struct ServedWorkspaces: Sendable {
    /// The flags the runtimes are loaded with.
    public var flags: RuntimeFlags
    /// The registries they are built from.
    public var registries: Registries

    /// The served workspaces of the project `flags` name.
    public init(_ flags: RuntimeFlags, registries: Registries = .standard) {
        self.flags = flags
        self.registries = registries
    }

    /// The runtime of `name`, or of every served workspace when nil. A name tidemark.yaml's
    /// `serve.workspaces` does not list is refused, naming the section and the names it lists.
    public func runtimes(_ name: String?) throws -> [Runtime] {
        let project = try Runtime.load(flags, registries: registries)
        guard let section = project.settings.serve, !section.workspaces.isEmpty else {
            guard let name else { return [project] }
            var named = flags
            named.workspace = name
            return [try Runtime.load(named, registries: registries)]
        }
        guard let name else {
            return try section.workspaces.map {
                try Runtime.load(flags, serveWorkspace: $0.name, registries: registries)
            }
        }
        guard section.workspace(name) != nil else {
            throw RuntimeError(
                "tidemark.yaml lists no workspace '\(name)' under 'serve.workspaces' (\(section.location)); it lists \(section.workspaces.map(\.name).joined(separator: ", "))."
            )
        }
        return [try Runtime.load(flags, serveWorkspace: name, registries: registries)]
    }

    /// Each workspace (`name`, or every served one) with its record as its state store holds it.
    /// Creates nothing: a state file that does not exist, or a workspace no `serve` has recorded in
    /// its store, is refused naming the store and what chose it; without `name`, the workspaces no
    /// `serve` recorded are listed as such unless none was.
    public func records(_ name: String?) async throws -> [(runtime: Runtime, record: ServeRecord)] {
        var entries: [(runtime: Runtime, record: ServeRecord)] = []
        for runtime in try runtimes(name) {
            entries.append((runtime, try await Self.record(of: runtime)))
        }
        if !entries.contains(where: \.record.everServed), let first = entries.first {
            throw Self.neverServed(first.runtime)
        }
        return entries
    }

    /// The record of `runtime`'s workspace, read without creating the state: a state file that does
    /// not exist is refused.
    static func record(of runtime: Runtime) async throws -> ServeRecord {
        if case .file(let path) = runtime.resolved.state, !FileManager.default.fileExists(atPath: path) {
            throw RuntimeError(
                "there is no state at \(runtime.stateDisplay) (chosen by \(runtime.resolved.stateOrigin)), so no 'tidemark serve' runs with it; point --state or TIDEMARK_STATE_URL at the state the replicas use."
            )
        }
        return try await runtime.serveRecords().serveRecord()
    }

    /// The refusal for a workspace no `serve` has recorded in its store.
    static func neverServed(_ runtime: Runtime) -> RuntimeError {
        RuntimeError(
            "no 'tidemark serve' has run workspace '\(runtime.workspaceName)' with the state \(runtime.stateDisplay) (chosen by \(runtime.resolved.stateOrigin)); check the workspace (the argument, --workspace or 'workspace' in tidemark.yaml) and the state the replicas use."
        )
    }

    /// What `tidemark status --format json` prints of `entries` at `now`: the `/status` type.
    public static func report(_ entries: [(runtime: Runtime, record: ServeRecord)], now: Date) -> StatusReport {
        StatusReport(workspaces: entries.map { .init(record: $0.record, state: $0.runtime.stateDisplay, now: now) })
    }

    /// Records `control` for the workspace `name` (nil: the one workspace `serve` runs, refused when
    /// there are several), asked by `requester` (default: this user on this host) for `reason`; returns the workspace's runtime and its
    /// record after the request. A workspace no `serve` has recorded in its store is refused, and
    /// nothing is written then.
    public func request(
        _ control: ServeControl, _ name: String?, by requester: (Runtime) -> String = { $0.requester },
        reason: String? = nil
    ) async throws -> (runtime: Runtime, record: ServeRecord) {
        let candidates = try runtimes(name)
        guard candidates.count == 1, let runtime = candidates.first else {
            throw RuntimeError(
                "tidemark.yaml lists several workspaces under 'serve.workspaces' (\(candidates.map(\.workspaceName).joined(separator: ", "))); name the one to \(control.rawValue)."
            )
        }
        guard try await Self.record(of: runtime).everServed else { throw Self.neverServed(runtime) }
        return (
            runtime, try await runtime.serveRecords().requestControl(control, by: requester(runtime), reason: reason)
        )
    }

    /// Waits until the owner of `runtime`'s workspace publishes the result of a reconcile that began
    /// after `askedAt` (within a second), for at most `limit`; returns the record then, nil at the limit.
    /// `waiting` is told every `every` what it waits for (the record as last read).
    public static func waitForReconcile(
        of runtime: Runtime, askedAt: Date, limit: Duration, every: Duration = .seconds(10),
        waiting: (ServeRecord) -> Void
    ) async throws -> ServeRecord? {
        let store = try runtime.serveRecords()
        let timing = runtime.timing
        let deadline = timing.now() + limit
        var lastSaid = timing.now()
        while timing.now() < deadline {
            try await timing.sleep(.milliseconds(500))
            let record = try await store.serveRecord()
            if let data = record.status,
                let status = try? WorkspaceStatus.decoder.decode(WorkspaceStatus.self, from: data),
                let last = status.last, last.startedAt >= askedAt.addingTimeInterval(-1),
                status.phase != .reconciling
            {
                return record
            }
            if timing.now() - lastSaid >= every {
                lastSaid = timing.now()
                waiting(record)
            }
        }
        return nil
    }
}

extension ServeRecord {
    /// Whether a `serve` ever recorded the workspace: it was claimed, a replica stood by for it, or a
    /// status was published.
    public var everServed: Bool { owner != nil || status != nil || !replicas.isEmpty }

    /// The status its owner last published, when this version can read it.
    public var publishedStatus: WorkspaceStatus? {
        status.flatMap { try? WorkspaceStatus.decoder.decode(WorkspaceStatus.self, from: $0) }
    }
}
