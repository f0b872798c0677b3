/// `tidemark.yaml`, the optional project file: backend, project id, manifests and state paths.
public struct ProjectSettings: Sendable, Equatable {
    public var project = "tidemark-demo"
    public var backend: BackendKind?
    public var manifests: String?
    public var state: String?
    /// How topic changes reach FCM: `v1` (default) or `iid`.
    public var transport: TopicTransport?
    /// Subscription changes per second an apply may send (FCM's documented quota: 3000).
    public var qps: Double?
    /// What `qps` counts: `tokens` (membership changes, the default) or `requests` (HTTP calls).
    public var qpsUnit: QuotaUnit?
    /// The service-account key file; `GOOGLE_APPLICATION_CREDENTIALS` wins.
    public var credentials: String?
    /// Base URL of `fcm.googleapis.com` (a proxy, say); `TIDEMARK_FCM_URL` wins.
    public var fcmURL: String?
    /// Base URL of `iid.googleapis.com`; `TIDEMARK_IID_URL` wins.
    public var iidURL: String?
    /// The sender ID (project number) sent as `project_id` on device-group calls; default: the project id.
    public var senderID: String?

    public static let keys = [
        "project", "backend", "manifests", "state", "transport", "qps", "qps_unit", "credentials",
        "fcm_url", "iid_url", "sender_id",
    ]

    public init() {}

    /// Decodes the project file's text; problems come back as diagnostics.
    public static func decode(_ text: String, file: String) -> (ProjectSettings, [Diagnostic]) {
        var doc = YAMLDocument(file: file)
        var settings = ProjectSettings()
        guard let root = doc.compose(text) else { return (settings, doc.diagnostics) }
        if case .scalar(let s) = root, s.string.isEmpty { return (settings, doc.diagnostics) }
        for (key, _, value) in doc.mapping(root, "tidemark.yaml", allowed: keys) ?? [] {
            if key == "qps" {
                if case .scalar(let scalar) = value, let qps = Double(scalar.string), qps > 0 {
                    settings.qps = qps
                } else {
                    doc.error(
                        "'qps' must be a positive number of subscription changes per second (FCM allows 3000).", value)
                }
                continue
            }
            guard let text = doc.string(value, "'\(key)'") else { continue }
            switch key {
            case "project": settings.project = text
            case "backend":
                if let kind = BackendKind(rawValue: text) {
                    settings.backend = kind
                } else {
                    doc.error("unknown backend '\(text)'; use embedded, emulator or fcm.", value)
                }
            case "manifests": settings.manifests = text
            case "state": settings.state = text
            case "credentials": settings.credentials = text
            case "sender_id": settings.senderID = text
            case "fcm_url", "iid_url":
                guard text.hasPrefix("https://") || text.hasPrefix("http://"), !text.hasSuffix("/") else {
                    doc.error(
                        "'\(key)' must be a base URL such as https://fcm.googleapis.com (http or https, no trailing slash), not '\(text)'.",
                        value)
                    continue
                }
                if key == "fcm_url" { settings.fcmURL = text } else { settings.iidURL = text }
            case "qps_unit":
                if let unit = QuotaUnit(rawValue: text) {
                    settings.qpsUnit = unit
                } else {
                    doc.error(
                        "unknown qps_unit '\(text)'; use tokens (membership changes) or requests (HTTP calls).", value)
                }
            case "transport":
                if let transport = TopicTransport(rawValue: text) {
                    settings.transport = transport
                } else {
                    doc.error("unknown transport '\(text)'; use v1 (the FCM topic subscription API) or iid.", value)
                }
            default: break
            }
        }
        return (settings, doc.diagnostics)
    }
}
