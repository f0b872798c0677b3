import Foundation

/// One device as tidemark sees it: every topic and group it is in, desired and last observed, and why.
public struct DeviceView: Sendable, Codable {
    /// The device in one topic or group.
    public struct Membership: Sendable, Codable, Equatable {
        /// The topic's or group's name.
        public var name: String
        /// The topic's mode (topics only).
        public var mode: String?
        /// Declared in the manifests.
        public var desired: Bool
        /// In it when tidemark last looked (a refresh or an apply).
        public var observed: Bool
        /// tidemark made or adopted this membership (topics only).
        public var managed: Bool?
        /// The device left the topic in the app, and tidemark respects it (topics only).
        public var optedOut: Bool?
        /// Why: the member entries that name the device, or why it is there without one.
        public var reasons: [String]
        /// What the next apply does about it, when anything.
        public var next: String?
    }

    /// What the user asked about: a device id or a token.
    public var query: String
    /// The device's id, when known.
    public var device: String?
    /// Its token (redacted when shown unless asked for).
    public var token: String
    /// Where the inventory declares the device, when it does.
    public var declaredAt: String?
    /// Its labels in the inventory.
    public var labels: [String: String]
    /// When a refresh last read the registration (nil: never).
    public var lastRead: Date?
    /// Whether FCM reported the token unregistered.
    public var dead: Bool
    /// When the device's token stopped being declared, when it did.
    public var leftInventory: Date?
    /// The topics it is in, declared or observed.
    public var topics: [Membership]
    /// The groups and audiences it is in, declared or observed.
    public var groups: [Membership]
}

/// `tidemark device ID|TOKEN`: one device's memberships from state and manifests. Reads nothing from
/// FCM and writes nothing.
public struct DeviceWorkflow: Sendable {
    /// The parts it reads (state and manifests only).
    public var parts: WorkflowParts

    /// The workflow over `parts`.
    public init(_ parts: WorkflowParts) { self.parts = parts }

    /// How many matching device ids an ambiguous prefix lists.
    public static let listedMatches = 10

    /// The device ids of the inventory and state that begin with `prefix`, sorted, without repeats
    /// (at most one past `listedMatches`, enough to say there are more).
    static func devices(beginning prefix: String, inventory: [String], state: [String]) -> [String] {
        guard !prefix.isEmpty else { return [] }
        var found = Set<String>()
        for id in inventory where id.hasPrefix(prefix) { found.insert(id) }
        for id in state where !id.isEmpty && id.hasPrefix(prefix) { found.insert(id) }
        return Array(found.sorted().prefix(listedMatches + 1))
    }

