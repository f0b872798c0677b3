import Foundation
import TidemarkCore
import TidemarkFCM
import TidemarkStore

/// State stores by where `state` points: a file path, or a URL whose scheme picks the store. A front
/// end (or a test) registers another scheme with one call; `Runtime` opens through its registry.
public struct StateStoreRegistry: Sendable {
    /// Opens the store at the resolved location and workspace.
    public typealias Opener = @Sendable (ResolvedSettings) -> any StateStore

    private var byScheme: [String: Opener] = [:]
    private var file: Opener

    /// A registry that opens files with `file` and knows no URL scheme yet.
    public init(file: @escaping Opener) { self.file = file }

    /// Opens `scheme://…` locations with `open` (replacing any earlier entry for the scheme).
    public mutating func register(scheme: String, _ open: @escaping Opener) {
        byScheme[scheme.lowercased()] = open
    }

    /// The schemes registered, sorted.
    public var schemes: [String] { byScheme.keys.sorted() }

    /// The store at `resolved`'s location; nil for a URL scheme nobody registered.
    public func open(_ resolved: ResolvedSettings) -> (any StateStore)? {
        switch resolved.state {
        case .file: file(resolved)
        case .url(let scheme, _): byScheme[scheme].map { $0(resolved) }
        }
    }

    /// SQLite files, and PostgreSQL at `postgres://` and `postgresql://` URLs.
    public static let standard: StateStoreRegistry = {
        var registry = StateStoreRegistry { resolved in
            SQLiteStateStore(
                path: resolved.statePath, location: resolved.stateDisplay, workspace: resolved.workspace,
                legacyPath: resolved.legacyWorkspacePath)
        }
        let postgres: Opener = { resolved in
            // `resolve` parsed the URL already (the registry only sees locations that resolved).
            let url = resolved.postgres!
            return PostgresStateStore(url: url, workspace: resolved.workspace, leaseDuration: url.lease)
        }
        registry.register(scheme: "postgres", postgres)
        registry.register(scheme: "postgresql", postgres)
        return registry
    }()
}

/// What building a configured inventory source may use: the project directory (where a command runs),
/// the environment (a query's `url_env`), the time (`exclude_if`) and the input limits.
public struct InventorySourceContext: Sendable {
    /// The project directory, where a command runs.
    public var directory: String
    /// The environment, where a source finds the URL its `url_env` names.
    public var environment: [String: String]
    /// The time `exclude_if` measures age against.
    public var now: Date
    /// What one input may cost (`limits:` in tidemark.yaml).
    public var limits: InputLimits

    /// A context for building sources of the project at `directory`.
    public init(directory: String, environment: [String: String], now: Date, limits: InputLimits) {
        self.directory = directory
        self.environment = environment
        self.now = now
        self.limits = limits
    }
}

/// Inventory sources by their key in tidemark.yaml's `inventory:` (`postgres`, `exec`): each entry
/// decodes the settings under its key (its `SourceKind`) and builds the source from them.
public struct InventorySourceRegistry: Sendable {
    /// Builds the source `spec` declares.
    public typealias Builder = @Sendable (ConfiguredSource, InventorySourceContext) -> any InventorySource
    /// Builds the feed of a configured source's changes, when its settings ask that they be followed.
    public typealias Follower = @Sendable (ConfiguredSource, InventorySourceContext) -> (any ChangeFeed)?

    private var entries: [String: (kind: SourceKind, build: Builder, follow: Follower?)] = [:]
    /// The keys in the order they were first registered (how messages list the kinds).
    private var order: [String] = []

    /// An empty registry.
    public init() {}

    /// Decodes sources declared with `kind`'s key as `kind` says and builds them with `build`
    /// (replacing any earlier entry for the key); `follow`, when the kind can follow its changes,
    /// builds the feed `serve` follows.
    public mutating func register(_ kind: SourceKind, _ build: @escaping Builder, follow: Follower? = nil) {
        if entries[kind.key] == nil { order.append(kind.key) }
        entries[kind.key] = (kind, build, follow)
    }

