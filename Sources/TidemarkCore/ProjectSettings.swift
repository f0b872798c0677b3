/// `tidemark.yaml`, the optional project file: backend, project id, manifests and state paths.
public struct ProjectSettings: Sendable, Equatable {
    public var project = "tidemark-demo"
    public var backend: String?
    public var manifests: String?
    public var state: String?
    /// How topic changes reach FCM: `v1` (default) or `iid`.
    public var transport: String?
    /// Subscription changes per second an apply may send (FCM's documented quota: 3000).
    public var qps: Double?

    public static let keys = ["project", "backend", "manifests", "state", "transport", "qps"]
    public static let transports = ["v1", "iid"]
    public static let backends = ["embedded", "emulator", "fcm"]

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
                    doc.error("'qps' must be a positive number of subscription changes per second (FCM allows 3000).", value)
                }
                continue
            }
            guard let text = doc.string(value, "'\(key)'") else { continue }
            switch key {
            case "project": settings.project = text
            case "backend":
                if backends.contains(text) {
                    settings.backend = text
                } else {
                    doc.error("unknown backend '\(text)'; use embedded, emulator or fcm.", value)
                }
            case "manifests": settings.manifests = text
            case "state": settings.state = text
            case "transport":
                if transports.contains(text) {
                    settings.transport = text
                } else {
                    doc.error("unknown transport '\(text)'; use v1 (the FCM topic subscription API) or iid.", value)
                }
            default: break
            }
        }
        return (settings, doc.diagnostics)
    }
}
