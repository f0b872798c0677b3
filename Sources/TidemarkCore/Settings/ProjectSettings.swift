import Foundation

/// `tidemark.yaml`, the optional project file: backend, project id, manifests and state paths.
public struct ProjectSettings: Sendable, Equatable {
    /// `project:` the Firebase project id.
    public var project = "tidemark-demo"
    /// `backend:` embedded, emulator or fcm; nil leaves it to flags and the default.
    public var backend: BackendKind?
    /// `manifests:` the manifests directory, relative to the project.
    public var manifests: String?
    /// `state:` a state file's path or a store's URL (`postgres://…`).
    public var state: String?
    /// The state workspace (`workspace:`); `default` when unset.
    public var workspace: String?
    /// How topic changes reach FCM: `v1` (default) or `iid`.
    public var transport: TopicTransport?
    /// Subscription changes per second an apply may send (FCM's documented quota: 3000).
    public var qps: Double?
    /// Reads per second while refreshing (`read_qps`); nil for no limit.
    public var readQPS: Double?
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
    /// The answers that mark a token dead (`unregistered: {v1: [...], iid: [...]}`).
    public var unregistered = UnregisteredAnswers.default
    /// How many newly dead devices a refresh may find before it is refused (`dead_share`, `dead_minimum`).
    public var deadTokenGuard = DeadTokenGuard()
    /// `max_shrink` (top level, and on each configured source).
    public var shrinkGuard = ShrinkGuard()
    /// What any one input may cost (`limits: {manifest_bytes, inventory_bytes, plan_bytes, devices}`).
    public var limits = InputLimits()
    /// Inventory sources that run SQL or a command (`inventory:`): honoured only from this file.
    public var inventory: [ConfiguredSource] = []
    /// `inventory: FILE`: the sources live in a file of their own (relative to the project directory,
    /// outside the manifests directory); the runtime reads it with `decodeInventoryFile`.
    public var inventoryFile: String?
    /// Where `inventory:` names the file, for its messages.
    public var inventoryFileLocation: SourceLocation?
    /// `prune_after`: the retention of dead and departed tokens in state, in seconds (and as written);
    /// set, apply prunes on its own.
    public var pruneAfter: Int64?
    /// `prune_after` as written (`90d`), for messages.
    public var pruneAfterText: String?
    /// `refresh:`, `refresh_budget:` and `refresh_max_age:`: what plan, apply and drift read by default.
    public var refresh = RefreshPolicy.sample
    /// `saved_plan_reread_after:` seconds within which applying a saved plan reads again only the
    /// registrations whose changes state and the manifests do not call for by themselves; 0: always all.
    public var savedPlanRereadAfter: Int64 = 15 * 60
    /// `group_export: {query, field}`: the shape of FCM's device-group export call, which FCM's
    /// docs do not state exactly.
    public var groupExport = GroupExportCall()
    /// Deadline notices acknowledged until a day (`acknowledge: {device_groups: 2027-06-30}`).
    public var acknowledgedDeadlines: [String: Date] = [:]
    /// `max_unsubscribes` in tidemark.yaml: the default of `--max-unsubscribes` for plans and applies.
    public var maxUnsubscribes: UnsubscribeLimit?
    /// `serve:` the workspaces `tidemark serve` reconciles; nil: the project's own workspace.
    public var serve: ServeSection?

    /// Every top-level key `tidemark.yaml` may hold; any other is refused by name.
    public static let keys = [
        "project", "backend", "manifests", "state", "transport", "qps", "qps_unit", "credentials",
        "fcm_url", "iid_url", "sender_id", "unregistered", "dead_share", "dead_minimum", "limits", "workspace",
        "max_shrink",
        "inventory", "prune_after", "read_qps", "refresh", "refresh_budget", "refresh_max_age", "group_export",
        "saved_plan_reread_after", "acknowledge", "max_unsubscribes", "serve",
    ]

    /// The settings of a project without `tidemark.yaml`.
    public init() {}

