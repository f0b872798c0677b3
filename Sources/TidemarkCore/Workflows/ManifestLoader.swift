import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// Reads all `*.yaml` / `*.yml` files of a manifests directory, merges them, loads the inventory and resolves members.
public struct ManifestLoader: ManifestSource {
    /// Where the manifests are read from.
    public let files: FileSource
    /// Sources beyond those the manifests declare (from the project's configuration).
    public var extraSources: [any InventorySource]
    /// What any one input may cost.
    public var limits: InputLimits

    /// A loader of the manifests in `files`, with `extraSources` beside the ones they declare.
    public init(files: FileSource, extraSources: [any InventorySource] = [], limits: InputLimits = InputLimits()) {
        self.files = files
        self.extraSources = extraSources
        self.limits = limits
    }

    /// Loads and validates; new tokens are interned into `table` (pass the state's table).
    public func load(into table: inout some TokenInterning) async -> LoadedManifests {
        await read().resolve(into: &table)
    }

    /// Reads and decodes manifests and inventory without touching a token table, so a caller can load
    /// state at the same time and resolve afterwards.
    public func read() async -> ReadManifests {
        let recording = files
        var (manifests, diagnostics, filesDigest) = decodeFiles()
        PhaseTrace.mark("manifest files decoded")
        var builder = InventoryBuilder(deviceLimit: limits.devices)
        var snapshots: [String: InventorySnapshot] = [:]
        var inventoryFailed = false
        var inventoryFailure: String?
        for (source, location) in inventorySources(manifests, &diagnostics) {
            do {
                snapshots[source.name] = try await source.load(into: &builder)
            } catch {
                inventoryFailed = true
                // A configured source's own kind of failure; a file named in a manifest is input.
                if location == nil, inventoryFailure == nil {
                    inventoryFailure =
                        (error as? any TidemarkError)?.reason.rawValue ?? InventorySourceError.Kind.failed.rawValue
                }
                if let location {
                    diagnostics.append(
                        .error(
                            "cannot read inventory file '\(source.name)': \(ErrorText.describe(error))\((error as? InputFileError)?.kind == .notFound ? "; check the path, which is relative to the manifests directory" : "").",
                            at: location))
                } else {
                    diagnostics.append(
                        .error(
                            "inventory source '\(source.name)' failed: \(ErrorText.describe(error))",
                            at: source.declaredAt))
                }
            }
        }
        diagnostics += builder.allDiagnostics
        var read = ReadManifests(
            manifests: manifests, inventory: builder.inventory, diagnostics: diagnostics, snapshots: snapshots,
            inventoryFailed: inventoryFailed, inventoryFailure: inventoryFailure, files: recording,
            tokenFileBytes: limits.tokenFileBytes)
        read.filesDigest = filesDigest.finalize()
        return read
    }

    /// The manifest files decoded, without reading any inventory: what they declare and their
    /// problems.
    public func declared() -> (manifests: ManifestSet, diagnostics: [Diagnostic]) {
        let (manifests, diagnostics, _) = decodeFiles()
        return (manifests, diagnostics)
    }

