import Yams

/// Decodes manifest YAML into a `ManifestSet`, reporting every problem with its place.
public struct ManifestDecoder {
    static let topLevelKeys = ManifestSchema.keys(.root)
    static let inventoryKeys = ManifestSchema.keys(.inventory)
    static let inventoryFileKeys = ManifestSchema.keys(.inventoryFile)
    static let deviceKeys = ManifestSchema.keys(.device)
    static let topicKeys = ManifestSchema.keys(.topic)
    static let groupKeys = ManifestSchema.keys(.group)
    static let audienceKeys = ManifestSchema.keys(.audience)
    static let memberKeys = ManifestSchema.keys(.member)
    static let removedKeys = ManifestSchema.keys(.removed)

    /// A decoder.
    public init() {}

    /// Decodes one manifest file's text and adds what it declares to `set`.
    public func decode(_ text: String, file: String, into set: inout ManifestSet) -> [Diagnostic] {
        var doc = YAMLDocument(file: file)
        set.files.append(file)
        guard let root = doc.compose(text) else { return doc.diagnostics }
        if case .scalar(let s) = root, s.string.isEmpty { return doc.diagnostics }
        guard let pairs = doc.mapping(root, "a manifest file", allowed: Self.topLevelKeys) else {
            return doc.diagnostics
        }
        for (key, _, value) in pairs {
            switch key {
            case "inventory": decodeInventory(value, &doc, &set)
            case "topics":
                for item in doc.sequence(value, "'topics'") ?? [] {
                    if let topic = decodeTopic(item, &doc) { set.topics.append(topic) }
                }
            case "groups":
                for item in doc.sequence(value, "'groups'") ?? [] {
                    if let group = decodeGroup(item, &doc) { set.groups.append(group) }
                }
            case "audiences":
                for item in doc.sequence(value, "'audiences'") ?? [] {
                    if let audience = decodeAudience(item, &doc) { set.audiences.append(audience) }
                }
            case "removed":
                for item in doc.sequence(value, "'removed'") ?? [] {
                    if let entry = decodeRemoved(item, &doc) { set.removed.append(entry) }
                }
            default: break
            }
        }
        return doc.diagnostics
    }

    private func decodeInventory(_ node: Node, _ doc: inout YAMLDocument, _ set: inout ManifestSet) {
        // Keys that run SQL or a program get their own refusal, not "unknown key".
        let honouredElsewhere = ["postgres", "exec", "on_dead", "exclude_if", "query", "command"]
        guard let pairs = doc.mapping(node, "'inventory'", allowed: Self.inventoryKeys + honouredElsewhere) else {
            return
        }
        for (key, keyNode, value) in pairs {
            switch key {
            case _ where honouredElsewhere.contains(key):
                doc.error(
                    "'\(key)' in a manifest is refused: sources that run SQL or a command (postgres, exec, on_dead) are honoured only from tidemark.yaml's 'inventory:', so a pull request that edits manifests cannot make CI run them. Move it to tidemark.yaml (see docs/inventory.md).",
                    keyNode)
            case "files":
                let items: [(Node, String)]
                if case .sequence(let sequence) = value {
                    items = sequence.map { ($0, "each item of 'inventory.files'") }
                } else {
                    items = [(value, "'inventory.files'")]
                }
                for (item, what) in items {
                    if let file = decodeInventoryFile(item, what: what, &doc) { set.inventoryFiles.append(file) }
                }
            case "devices":
                for item in doc.sequence(value, "'inventory.devices'") ?? [] {
                    if let device = decodeDevice(item, &doc) { set.devices.append(device) }
                }
            default: break
            }
        }
    }

