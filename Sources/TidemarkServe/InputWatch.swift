import CShims
import Foundation
import Synchronization
import TidemarkCore
import TidemarkRuntime
import TidemarkStore

/// What `serve` watches between reconciles besides PostgreSQL changes: the files of a manifests
/// directory (manifests and the inventory files in it or named by it, by size and modification time)
/// and the programs of `exec` sources that set an `interval` (by what they print).
public struct WatchedInputs: Sendable, Equatable {
    /// The manifests directory; nil when the manifests come from git (a new commit is fetched on the
    /// schedule, and its inventory files with it).
    public var manifests: String?
    /// The `exec` sources run on their interval.
    public var commands: [WatchedCommand] = []

    /// Nothing watched.
    public init(manifests: String? = nil, commands: [WatchedCommand] = []) {
        self.manifests = manifests
        self.commands = commands
    }

    /// Whether anything is watched.
    public var isEmpty: Bool { manifests == nil && commands.isEmpty }

    /// What `runtime`'s workspace watches: its manifests directory unless they come from `git`, and
    /// its `exec` sources with an `interval`.
    public static func of(_ runtime: Runtime, git: Bool) -> WatchedInputs {
        let commands = runtime.settings.inventory.compactMap { spec -> WatchedCommand? in
            guard let settings = spec.settings(as: ExecSourceSettings.self), let interval = settings.interval else {
                return nil
            }
            return WatchedCommand(
                name: spec.name, interval: interval,
                runner: ProcessRunner(
                    command: settings.command, directory: runtime.root, timeout: settings.timeout,
                    maxOutput: runtime.settings.limits.inventoryBytes))
        }
        return WatchedInputs(manifests: git ? nil : runtime.manifestsPath, commands: commands)
    }
}

/// An `exec` source whose program `serve` runs every `interval`.
public struct WatchedCommand: Sendable, Equatable {
    /// The source's name in tidemark.yaml.
    public var name: String
    /// How often it is run.
    public var interval: Duration
    /// How it is run, as a reconcile runs it.
    var runner: ProcessRunner

    /// Equal when they run the same program the same way on the same interval.
    public static func == (lhs: WatchedCommand, rhs: WatchedCommand) -> Bool {
        lhs.name == rhs.name && lhs.interval == rhs.interval && lhs.runner.command == rhs.runner.command
            && lhs.runner.directory == rhs.runner.directory && lhs.runner.timeout == rhs.runner.timeout
            && lhs.runner.maxOutput == rhs.runner.maxOutput
    }
}

/// A file as `stat` sees it: a change of any of these is a change of the file.
struct FileStamp: Sendable, Equatable {
    var size: Int64
    var modified: Int64
    var inode: UInt64
}

/// The stamps of a manifests directory's files and of the inventory files its manifests name
/// outside it.
struct DirectoryStamps: Sendable, Equatable {
    /// By path relative to the directory (or absolute, for files named outside it); a missing file has none.
    var files: [String: FileStamp] = [:]
    /// The directory holds more files than are watched.
    var truncated = false
    /// The directories walked (absolute): what the kernel is asked to report changes of.
    var directories: Set<String> = []

    /// The most files of a manifests directory that are watched.
    static let limit = 10_000

