import Foundation
import Synchronization

/// Everything read from a manifests directory, resolved and checked.
public struct LoadedManifests: Sendable {
    public var manifests: ManifestSet
    public var inventory: Inventory
    public var desired: DesiredState
    public var diagnostics: [Diagnostic]
    /// SHA-256 over every file read (manifests, inventory, token files); a saved plan records it.
    public var digest: String
}

/// Reads all `*.yaml` / `*.yml` files of a manifests directory, merges them, loads the inventory and resolves members.
public struct ManifestLoader: ManifestSource {
    public let files: FileSource
    /// Sources beyond those the manifests declare (from the project's configuration).
    public var extraSources: [any InventorySource]

    public init(files: FileSource, extraSources: [any InventorySource] = []) {
        self.files = files
        self.extraSources = extraSources
    }

    /// Loads and validates; new tokens are interned into `table` (pass the state's table).
    public func load(into table: inout TokenTable) async -> LoadedManifests {
        await read().resolve(into: &table)
    }

    /// Reads and decodes manifests and inventory without touching a token table, so a caller can load
    /// state at the same time and resolve afterwards.
    public func read() async -> ReadManifests {
        let recording = RecordingFileSource(files)
        var manifests = ManifestSet()
        var diagnostics: [Diagnostic] = []
        let names: [String]
        do {
            // Subdirectories too: moving a file into manifests/regions/ must not plan removing its topics.
            names = try recording.listFiles(".").filter { $0.hasSuffix(".yaml") || $0.hasSuffix(".yml") }.sorted()
        } catch {
            diagnostics.append(
                .error(
                    "cannot read the manifests directory \(files.displayPath(".")): \(error). Pass --manifests DIR or create it."
                ))
            names = []
        }
        if names.isEmpty, !diagnostics.hasErrors {
            diagnostics.append(
                .error("no manifest files (*.yaml) in \(files.displayPath(".")); create one or pass --manifests DIR."))
        }
        let decoder = ManifestDecoder()
        for name in names {
            do {
                let data = try recording.read(name)
                guard let text = String(data: data, encoding: .utf8) else {
                    diagnostics.append(
                        .error(
                            "file is not UTF-8 text.",
                            at: SourceLocation(file: files.displayPath(name), line: 1, column: 1)))
                    continue
                }
                diagnostics += decoder.decode(text, file: files.displayPath(name), into: &manifests)
            } catch {
                diagnostics.append(
                    .error(
                        "cannot read: \(error)", at: SourceLocation(file: files.displayPath(name), line: 1, column: 1)))
            }
        }
        var builder = InventoryBuilder()
        for (source, location) in inventorySources(manifests, &diagnostics) {
            do {
                let snapshot = try await source.load(into: &builder)
                if !snapshot.identity.isEmpty { recording.record(source.name, hash: snapshot.identity) }
            } catch {
                if let location {
                    diagnostics.append(
                        .error(
                            "cannot read inventory file '\(source.name)': \(error); check the path, which is relative to the manifests directory.",
                            at: location))
                } else {
                    diagnostics.append(.error("cannot read inventory '\(source.name)': \(error)"))
                }
            }
        }
        diagnostics += builder.diagnostics
        return ReadManifests(
            manifests: manifests, inventory: builder.inventory, diagnostics: diagnostics, files: recording)
    }

    /// The sources the manifests declare (inline devices, then files in order), then the extra ones.
    func inventorySources(
        _ manifests: ManifestSet, _ diagnostics: inout [Diagnostic]
    )
        -> [(any InventorySource, SourceLocation?)]
    {
        var sources: [(any InventorySource, SourceLocation?)] = []
        if !manifests.devices.isEmpty { sources.append((InlineInventorySource(manifests.devices), nil)) }
        for file in manifests.inventoryFiles {
            guard let format = file.format ?? InventoryFormat(suffixOf: file.path.value) else {
                diagnostics.append(
                    .error(
                        "inventory file '\(file.path.value)' must end in .csv or .jsonl, or say its format: {path: \(file.path.value), format: csv}.",
                        at: file.path.location))
                continue
            }
            sources.append(
                (FileInventorySource(path: file.path.value, format: format, files: files), file.path.location))
        }
        return sources + extraSources.map { ($0, nil) }
    }
}

/// Manifests and inventory as read, before members are resolved to token ids.
public struct ReadManifests: Sendable {
    public var manifests: ManifestSet
    public var inventory: Inventory
    public var diagnostics: [Diagnostic]
    let files: RecordingFileSource

    /// Resolves members, interning tokens into `table`, and checks FCM's limits.
    public func resolve(into table: inout TokenTable) -> LoadedManifests {
        let (desired, resolveDiagnostics) = Resolver(manifests: manifests, inventory: inventory, files: files)
            .resolve(into: &table)
        return LoadedManifests(
            manifests: manifests, inventory: inventory, desired: desired,
            diagnostics: (diagnostics + resolveDiagnostics).sortedByLocation(), digest: files.digest())
    }
}

/// Passes reads through and remembers a SHA-256 of each file, so the manifests digest covers what was used.
final class RecordingFileSource: FileSource {
    private let base: FileSource
    private let hashes = Mutex<[String: String]>([:])

    init(_ base: FileSource) { self.base = base }

    func read(_ path: String) throws -> Data {
        let data = try base.read(path)
        let hash = SHA256Digest.hex(data)
        hashes.withLock { $0[path] = hash }
        return data
    }

    /// Records a source that was read without this file source, by its name and digest.
    func record(_ name: String, hash: String) {
        hashes.withLock { $0[name] = hash }
    }

    func list(_ directory: String) throws -> [String] { try base.list(directory) }
    func listFiles(_ directory: String) throws -> [String] { try base.listFiles(directory) }
    func displayPath(_ path: String) -> String { base.displayPath(path) }

    func digest() -> String {
        var digest = SHA256Digest()
        for (path, hash) in hashes.withLock({ $0 }).sorted(by: { $0.key < $1.key }) {
            digest.update("\(path)\u{0}\(hash)\n")
        }
        return digest.finalize()
    }
}