    /// A file name, or `{path: …, format: csv|jsonl}` for a name that does not say its format.
    private func decodeInventoryFile(_ node: Node, what: String, _ doc: inout YAMLDocument) -> InventoryFileSpec? {
        guard case .mapping = node else {
            return doc.string(node, what).map { InventoryFileSpec(path: Located($0, at: doc.location(node))) }
        }
        guard let pairs = doc.mapping(node, "an inventory file", allowed: Self.inventoryFileKeys) else { return nil }
        var path: Located<String>?
        var format: InventoryFormat?
        for (key, _, value) in pairs {
            switch key {
            case "path": path = doc.string(value, "'path'").map { Located($0, at: doc.location(value)) }
            case "format":
                guard let text = doc.string(value, "'format'") else { continue }
                if let known = InventoryFormat(rawValue: text) {
                    format = known
                } else {
                    doc.error("unknown inventory format '\(text)'; use \(InventoryFormat.choices).", value)
                }
            default: break
            }
        }
        guard let path else {
            doc.error("an inventory file needs a 'path'.", node)
            return nil
        }
        return InventoryFileSpec(path: path, format: format)
    }

    private func decodeDevice(_ node: Node, _ doc: inout YAMLDocument) -> DeviceSpec? {
        guard let pairs = doc.mapping(node, "a device", allowed: Self.deviceKeys) else { return nil }
        var id: Located<String>?
        var token: Located<String>?
        var labels: [String: String] = [:]
        for (key, _, value) in pairs {
            switch key {
            case "id": id = doc.identifier(value, "'id'").map { Located($0, at: doc.location(value)) }
            case "token": token = doc.string(value, "'token'").map { Located($0, at: doc.location(value)) }
            case "labels":
                guard case .mapping(let mapping) = value else {
                    doc.error("'labels' must be a mapping of label names to values.", value)
                    continue
                }
                for (k, v) in mapping {
                    guard let name = doc.string(k, "a label name"),
                        let text = doc.string(v, "label '\(k.string ?? "")'")
                    else { continue }
                    labels[name] = text
                }
            default: break
            }
        }
        guard let id, let token else {
            // A key that is there with a bad value was reported already.
            let named = Set(pairs.map(\.key))
            if !named.contains("id") || !named.contains("token") {
                doc.error("a device needs both 'id' and 'token'.", node)
            }
            return nil
        }
        return DeviceSpec(id: id, token: token, labels: labels)
    }

    private func decodeTopic(_ node: Node, _ doc: inout YAMLDocument) -> TopicSpec? {
        let errorsBefore = doc.errorCount
        guard let pairs = doc.mapping(node, "a topic", allowed: Self.topicKeys) else { return nil }
        guard let namePair = pairs.first(where: { $0.key == "name" }) else {
            doc.error("a topic needs a 'name'.", node)
            return nil
        }
        guard let name = doc.string(namePair.value, "the topic 'name'") else { return nil }
        var topic = TopicSpec(name: Located(name, at: doc.location(namePair.value)), location: doc.location(node))
        for (key, _, value) in pairs {
            switch key {
            case "mode":
                guard let text = doc.string(value, "'mode'") else { continue }
                if let mode = TopicMode(rawValue: text) {
                    topic.mode = mode
                } else {
                    doc.error("unknown mode '\(text)' for topic '\(name)'; use 'additive' or 'authoritative'.", value)
                }
            case "protect": topic.protect = doc.bool(value, "'protect'") ?? false
            case "allow_empty": topic.allowEmpty = doc.bool(value, "'allow_empty'") ?? false
            case "max_unsubscribes":
                guard let text = doc.string(value, "'max_unsubscribes'") else { continue }
                do {
                    topic.maxUnsubscribes = try UnsubscribeLimit(parsing: text, setting: "max_unsubscribes")
                } catch {
                    doc.error("\(error.description)", value)
                }
            case "opt_outs":
                guard let text = doc.string(value, "'opt_outs'") else { continue }
                if let policy = OptOutPolicy(rawValue: text) {
                    topic.optOuts = policy
                } else {
                    doc.error(
                        "unknown opt_outs '\(text)' for topic '\(name)'; use 'respect' (leave devices that unsubscribed themselves alone) or 'restore' (subscribe them again).",
                        value)
                }
            case "description": topic.description = doc.string(value, "'description'")
            case "members": topic.members = decodeMembers(value, owner: "topic '\(name)'", &doc)
            default: break
            }
        }
        topic.incomplete = doc.errorCount > errorsBefore
        return topic
    }