    /// The stamps now of the manifests and inventory files under `directory` (by suffix; hidden ones
    /// and `.git` left out) and of `extra`.
    static func read(_ directory: String, extra: [String]) -> DirectoryStamps {
        var result = DirectoryStamps()
        let manager = FileManager.default
        if let walk = manager.enumerator(
            at: URL(fileURLWithPath: directory), includingPropertiesForKeys: nil, options: [.skipsHiddenFiles])
        {
            let base = URL(fileURLWithPath: directory).standardizedFileURL.path
            result.directories.insert(base)
            for case let url as URL in walk {
                if walk.level > 0, (try? url.resourceValues(forKeys: [.isDirectoryKey]))?.isDirectory == true {
                    if result.directories.count < limit { result.directories.insert(url.standardizedFileURL.path) }
                    continue
                }
                // What a reconcile reads from the directory: manifests and inventory files, not a state
                // database or anything else kept beside them.
                guard isManifest(url.path) || InventoryFormat(suffixOf: url.path) != nil,
                    let stamp = stamp(url.path), stamp.isFile
                else { continue }
                if result.files.count >= limit {
                    result.truncated = true
                    break
                }
                let path = url.standardizedFileURL.path
                let relative = path.hasPrefix(base + "/") ? String(path.dropFirst(base.count + 1)) : path
                result.files[relative] = stamp.file
            }
        }
        for path in extra { if let stamp = stamp(path), stamp.isFile { result.files[path] = stamp.file } }
        return result
    }

    private static func stamp(_ path: String) -> (file: FileStamp, isFile: Bool)? {
        var info = stat()
        guard stat(path, &info) == 0 else { return nil }
        let modified = Int64(info.st_mtim.tv_sec) * 1_000_000_000 + Int64(info.st_mtim.tv_nsec)
        let isFile = (info.st_mode & S_IFMT) == S_IFREG
        return (FileStamp(size: Int64(info.st_size), modified: modified, inode: UInt64(info.st_ino)), isFile)
    }

    /// The files that differ between `self` and `other` (added, removed or changed), sorted.
    func changed(from other: DirectoryStamps) -> [String] {
        Set(files.keys).union(other.files.keys).filter { files[$0] != other.files[$0] }.sorted()
    }

    /// Whether `path` (as the stamps name it) is a manifest file.
    static func isManifest(_ path: String) -> Bool { path.hasSuffix(".yaml") || path.hasSuffix(".yml") }

    /// The inventory files the manifests of `directory` name outside it (absolute paths): globs match
    /// inside the directory only, so those are walked already.
    static func namedOutside(_ directory: String, manifests: [String]) -> [String] {
        let base = URL(fileURLWithPath: directory).standardizedFileURL.path
        var set = ManifestSet()
        let decoder = ManifestDecoder()
        for name in manifests {
            guard let data = FileManager.default.contents(atPath: base + "/" + name),
                let text = String(data: data, encoding: .utf8)
            else { continue }
            _ = decoder.decode(text, file: name, into: &set)
        }
        var paths: [String] = []
        for spec in set.inventoryFiles where !ManifestLoader.isGlob(spec.path.value) {
            let value = spec.path.value
            let url = value.hasPrefix("/") ? URL(fileURLWithPath: value) : URL(fileURLWithPath: base + "/" + value)
            let path = url.standardizedFileURL.path
            if !path.hasPrefix(base + "/") { paths.append(path) }
        }
        return Array(Set(paths)).sorted()
    }
}

