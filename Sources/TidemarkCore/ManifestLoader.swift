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
public struct ManifestLoader: Sendable {
    public let files: FileSource

    public init(files: FileSource) { self.files = files }

    /// Loads and validates; new tokens are interned into `table` (pass the state's table).
    public func load(into table: inout TokenTable) -> LoadedManifests {
        read().resolve(into: &table)
    }

    /// Reads and decodes manifests and inventory without touching a token table, so a caller can load
    /// state at the same time and resolve afterwards.
    public func read() -> ReadManifests {
        let recording = RecordingFileSource(files)
        var manifests = ManifestSet()
        var diagnostics: [Diagnostic] = []
        let names: [String]
        do {
            names = try recording.list(".").filter { $0.hasSuffix(".yaml") || $0.hasSuffix(".yml") }.sorted()
        } catch {
            diagnostics.append(.error("cannot read the manifests directory \(files.displayPath(".")): \(error). Pass --manifests DIR or create it."))
            names = []
        }
        if names.isEmpty, !diagnostics.hasErrors {
            diagnostics.append(.error("no manifest files (*.yaml) in \(files.displayPath(".")); create one or pass --manifests DIR."))
        }
        let decoder = ManifestDecoder()
        for name in names {
            do {
                let data = try recording.read(name)
                guard let text = String(data: data, encoding: .utf8) else {
                    diagnostics.append(.error("file is not UTF-8 text.", at: SourceLocation(file: files.displayPath(name), line: 1, column: 1)))
                    continue
                }
                diagnostics += decoder.decode(text, file: files.displayPath(name), into: &manifests)
            } catch {
                diagnostics.append(.error("cannot read: \(error)", at: SourceLocation(file: files.displayPath(name), line: 1, column: 1)))
            }
        }
        let (inventory, inventoryDiagnostics) = InventoryLoader().load(manifests, files: recording)
        diagnostics += inventoryDiagnostics
        return ReadManifests(manifests: manifests, inventory: inventory, diagnostics: diagnostics, files: recording)
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
        return LoadedManifests(manifests: manifests, inventory: inventory, desired: desired,
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

    func list(_ directory: String) throws -> [String] { try base.list(directory) }
    func displayPath(_ path: String) -> String { base.displayPath(path) }

    func digest() -> String {
        var digest = SHA256Digest()
        for (path, hash) in hashes.withLock({ $0 }).sorted(by: { $0.key < $1.key }) {
            digest.update("\(path)\u{0}\(hash)\n")
        }
        return digest.finalize()
    }
}