    private func decodeGroup(_ node: Node, _ doc: inout YAMLDocument) -> GroupSpec? {
        let errorsBefore = doc.errorCount
        guard let pairs = doc.mapping(node, "a device group", allowed: Self.groupKeys) else { return nil }
        guard let namePair = pairs.first(where: { $0.key == "notification_key_name" }) else {
            doc.error("a device group needs a 'notification_key_name'.", node)
            return nil
        }
        guard let name = doc.string(namePair.value, "'notification_key_name'") else { return nil }
        if let problem = FCMLimits.groupNameProblem(name) {
            doc.error("'notification_key_name' \(problem).", namePair.value)
            return nil
        }
        var group = GroupSpec(name: Located(name, at: doc.location(namePair.value)), location: doc.location(node))
        for (key, _, value) in pairs {
            switch key {
            case "protect": group.protect = doc.bool(value, "'protect'") ?? false
            case "description": group.description = doc.string(value, "'description'")
            case "members": group.members = decodeMembers(value, owner: "group '\(name)'", &doc)
            default: break
            }
        }
        group.incomplete = doc.errorCount > errorsBefore
        return group
    }

    private func decodeAudience(_ node: Node, _ doc: inout YAMLDocument) -> GroupSpec? {
        let errorsBefore = doc.errorCount
        guard let pairs = doc.mapping(node, "an audience", allowed: Self.audienceKeys) else { return nil }
        guard let namePair = pairs.first(where: { $0.key == "name" }) else {
            doc.error(
                "an audience needs a 'name' (to convert a device group, use its notification_key_name).", node)
            return nil
        }
        guard let name = doc.string(namePair.value, "'name'") else { return nil }
        var audience = GroupSpec(name: Located(name, at: doc.location(namePair.value)), location: doc.location(node))
        for (key, _, value) in pairs {
            switch key {
            case "protect": audience.protect = doc.bool(value, "'protect'") ?? false
            case "retire_group_key": audience.retireGroupKey = doc.bool(value, "'retire_group_key'") ?? false
            case "description": audience.description = doc.string(value, "'description'")
            case "members": audience.members = decodeMembers(value, owner: "audience '\(name)'", &doc)
            default: break
            }
        }
        audience.incomplete = doc.errorCount > errorsBefore
        if audience.members.isEmpty, !audience.incomplete {
            // An audience replaces a device group: with no members it would be a topic nobody is in.
            doc.error(
                "audience '\(name.escapedOnOneLine)' has no members; list them under 'members' (the device group it replaces lists its own).",
                node)
            return nil
        }
        return audience
    }

    /// `{topic: NAME, unsubscribe: false}`, or `group:` or `audience:` instead of `topic:`.
    private func decodeRemoved(_ node: Node, _ doc: inout YAMLDocument) -> RemovedSpec? {
        guard let pairs = doc.mapping(node, "a 'removed' entry", allowed: Self.removedKeys) else { return nil }
        let named = pairs.filter { StateAddress.Kind(rawValue: $0.key) != nil }
        guard named.count == 1, let (key, _, value) = named.first, let kind = StateAddress.Kind(rawValue: key) else {
            doc.error(
                named.isEmpty
                    ? "a 'removed' entry names what leaves management: 'topic: NAME', 'group: NAME' or 'audience: NAME'."
                    : "a 'removed' entry names one thing; this one names \(named.map(\.key).joined(separator: " and ")): write one entry each.",
                node)
            return nil
        }
        guard let name = doc.string(value, "'\(key)'") else { return nil }
        guard let unsubscribePair = pairs.first(where: { $0.key == "unsubscribe" }) else {
            doc.error(
                "the 'removed' entry for \(key) '\(name.escapedOnOneLine)' needs 'unsubscribe': false releases it (nothing is sent to FCM, its memberships stay, state forgets it); true removes the memberships tidemark made.",
                node)
            return nil
        }
        guard let unsubscribe = doc.bool(unsubscribePair.value, "'unsubscribe'") else { return nil }
        return RemovedSpec(
            kind: kind, name: Located(name, at: doc.location(value)), unsubscribe: unsubscribe,
            location: doc.location(node))
    }

