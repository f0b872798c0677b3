import TidemarkCore

/// What a front end was told on its command line: every field is optional, and a given one wins over
/// the environment and `tidemark.yaml` (`ResolvedSettings.resolve`).
public struct RuntimeFlags: Sendable, Equatable {
    /// The project directory, as given (`-C`); relative to the working directory.
    public var directory = "."
    /// The manifests directory (`--manifests`); relative to the working directory.
    public var manifests: String?
    /// The backend (`--backend`).
    public var backend: BackendKind?
    /// The topic API (`--transport`).
    public var transport: TopicTransport?
    /// Where state lives (`--state`): a SQLite path or a `postgres://` URL.
    public var state: String?
    /// The state workspace (`--workspace`).
    public var workspace: String?
    /// Subscription changes per second (`--qps`).
    public var qps: Double?
    /// What `qps` counts (`--qps-unit`).
    public var qpsUnit: QuotaUnit?
    /// Reads per second while refreshing (`--read-qps`).
    public var readQPS: Double?
    /// Registration tokens in full in human output (`--show-tokens`).
    public var showTokens = false

    /// No flag given: every setting comes from the environment, `tidemark.yaml` or its default.
    public init() {}
}