    /// The manifest files decoded, with the digest of their names and bytes (`LoadedManifests.filesDigest`).
    private func decodeFiles() -> (ManifestSet, [Diagnostic], SHA256Digest) {
        let recording = files
        var manifests = ManifestSet()
        var diagnostics: [Diagnostic] = []
        let names: [String]
        do {
            // Subdirectories too: moving a file into manifests/regions/ must not plan removing its topics.
            names = try recording.listFiles(".").filter { $0.hasSuffix(".yaml") || $0.hasSuffix(".yml") }.sorted()
        } catch {
            diagnostics.append(
                .error(
                    "cannot read the manifests directory \(files.displayPath(".")): \(ErrorText.describe(error)). Pass --manifests DIR or create it."
                ))
            names = []
        }
        if names.isEmpty, !diagnostics.hasErrors {
            diagnostics.append(
                .error("no manifest files (*.yaml) in \(files.displayPath(".")); create one or pass --manifests DIR."))
        }
        let decoder = ManifestDecoder()
        var filesDigest = SHA256Digest()
        filesDigest.update("tidemark-manifest-files 1\n")
        for name in names {
            do {
                let data = try recording.read(name, atMost: limits.manifestBytes, setting: "manifest_bytes")
                filesDigest.update("\(name)\u{0}\(data.count)\u{0}")
                filesDigest.update(data)
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
                        "cannot read: \(ErrorText.describe(error)).",
                        at: SourceLocation(file: files.displayPath(name), line: 1, column: 1)))
            }
        }
        return (manifests, diagnostics, filesDigest)
    }

    /// The sources the manifests declare (inline devices, then files in order), then the extra ones.
    func inventorySources(
        _ manifests: ManifestSet, _ diagnostics: inout [Diagnostic]
    )
        -> [(any InventorySource, SourceLocation?)]
    {
        var sources: [(any InventorySource, SourceLocation?)] = []
        if !manifests.devices.isEmpty { sources.append((InlineInventorySource(manifests.devices), nil)) }
        // A file two declarations name (a glob and a name, two manifests) is read once: read twice, each
        // of its rows would be a duplicate of itself.
        var named: [String: SourceLocation] = [:]
        for spec in manifests.inventoryFiles {
            for file in expand(spec, &diagnostics) {
                let key = files.displayPath((file.path.value as NSString).standardizingPath)
                if let first = named[key] {
                    diagnostics.append(
                        .warning(
                            "inventory file '\(file.path.value)' is also named at \(first); it is read once.",
                            at: file.path.location))
                    continue
                }
                named[key] = file.path.location
                if let source = fileSource(file, &diagnostics) { sources.append(source) }
            }
        }
        return sources + extraSources.map { ($0, nil) }
    }

    /// Whether an inventory path is a glob (`*`, `?` or `[…]`).
    package static func isGlob(_ path: String) -> Bool { path.contains { "*?[".contains($0) } }

    /// A glob such as `exports/devices-*.csv` as the files it matches, sorted (relative to the manifests
    /// directory; `*` does not cross '/'); a glob that matches nothing is an error, never an empty inventory.
    func expand(_ spec: InventoryFileSpec, _ diagnostics: inout [Diagnostic]) -> [InventoryFileSpec] {
        let pattern = spec.path.value
        guard Self.isGlob(pattern) else { return [spec] }
        guard !pattern.hasPrefix("/") else {
            diagnostics.append(
                .error(
                    "inventory glob '\(pattern)' is absolute; globs are relative to the manifests directory.",
                    at: spec.path.location))
            return []
        }
        let names = ((try? files.listFiles(".")) ?? []).filter { fnmatch(pattern, $0, FNM_PATHNAME) == 0 }.sorted()
        if names.isEmpty {
            diagnostics.append(
                .error(
                    "inventory glob '\(pattern)' matches no file in \(files.displayPath(".")); check the pattern (it is relative to the manifests directory).",
                    at: spec.path.location))
        }
        return names.map { InventoryFileSpec(path: Located($0, at: spec.path.location), format: spec.format) }
    }

    func fileSource(
        _ file: InventoryFileSpec, _ diagnostics: inout [Diagnostic]
    ) -> (any InventorySource, SourceLocation?)? {
        do {
            guard let format = file.format ?? InventoryFormat(suffixOf: file.path.value) else {
                diagnostics.append(
                    .error(
                        "inventory file '\(file.path.value)' must end in .csv or .jsonl (optionally .gz), or say its format: {path: \(file.path.value), format: csv}.",
                        at: file.path.location))
                return nil
            }
            return (
                FileInventorySource(
                    path: file.path.value, format: format, files: files, maxBytes: limits.inventoryBytes),
                file.path.location
            )
        }
    }
}