extension ChangeFollower {
    /// Stats the manifests directory's files every poll; files that changed and then held still for a
    /// poll (a file being written is not read half-way) start a reconcile. What the directory holds
    /// when the replica starts owning the workspace is the baseline (its first reconcile reads it).
    func watchFiles(
        _ directory: String, owning: OwnershipSignal, report: @Sendable (Int) -> Void = { _ in },
        wake: @Sendable (InventoryChange) -> Void
    ) async {
        var baseline: DirectoryStamps?
        var previous: DirectoryStamps?
        var extra: [String] = []
        var saidTruncated = false
        var generation = owning.generation
        // The kernel's reports of changes (nil: looked at every poll).
        var events: DirectoryEvents?
        while !Task.isCancelled, !Task.isShuttingDownGracefully {
            guard owning.isOwning, owning.generation == generation || baseline == nil else {
                baseline = nil
                previous = nil
                events = nil
                await owning.waitUntilOwning()
                continue
            }
            // Counted before the files are read: a change after the read is a report beyond it.
            let reported = events?.count ?? 0
            var now = DirectoryStamps.read(directory, extra: extra)
            if now.truncated, !saidTruncated {
                saidTruncated = true
                log.warning(
                    "workspace=\(workspace) the manifests directory \(directory) holds more than \(DirectoryStamps.limit) files: only the first are watched for changes; the rest are read by reconciles on their schedule"
                )
            }
            guard let base = baseline else {
                extra = DirectoryStamps.namedOutside(
                    directory, manifests: now.files.keys.filter(DirectoryStamps.isManifest).sorted())
                // Watched before the baseline is read: nothing changes unseen in between.
                events = DirectoryEvents(directories: DirectoryEvents.directories(directory, now))
                now = DirectoryStamps.read(directory, extra: extra)
                baseline = now
                previous = now
                generation = owning.generation
                report(generation)
                await ServeWait.pause(poll, timing: timing)
                continue
            }
            let changed = now.changed(from: base)
            if !changed.isEmpty, now == previous {
                // Held still for a poll: read it.
                if changed.contains(where: DirectoryStamps.isManifest) {
                    extra = DirectoryStamps.namedOutside(
                        directory, manifests: now.files.keys.filter(DirectoryStamps.isManifest).sorted())
                    now = DirectoryStamps.read(directory, extra: extra)
                }
                baseline = now
                let shown = changed.prefix(3).map { "'\($0)'" }.joined(separator: ", ")
                let more = changed.count > 3 ? " and \(changed.count - 3) more" : ""
                let manifests = changed.contains(where: DirectoryStamps.isManifest)
                wake(
                    .reread(
                        source: manifests ? "manifests" : "inventory files",
                        why: "\(shown)\(more) changed (size or modification time)"))
            }
            previous = now
            if let watching = events, now == baseline {
                // Nothing waits to hold still: the next look is when the kernel reports a change (a
                // directory added since is watched from now on), or after `Self.recheck` at the latest.
                if watching.add(DirectoryEvents.directories(directory, now)) {
                    await watching.wait(beyond: reported, timeout: Self.recheck, timing: timing)
                    continue
                }
                events = nil
            }
            await ServeWait.pause(poll, timing: timing)
        }
    }

    /// How often a watch the kernel reports changes to looks at the files anyway.
    static let recheck = Duration.seconds(30)

    /// Runs an `exec` source's program every `interval` while the replica owns the workspace; when
    /// what it prints changed, a reconcile starts (and reads it again, as every reconcile does).
    func watchCommand(
        _ command: WatchedCommand, owning: OwnershipSignal, report: @Sendable (Int) -> Void = { _ in },
        wake: @Sendable (InventoryChange) -> Void
    ) async {
        var last: String?
        var failing: String?
        var generation = owning.generation
        var reported = false
        while !Task.isCancelled, !Task.isShuttingDownGracefully {
            guard owning.isOwning, owning.generation == generation || !reported else {
                last = nil
                reported = false
                await owning.waitUntilOwning()
                continue
            }
            generation = owning.generation
            do {
                let result = try await command.runner.run()
                guard result.status == 0 else {
                    throw InventorySourceError(
                        "'\(command.runner.display)' exited with status \(result.status)\(result.stderr.isEmpty ? "" : "; its stderr ended with: \(ProcessRunner.oneLine(result.stderr))")"
                    )
                }
                let digest = SHA256Digest.hex(result.stdout)
                if failing != nil {
                    failing = nil
                    log(
                        "workspace=\(workspace) inventory source '\(command.name)': its command runs again; watching what it prints every \(ServeSettings.describe(command.interval))"
                    )
                }
                if let previous = last, previous != digest {
                    wake(.reread(source: command.name, why: "what its command prints changed"))
                }
                last = digest
            } catch {
                let message = Failure(error).plainMessage
                if failing != message {
                    log.warning(
                        "workspace=\(workspace) inventory source '\(command.name)': its command failed: \(message); check 'exec.command'. Reconciles still run it on their schedule"
                    )
                    failing = message
                }
            }
            if !reported {
                // Its first output (or failure) is the starting point.
                reported = true
                report(generation)
            }
            await ServeWait.pause(command.interval, timing: timing)
        }
    }
}

