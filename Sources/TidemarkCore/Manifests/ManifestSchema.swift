/// The shape of a manifest, described once: the decoder allows these keys, the formatter writes
/// them in this order, and a test checks that the JSON Schema in `schema/` names the same keys.
public enum ManifestSchema {
    /// The kinds of mapping a manifest has.
    public enum Node: String, Sendable, CaseIterable {
        case root, inventory, inventoryFile, device, topic, group, audience, member, removed
    }

    /// The keys a node may have, in canonical order.
    public static func keys(_ node: Node) -> [String] {
        switch node {
        case .root: ["inventory", "topics", "groups", "audiences", "removed"]
        case .inventory: ["files", "devices"]
        case .inventoryFile: ["path", "format"]
        case .device: ["id", "token", "labels"]
        case .topic:
            ["name", "description", "mode", "protect", "allow_empty", "max_unsubscribes", "opt_outs", "members"]
        case .group: ["notification_key_name", "description", "protect", "members"]
        case .audience: ["name", "description", "protect", "retire_group_key", "members"]
        case .member: ["token", "tokens", "device", "devices", "selector", "file"]
        case .removed: ["topic", "group", "audience", "unsubscribe"]
        }
    }

    /// Keys a node must have.
    public static func required(_ node: Node) -> [String] {
        switch node {
        case .inventoryFile: ["path"]
        case .device: ["id", "token"]
        case .topic: ["name"]
        case .group: ["notification_key_name"]
        case .audience: ["name"]
        case .removed: ["unsubscribe"]
        default: []
        }
    }
}
