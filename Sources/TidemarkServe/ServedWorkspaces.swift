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
    public func records(_ name: String?) async throws -> [(runtime: Runtime, record: ServeRecord)] {
        var entries: [(runtime: Runtime, record: ServeRecord)] = []
        for runtime in try runtimes(name) {
            entries.append((runtime, try await runtime.serveRecords().serveRecord()))
        }
        return entries
    }

    /// What `tidemark status --format json` prints of `entries` at `now`: the `/status` type.
    public static func report(_ entries: [(runtime: Runtime, record: ServeRecord)], now: Date) -> StatusReport {
        StatusReport(workspaces: entries.map { .init(record: $0.record, state: $0.runtime.stateDisplay, now: now) })
    }

    /// Records `control` for the workspace `name`, asked by this user on this host; returns the
    /// workspace's runtime and its record after the request.
    public func request(_ control: ServeControl, _ name: String) async throws -> (runtime: Runtime, record: ServeRecord)
    {
        let runtime = try runtimes(name)[0]
        return (runtime, try await runtime.serveRecords().requestControl(control, by: runtime.requester))
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
    /// The status its owner last published, when this version can read it.
    public var publishedStatus: WorkspaceStatus? {
        status.flatMap { try? WorkspaceStatus.decoder.decode(WorkspaceStatus.self, from: $0) }
    }
}