    /// Builds sources of `kind`, whose settings decode as `Settings`, with `build`; and, when the kind
    /// can follow its changes, the feed `serve` follows with `follow` (nil from it: this source's
    /// settings do not ask for it).
    public mutating func register<Settings: SourceSettings>(
        _ kind: SourceKind, as _: Settings.Type,
        _ build: @escaping @Sendable (Settings, ConfiguredSource, InventorySourceContext) -> any InventorySource,
        follow: (@Sendable (Settings, ConfiguredSource, InventorySourceContext) -> (any ChangeFeed)?)? = nil
    ) {
        let key = kind.key
        let settings: @Sendable (ConfiguredSource) -> Settings = { spec in
            guard let settings = spec.settings(as: Settings.self) else {
                preconditionFailure("the '\(key)' entry was given a '\(spec.key)' source")
            }
            return settings
        }
        let builder: Builder = { spec, context in build(settings(spec), spec, context) }
        var follower: Follower?
        if let follow {
            follower = { spec, context in follow(settings(spec), spec, context) }
        }
        register(kind, builder, follow: follower)
    }

    /// The keys registered, sorted.
    public var keys: [String] { entries.keys.sorted() }

    /// The kinds registered, in the order of registration: what tidemark.yaml's `inventory:` may declare.
    public var kinds: [SourceKind] { order.compactMap { entries[$0]?.kind } }

    /// The source `spec` declares; nil when no entry builds its kind.
    public func make(_ spec: ConfiguredSource, _ context: InventorySourceContext) -> (any InventorySource)? {
        entries[spec.key].map { $0.build(spec, context) }
    }

    /// The feed of `spec`'s changes: nil when its kind follows none, or its settings do not ask it to.
    public func feed(_ spec: ConfiguredSource, _ context: InventorySourceContext) -> (any ChangeFeed)? {
        entries[spec.key]?.follow?(spec, context)
    }

    /// A query on the app's PostgreSQL (`postgres:`) and a program's output (`exec:`).
    public static let standard: InventorySourceRegistry = {
        var registry = InventorySourceRegistry()
        registry.register(
            .postgres, as: PostgresSourceSettings.self,
            { settings, spec, context in postgres(settings, spec, context) },
            follow: { settings, spec, context in
                PostgresChangeFeed(
                    source: spec.name, settings: settings, url: context.environment[settings.urlEnv],
                    configured: postgres(settings, spec, context))
            })
        registry.register(.exec, as: ExecSourceSettings.self) { settings, spec, context in
            var source = CommandInventorySource(
                name: spec.name,
                runner: ProcessRunner(
                    command: settings.command, directory: context.directory, timeout: settings.timeout,
                    maxOutput: context.limits.inventoryBytes),
                format: settings.format, exclusion: spec.exclusion(at: context.now), declaredAt: spec.location)
            source.allowEmpty = spec.allowEmpty
            source.onDead = spec.onDead
            return source
        }
        return registry
    }()
}

/// The `postgres` source `spec` declares with `settings`.
private func postgres(
    _ settings: PostgresSourceSettings, _ spec: ConfiguredSource, _ context: InventorySourceContext
) -> PostgresInventorySource {
    var source = PostgresInventorySource(
        name: spec.name, url: context.environment[settings.urlEnv], urlEnv: settings.urlEnv,
        query: settings.query, labels: settings.labels, exclusion: spec.exclusion(at: context.now),
        declaredAt: spec.location)
    source.allowEmpty = spec.allowEmpty
    source.onDead = spec.onDead
    source.hookDirectory = context.directory
    return source
}

extension ConfiguredSource {
    /// The `exclude_if` filter as of `now`.
    func exclusion(at now: Date) -> ExclusionFilter? {
        exclusion.map { ExclusionFilter($0, now: Int64(now.timeIntervalSince1970)) }
    }
}

/// The registries a runtime builds its parts from.
public struct Registries: Sendable {
    /// State stores by URL scheme.
    public var stores: StateStoreRegistry
    /// Inventory sources by their key in tidemark.yaml.
    public var sources: InventorySourceRegistry
    /// The APIs that carry topic changes over HTTP, by the `transport` that picks each.
    public var transports: TopicAPIRegistry

    /// Registries with `stores`, `sources` and `transports`.
    public init(
        stores: StateStoreRegistry = .standard, sources: InventorySourceRegistry = .standard,
        transports: TopicAPIRegistry = .standard
    ) {
        self.stores = stores
        self.sources = sources
        self.transports = transports
    }

    /// tidemark's own stores, sources and transports.
    public static let standard = Registries()
}