    /// The device whose id or token is `query` (or whose id alone begins with `query`), with its memberships.
    public func run(_ query: String) async throws -> DeviceView {
        var (state, loaded, read) = try await WorkflowParts.loadStateAndRead(
            manifests: parts.manifests, store: parts.store)
        try parts.stopOnErrors(loaded)
        let inventory = loaded.inventory
        /// The device and token `query` names exactly, if any.
        func exactly(_ query: String) -> (device: String?, token: String)? {
            if let i = inventory.index(ofDevice: query) { return (query, inventory.tokens[i]) }
            if let i = inventory.index(ofToken: query) { return (inventory.deviceIDs[i], query) }
            if let id = state.tokens.id(query) { return (state.deviceID(of: id), query) }
            // A device the inventory no longer lists: its last token state knows.
            if let index = state.deviceIDs.lastIndex(of: query) { return (query, state.tokens[UInt32(index)]) }
            return nil
        }
        let found: (device: String?, token: String)
        if let exact = exactly(query) {
            found = exact
        } else {
            // The start of a device id, when it names one device.
            let matches = Self.devices(beginning: query, inventory: inventory.deviceIDs, state: state.deviceIDs)
            guard matches.count <= 1 else { throw WorkflowError.ambiguousDevice(query, matches: matches) }
            guard let only = matches.first, let named = exactly(only) else { throw WorkflowError.unknownDevice(query) }
            found = named
        }
        let (device, token) = found
        let id = state.intern(token)
        let entries = state.interning { read.entries(naming: id, table: &$0) }
        var next: [String: String] = [:]
        for op in parts.differ().diff(desired: loaded.desired, state: state, targets: .all).operations {
            let key = State.versionKey(op.kind.isGroup ? .group : .topic, op.target)
            let member = state.groups[op.target]?.members.contains(id) ?? false
            switch op.kind {
            case .audienceSet where !op.tokens.contains(token):
                if member { next[key] = "apply removes it from the audience" }
            case .audienceDelete, .audienceUnlink, .topicRelease, .groupRelease:
                break
            case _ where !op.tokens.contains(token):
                break
            case .subscribe: next[key] = "apply subscribes it"
            case .unsubscribe: next[key] = "apply unsubscribes it"
            case .groupCreate: next[key] = "apply creates the group with it"
            case .groupAdd: next[key] = "apply adds it"
            case .groupRemove: next[key] = "apply removes it"
            case .audienceSet: if !member { next[key] = "apply adds it to the audience" }
            case .topicAdopt: next[key] = "apply records its membership, which FCM already holds, as tidemark's own"
            }
        }
        let index = inventory.index(ofToken: token)
        var absent: String
        if index != nil {
            absent = "not declared here"
        } else if let device, let now = inventory.index(ofDevice: device) {
            absent = "token rotated: the device now has \(Redaction.redact(inventory.tokens[now]))"
        } else {
            absent = "the device left the inventory"
        }
        if state.dead.contains(id) { absent = "FCM reported the token unregistered" }

        var topics: [DeviceView.Membership] = []
        let specs = Dictionary(loaded.desired.topics.map { ($0.name, $0) }, uniquingKeysWith: { a, _ in a })
        let names = Set(specs.keys).union(state.topics.keys).sorted()
        for name in names {
            let spec = specs[name]
            let known = state.topics[name]
            let desired = spec?.members.contains(id) ?? false
            let observed = known?.observed.contains(id) ?? false
            let managed = known?.managed.contains(id) ?? false
            let optedOut = known?.optedOut.contains(id) ?? false
            guard desired || observed || managed || optedOut else { continue }
            let key = State.versionKey(.topic, name)
            var reasons = (entries[key] ?? []).map(\.explanation)
            if reasons.isEmpty {
                reasons.append(spec == nil ? "the topic is no longer declared" : absent)
                if observed, !managed, spec?.mode != .authoritative {
                    reasons.append("subscribed outside tidemark; an additive topic leaves it")
                }
            }
            if optedOut { reasons.append("opted out in the app") }
            topics.append(
                DeviceView.Membership(
                    name: name, mode: (spec?.mode ?? known?.mode)?.rawValue, desired: desired, observed: observed,
                    managed: managed, optedOut: optedOut, reasons: reasons, next: next[key]))
        }
        var groups: [DeviceView.Membership] = []
        let groupSpecs = Dictionary(
            (loaded.desired.groups + loaded.desired.audiences).map { ($0.name, $0) }, uniquingKeysWith: { a, _ in a })
        for name in Set(groupSpecs.keys).union(state.groups.keys).sorted() {
            let desired = groupSpecs[name]?.members.contains(id) ?? false
            let member = state.groups[name]?.members.contains(id) ?? false
            guard desired || member else { continue }
            let key = State.versionKey(.group, name)
            var reasons = (entries[key] ?? []).map(\.explanation)
            if reasons.isEmpty { reasons.append(groupSpecs[name] == nil ? "the group is no longer declared" : absent) }
            groups.append(
                DeviceView.Membership(
                    name: name, desired: desired, observed: member, reasons: reasons, next: next[key]))
        }
        var labels: [String: String] = [:]
        if let index {
            for key in inventory.labelKeys {
                if let value = inventory.label(key, ofDevice: index) { labels[key] = value }
            }
        }
        // Interned above: the registry has a row for it in every column.
        let seen = state.seenAt[Int(id)]
        let left = state.leftAt[Int(id)]
        return DeviceView(
            query: query, device: device, token: token,
            declaredAt: index.map { "\(inventory.location(ofDevice: $0))" }, labels: labels,
            lastRead: seen > 0 ? Date(timeIntervalSince1970: TimeInterval(seen)) : nil, dead: state.dead.contains(id),
            leftInventory: left > 0 ? Date(timeIntervalSince1970: TimeInterval(left)) : nil, topics: topics,
            groups: groups)
    }
}

/// Renders a device's view for people: tokens redacted unless asked.
public struct DeviceRenderer: Sendable {
    /// Whether tokens are shown whole (`--show-tokens`).
    public var showTokens: Bool

    /// A renderer; tokens redacted unless `showTokens`.
    public init(showTokens: Bool = false) { self.showTokens = showTokens }

    /// The view for a terminal.
    public func text(_ view: DeviceView) -> String {
        let token = showTokens ? view.token : Redaction.redact(view.token)
        var out: [String] = []
        out.append("Device \(view.device ?? "(unknown id)") with token \(token)")
        if let at = view.declaredAt { out.append("Declared at \(at)") } else { out.append("Not in the inventory.") }
        if !view.labels.isEmpty {
            out.append(
                "Labels: "
                    + view.labels.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: ", "))
        }
        let formatter = ISO8601DateFormatter()
        var facts: [String] = []
        facts.append(view.lastRead.map { "last read from FCM \(formatter.string(from: $0))" } ?? "never read from FCM")
        if view.dead { facts.append("FCM reported it unregistered") }
        if let left = view.leftInventory { facts.append("left the inventory \(formatter.string(from: left))") }
        out.append("State: " + facts.joined(separator: "; ") + ".")
        func section(_ title: String, _ items: [DeviceView.Membership], observedWord: String) {
            out.append("")
            guard !items.isEmpty else {
                out.append("\(title): none.")
                return
            }
            out.append("\(title):")
            for item in items {
                let mode = item.mode.map { " (\($0))" } ?? ""
                let state = "desired: \(item.desired ? "yes" : "no"), \(observedWord): \(item.observed ? "yes" : "no")"
                out.append("  \(item.name)\(mode): \(state)\(item.next.map { "; \($0)" } ?? "")")
                for reason in item.reasons { out.append("    \(reason)") }
            }
        }
        section("Topics", view.topics, observedWord: "observed")
        section("Device groups and audiences", view.groups, observedWord: "member")
        out.append("")
        out.append("From state and the manifests; nothing was read from FCM ('tidemark plan' reads it).")
        return out.joined(separator: "\n") + "\n"
    }
}