    private func decodeMembers(_ node: Node, owner: String, _ doc: inout YAMLDocument) -> [MemberRef] {
        var members: [MemberRef] = []
        for item in doc.sequence(node, "'members' of \(owner)") ?? [] {
            guard let pairs = doc.mapping(item, "a member entry of \(owner)", allowed: Self.memberKeys) else {
                continue
            }
            guard pairs.count == 1, let (key, _, value) = pairs.first else {
                if pairs.count > 1 {
                    doc.error(
                        "a member entry of \(owner) names \(pairs.count) kinds (\(pairs.map(\.key).joined(separator: ", "))); write one entry per kind.",
                        item)
                } else if case .mapping(let mapping) = item, mapping.count > 0 {
                    // Its keys were all unknown, and each was reported with the nearest known one.
                } else {
                    doc.error(
                        "a member entry of \(owner) is empty; give one of \(Self.memberKeys.joined(separator: ", ")).",
                        item)
                }
                continue
            }
            switch key {
            case "token", "tokens":
                let values = doc.strings(value, "'\(key)'") ?? []
                members.append(.tokens(values.map { Located($0.0, at: doc.location($0.1)) }))
            case "device", "devices":
                let values = doc.strings(value, "'\(key)'") ?? []
                members.append(.devices(values.map { Located($0.0, at: doc.location($0.1)) }))
            case "file":
                if let path = doc.string(value, "'file'") {
                    members.append(.file(Located(path, at: doc.location(value))))
                }
            case "selector":
                if let requirements = decodeSelector(value, &doc) {
                    members.append(.selector(requirements, doc.location(value)))
                }
            default: break
            }
        }
        return members
    }

    private func decodeSelector(_ node: Node, _ doc: inout YAMLDocument) -> [LabelRequirement]? {
        guard case .mapping(let mapping) = node, !mapping.isEmpty else {
            doc.error(
                "a 'selector' must be a non-empty mapping of label names to a value, a list of values, or {not: …}.",
                node)
            return nil
        }
        var result: [LabelRequirement] = []
        for (keyNode, value) in mapping {
            guard let key = doc.string(keyNode, "a label name") else { continue }
            let location = doc.location(keyNode)
            switch value {
            case .scalar:
                if let v = doc.string(value, "label '\(key)'") {
                    result.append(LabelRequirement(key: key, op: .equals(v), location: location))
                }
            case .sequence:
                let values = (doc.strings(value, "label '\(key)'") ?? []).map(\.0)
                result.append(LabelRequirement(key: key, op: .inSet(values), location: location))
            case .mapping:
                guard let pairs = doc.mapping(value, "the condition on label '\(key)'", allowed: ["not"]),
                    let negated = pairs.first?.value
                else { continue }
                if case .sequence = negated {
                    let values = (doc.strings(negated, "'not'") ?? []).map(\.0)
                    result.append(LabelRequirement(key: key, op: .notInSet(values), location: location))
                } else if let v = doc.string(negated, "'not'") {
                    result.append(LabelRequirement(key: key, op: .notEquals(v), location: location))
                }
            case .alias:
                doc.error("YAML aliases are not supported in selectors; write the values out.", value)
            }
        }
        return result
    }
}
