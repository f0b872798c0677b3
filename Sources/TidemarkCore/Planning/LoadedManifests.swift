import Foundation

/// Everything read from a manifests directory, resolved and checked.
public struct LoadedManifests: Sendable {
    /// What the manifest files declare, merged.
    public var manifests: ManifestSet
    /// The devices, from every inventory source.
    public var inventory: Inventory
    /// The desired state, members resolved to token ids.
    public var desired: DesiredState
    /// Every problem found, sorted by file and line.
    public var diagnostics: [Diagnostic]
    /// A digest of what the manifests mean (`DesiredState.digest`); a saved plan records it.
    public var digest: String
    /// What each inventory source read, by name.
    public var snapshots: [String: InventorySnapshot] = [:]
    /// What each topic and group means (`DesiredState.digests`), computed with `digest`.
    public var entryDigests: [String: String]
    /// SHA-256 of the manifest files as read, names and bytes (`ReadManifests.filesDigest`).
    public var filesDigest = ""
    /// The `reason` of the first configured inventory source that could not be read, nil when every
    /// one was read (see `ReadManifests.inventoryFailure`).
    public var inventoryFailure: String?
}

extension LoadedManifests {
    /// The devices each counted inventory source read, by name (what state records at an apply).
    public var inventoryRows: [String: Int] { snapshots.compactMapValues(\.rows) }
}

/// Manifests and inventory as read, before members are resolved to token ids.
public struct ReadManifests: Sendable {
    /// What the manifest files declare, merged.
    public var manifests: ManifestSet
    /// The devices, from every inventory source.
    public var inventory: Inventory
    /// Problems found so far, before members are resolved.
    public var diagnostics: [Diagnostic]
    /// Each inventory source read, by name, with the snapshot it read.
    public var snapshots: [String: InventorySnapshot]
    /// A source could not be read at all: members resolved against what is missing would only add
    /// misleading errors (empty topics, unknown labels), so they are not reported.
    public var inventoryFailed = false
    /// The `reason` of the first configured inventory source that could not be read
    /// (`inventory_timeout`, `inventory_unreachable`, `inventory_empty`, `inventory_failed`), nil when
    /// every one was read.
    public var inventoryFailure: String?
    let files: any FileSource
    var tokenFileBytes = InputLimits().tokenFileBytes
    /// SHA-256 of the manifest files as read (their names, sizes and bytes): unlike the digest of what
    /// they mean, it moves only when a file does, never with the inventory.
    public var filesDigest = ""

    var resolver: Resolver {
        var resolver = Resolver(manifests: manifests, inventory: inventory, files: files)
        resolver.tokenFileBytes = tokenFileBytes
        return resolver
    }

    /// Resolves members, interning tokens into `table`, and checks FCM's limits.
    public func resolve(into table: inout some TokenInterning) -> LoadedManifests {
        let (desired, resolveDiagnostics) = resolver.resolve(into: &table)
        PhaseTrace.mark("members resolved")
        let (digest, entries) = desired.digests(tokens: table.table)
        var loaded = LoadedManifests(
            manifests: manifests, inventory: inventory, desired: desired,
            diagnostics: (diagnostics + (inventoryFailed ? [] : resolveDiagnostics)).sortedByLocation(),
            digest: digest, snapshots: snapshots, entryDigests: entries)
        loaded.filesDigest = filesDigest
        loaded.inventoryFailure = inventoryFailure
        return loaded
    }
}

extension ReadManifests {
    /// Which member entries of each topic and group name token `id` (see `Resolver.entries`).
    public func entries(naming id: UInt32, table: inout some TokenInterning) -> [String: [MemberRef]] {
        resolver.entries(naming: id, table: &table)
    }
}