    /// Why `name` cannot name a workspace, or nil.
    public static func workspaceProblem(_ name: String) -> String? {
        let allowed = name.allSatisfy { $0.isASCII && ($0.isLetter || $0.isNumber || "-_.".contains($0)) }
        return !name.isEmpty && name.count <= 100 && allowed
            ? nil : "must be 1 to 100 letters, digits, '-', '_' or '.', such as prod or staging-eu, not '\(name)'."
    }

    /// Decodes a file of inventory sources that tidemark.yaml names (`inventory: ops/inventory.yaml`):
    /// the same list as tidemark.yaml's `inventory:`, at the top level or under an `inventory:` key.
    public static func decodeInventoryFile(
        _ text: String, file: String, sourceKinds: [SourceKind] = SourceKind.builtIn
    ) -> ([ConfiguredSource], [Diagnostic]) {
        var doc = YAMLDocument(file: file)
        guard let root = doc.compose(text) else { return ([], doc.diagnostics) }
        var list = root
        if case .mapping = root {
            guard let pairs = doc.mapping(root, "an inventory file", allowed: ["inventory"]), let first = pairs.first
            else { return ([], doc.diagnostics) }
            list = first.value
        }
        let sources = ConfiguredSource.decodeList(list, &doc, kinds: sourceKinds)
        return (sources, doc.diagnostics)
    }

    /// Why `id` is not a Google Cloud project id, or nil: 6 to 30 lowercase letters, digits and hyphens,
    /// starting with a letter (a domain-scoped project keeps its `example.com:` prefix).
    public static func projectIDProblem(_ id: String) -> String? {
        var id = Substring(id)
        if let colon = id.lastIndex(of: ":") {
            let domain = id[..<colon]
            guard !domain.isEmpty,
                domain.allSatisfy({ $0.isASCII && ($0.isLowercase || $0.isNumber || $0 == "-" || $0 == ".") })
            else { return "has a domain prefix that is not a domain name" }
            id = id[id.index(after: colon)...]
        }
        guard (6...30).contains(id.count) else { return "must be 6 to 30 characters long" }
        guard let first = id.first, first.isASCII, first.isLowercase else {
            return "must start with a lowercase letter"
        }
        guard id.allSatisfy({ $0.isASCII && ($0.isLowercase || $0.isNumber || $0 == "-") }), !id.hasSuffix("-") else {
            return "may hold only lowercase letters, digits and hyphens, and may not end with a hyphen"
        }
        return nil
    }