/// Tells the file watch when the kernel reports a change in the directories it watches (Linux's
/// inotify), so that a replica whose manifests do not change does not look at them every second.
/// Nil where inotify cannot follow the directory (elsewhere than Linux, a network or FUSE file
/// system, out of watches): the watch then looks every poll, as it always did.
final class DirectoryEvents: Sendable {
    private let descriptor: Int32
    /// The dispatch source that reads the descriptor (cancelled, and the descriptor closed, at deinit).
    private let source: Mutex<(any DispatchSourceRead)?>
    private let changes = Beacon()
    private let watched = Mutex(Set<String>())

    /// File systems whose changes made elsewhere inotify does not see: NFS, SMB/CIFS (two), FUSE, 9p,
    /// AFS, Ceph, Lustre.
    static let remoteFileSystems: Set<UInt> = [
        0x6969, 0xFF53_4D42, 0xFE53_4D42, 0x6573_5546, 0x0102_1997, 0x5346_414F, 0x00C3_6400, 0x0BD0_0BD0,
    ]

    /// Events for `directories` (each watched itself, not below it).
    init?(directories: [String]) {
        #if os(Linux)
        guard
            directories.allSatisfy({ !Self.remoteFileSystems.contains(tidemark_filesystem_type($0)) })
        else { return nil }
        let descriptor = inotify_init1(Int32(IN_NONBLOCK | IN_CLOEXEC))
        guard descriptor >= 0 else { return nil }
        self.descriptor = descriptor
        let source = DispatchSource.makeReadSource(fileDescriptor: descriptor, queue: .global())
        let changes = self.changes
        source.setEventHandler {
            // Drain what the kernel queued; what it says is not needed: the watch stats again.
            var buffer = [UInt8](repeating: 0, count: 4096)
            while buffer.withUnsafeMutableBytes({ read(descriptor, $0.baseAddress, $0.count) }) > 0 {}
            changes.bump()
        }
        source.setCancelHandler { close(descriptor) }
        source.resume()
        self.source = Mutex(source)
        guard add(directories) else {
            self.source.withLock { $0?.cancel() }
            return nil
        }
        #else
        return nil
        #endif
    }

    deinit { source.withLock { $0?.cancel() } }

    /// Watches `directories` too (those watched already are left as they are); false when one cannot be.
    @discardableResult
    func add(_ directories: [String]) -> Bool {
        #if os(Linux)
        let mask = UInt32(
            IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
                | IN_DELETE_SELF | IN_MOVE_SELF)
        let new = watched.withLock { Set(directories).subtracting($0) }
        for directory in new {
            guard inotify_add_watch(descriptor, directory, mask) >= 0 else { return false }
        }
        watched.withLock { $0.formUnion(new) }
        return true
        #else
        return false
        #endif
    }

    /// How many reports came so far.
    var count: Int { changes.value }

    /// Returns once a report beyond `count` came, or after `timeout`, or when the task is cancelled.
    func wait(beyond count: Int, timeout: Duration, timing: Timing) async {
        await withTaskGroup(of: Void.self) { group in
            group.addTask { await self.changes.wait(beyond: count) }
            group.addTask { try? await timing.sleep(timeout) }
            await group.next()
            group.cancelAll()
        }
    }

    /// The directories to watch for the files of `stamps` under `directory`: the directory, those
    /// below it, and the parents of files named outside it.
    static func directories(_ directory: String, _ stamps: DirectoryStamps) -> [String] {
        let base = URL(fileURLWithPath: directory).standardizedFileURL.path
        var directories = stamps.directories
        directories.insert(base)
        for path in stamps.files.keys where path.hasPrefix("/") {
            directories.insert(URL(fileURLWithPath: path).deletingLastPathComponent().standardizedFileURL.path)
        }
        return directories.sorted()
    }
}