    /// Decodes the project file's text; problems come back as diagnostics. `sourceKinds` are the kinds
    /// of source its `inventory:` may declare, `transports` the topic transports `transport` may name.
    public static func decode(
        _ text: String, file: String, sourceKinds: [SourceKind] = SourceKind.builtIn,
        transports: [TopicTransport] = TopicTransport.builtIn
    ) -> (ProjectSettings, [Diagnostic]) {
        var doc = YAMLDocument(file: file)
        var settings = ProjectSettings()
        guard let root = doc.compose(text) else { return (settings, doc.diagnostics) }
        if case .scalar(let s) = root, s.string.isEmpty { return (settings, doc.diagnostics) }
        for (key, _, value) in doc.mapping(root, "tidemark.yaml", allowed: keys) ?? [] {
            if key == "read_qps" {
                if case .scalar(let scalar) = value, let reads = Double(scalar.string), FCMLimits.isRate(reads) {
                    settings.readQPS = reads
                } else {
                    doc.error(
                        "'read_qps' must be a number of reads per second from above 0 to \(FCMLimits.maxRate), not '\(value.scalar?.string ?? "")'.",
                        value)
                }
                continue
            }
            if key == "qps" {
                if case .scalar(let scalar) = value, let qps = Double(scalar.string), FCMLimits.isRate(qps) {
                    settings.qps = qps
                } else {
                    doc.error(
                        "'qps' must be a number of subscription changes per second from above 0 to \(FCMLimits.maxRate) (FCM allows 3000), not '\(value.scalar?.string ?? "")'.",
                        value)
                }
                continue
            }
            switch key {
            case "serve":
                settings.serve = ServeSection.decode(value, &doc)
                continue
            case "inventory":
                if case .scalar(let scalar) = value, !scalar.string.isEmpty {
                    settings.inventoryFile = scalar.string
                    settings.inventoryFileLocation = doc.location(value)
                } else {
                    settings.inventory = ConfiguredSource.decodeList(value, &doc, kinds: sourceKinds)
                }
                continue
            case "refresh":
                let text = doc.string(value, "'refresh'") ?? ""
                if let mode = RefreshMode(rawValue: text) {
                    settings.refresh.mode = mode
                } else {
                    doc.error("'refresh' must be touched, sample, all or none, not '\(text)'.", value)
                }
                continue
            case "refresh_budget":
                let text = doc.string(value, "'refresh_budget'") ?? ""
                do {
                    settings.refresh.budget = try RefreshBudget(parsing: text)
                } catch {
                    doc.error("'refresh_budget': \(error.description)", value)
                }
                continue
            case "max_shrink":
                if let share = doc.share(value, "'max_shrink'", meaning: ShrinkGuard.meaning("an inventory source")) {
                    settings.shrinkGuard.share = share
                }
                continue
            case "refresh_max_age":
                settings.refresh.maxAge = doc.duration(value, "'refresh_max_age'", example: "30d or 12h")?.seconds
                continue
            case "saved_plan_reread_after":
                if case .scalar(let scalar) = value, ["0", "0s", "0m", "0h", "0d"].contains(scalar.string) {
                    settings.savedPlanRereadAfter = 0
                } else if let (seconds, _) = doc.duration(value, "'saved_plan_reread_after'", example: "15m or 0s") {
                    settings.savedPlanRereadAfter = seconds
                }
                continue
            case "prune_after":
                if let (seconds, text) = doc.duration(value, "'prune_after'", example: "90d or 12w") {
                    settings.pruneAfter = seconds
                    settings.pruneAfterText = text
                }
                continue
            case "acknowledge":
                for (name, _, item) in doc.mapping(value, "'acknowledge'", allowed: DeadlineCheck.acknowledgeable) ?? []
                {
                    let text = item.scalar?.string ?? ""
                    // Only a real day written YYYY-MM-DD: one that reads back the same.
                    let written = ISO8601DateFormatter()
                    written.formatOptions = [.withFullDate]
                    guard let date = FCMDeadlines.parseDay(text), written.string(from: date) == text else {
                        doc.error("'acknowledge.\(name)' must be a date written YYYY-MM-DD, not '\(text)'.", item)
                        continue
                    }
                    guard date <= FCMDeadlines.deviceGroupsTurnedDown else {
                        doc.error(
                            "'acknowledge.\(name)' is \(text), after FCM's turn-down on \(FCMDeadlines.format(FCMDeadlines.deviceGroupsTurnedDown)); an acknowledgement ends by then.",
                            item)
                        continue
                    }
                    settings.acknowledgedDeadlines[name] = date
                }
                continue
            case "max_unsubscribes":
                let text = value.scalar?.string ?? ""
                do {
                    settings.maxUnsubscribes = try UnsubscribeLimit(parsing: text, setting: "max_unsubscribes")
                } catch {
                    doc.error("\(error.description)", value)
                }
                continue
            case "group_export":
                for (name, _, item) in doc.mapping(value, "'group_export'", allowed: ["query", "field"]) ?? [] {
                    guard let text = doc.string(item, "'group_export.\(name)'") else { continue }
                    if name == "query" { settings.groupExport.query = text } else { settings.groupExport.field = text }
                }
                continue
            case "unregistered":
                for (surface, _, list) in doc.mapping(value, "'unregistered'", allowed: ["v1", "iid"]) ?? [] {
                    // A code FCM never sends (a typo, a lower-case name) would silently mark no token dead.
                    let known =
                        surface == "v1" ? UnregisteredAnswers.documentedV1Codes : UnregisteredAnswers.documentedIIDCodes
                    var codes = Set<String>()
                    for (code, node) in doc.strings(list, "'unregistered.\(surface)'") ?? [] {
                        guard known.contains(code) else {
                            let hint =
                                nearest(code.uppercased(), in: known.sorted()).map { "did you mean '\($0)'? " } ?? ""
                            doc.error(
                                "'unregistered.\(surface)' lists '\(code.escapedOnOneLine)', an answer FCM does not send; \(hint)it takes \(known.sorted().joined(separator: ", ")).",
                                node)
                            continue
                        }
                        codes.insert(code)
                    }
                    if surface == "v1" { settings.unregistered.v1 = codes } else { settings.unregistered.iid = codes }
                }
                continue
            case "dead_share":
                if let share = doc.share(
                    value, "'dead_share'", meaning: "a share of the registrations read, such as 20% or 0.2",
                    aboveZero: true)
                {
                    settings.deadTokenGuard.share = share
                }
                continue
            case "limits":
                for (name, _, limit) in doc.mapping(value, "'limits'", allowed: InputLimits.keys) ?? [] {
                    let text = (limit.scalar?.string) ?? ""
                    if name == "devices" || name == "plan_operations" {
                        if let number = Int(text.replacingOccurrences(of: "_", with: "")), number > 0 {
                            if name == "devices" {
                                settings.limits.devices = number
                            } else {
                                settings.limits.planOperations = number
                            }
                        } else {
                            doc.error(
                                "'limits.\(name)' must be a positive whole number, not '\(text.escapedOnOneLine)'.",
                                limit)
                        }
                        continue
                    }
                    guard let bytes = InputLimits.bytes(text) else {
                        doc.error(
                            "'limits.\(name)' must be a size such as 512MiB, 2GiB or a number of bytes, not '\(text)'.",
                            limit)
                        continue
                    }
                    switch name {
                    case "manifest_bytes": settings.limits.manifestBytes = bytes
                    case "inventory_bytes": settings.limits.inventoryBytes = bytes
                    case "token_file_bytes": settings.limits.tokenFileBytes = bytes
                    default: settings.limits.planBytes = bytes
                    }
                }
                continue
            case "dead_minimum":
                if case .scalar(let scalar) = value, let number = Int(scalar.string), number >= 0 {
                    settings.deadTokenGuard.minimum = number
                } else {
                    doc.error("'dead_minimum' must be a whole number of devices.", value)
                }
                continue
            default: break
            }
            guard let text = doc.string(value, "'\(key)'") else { continue }
            switch key {
            case "project":
                if let problem = ProjectSettings.projectIDProblem(text) {
                    doc.error("'project' \(problem), not '\(text.escapedOnOneLine)'.", value)
                } else {
                    settings.project = text
                }
            case "backend":
                if let kind = BackendKind(rawValue: text) {
                    settings.backend = kind
                } else {
                    doc.error("unknown backend '\(text)'; use embedded, emulator or fcm.", value)
                }
            case "manifests": settings.manifests = text
            case "state": settings.state = text
            case "workspace":
                if let problem = ProjectSettings.workspaceProblem(text) {
                    doc.error("'workspace' \(problem)", value)
                } else {
                    settings.workspace = text
                }
            case "credentials": settings.credentials = text
            case "sender_id":
                if text.count <= 20, text.allSatisfy({ $0.isASCII && $0.isNumber }) {
                    settings.senderID = text
                } else {
                    doc.error(
                        "'sender_id' must be the project number (digits only, as in the Firebase console's Cloud Messaging settings), not '\(text.escapedOnOneLine)'.",
                        value)
                }
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
                if transports.contains(TopicTransport(rawValue: text)) {
                    settings.transport = TopicTransport(rawValue: text)
                } else {
                    doc.error(
                        "unknown transport '\(text.escapedOnOneLine)'; use \(TopicTransport.describe(transports)).",
                        value)
                }
            default: break
            }
        }
        return (settings, doc.diagnostics)
    }
}

/// FCM's device-group export call, as far as its shape is configurable: the query parameter that
/// names the group's key, and the field of the answer that lists its tokens.
public struct GroupExportCall: Sendable, Equatable {
    /// The query parameter that names the group's key.
    public var query = "notification_key"
    /// The field of the answer that lists the group's tokens.
    public var field = "registration_ids"

    /// The shape FCM's docs suggest.
    public init() {}
}
