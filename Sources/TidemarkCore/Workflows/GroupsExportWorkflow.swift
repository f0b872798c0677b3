import Foundation

/// What `tidemark groups export` found: every group's tokens, as FCM lists them.
public struct GroupsExport: Sendable, Codable {
    /// One token FCM lists for a group.
    public struct Member: Sendable, Codable, Equatable {
        /// The registration token.
        public var token: String
        /// The inventory's device id for the token, or the one state remembers; nil when unknown.
        public var deviceID: String?
    }

    /// One group as FCM lists it.
    public struct Group: Sendable, Codable, Equatable {
        /// The group's `notification_key_name`.
        public var name: String
        /// nil when FCM knows no such group.
        public var notificationKey: String?
        /// Its members, as FCM lists them.
        public var members: [Member]
        /// Members FCM lists that tidemark did not add (added by the app or by hand).
        public var notAddedByTidemark: Int
    }

    /// Every group exported, by name.
    public var groups: [Group]
    /// When FCM was read.
    public var exportedAt: Date
    /// The state serial the export was recorded at; nil when FCM knew none of the groups (nothing
    /// to record).
    public var serial: Int?
}

/// `tidemark groups export`: reads every managed group's tokens (declared, remembered in state, or
/// named) through FCM's export call while it exists, so the app can keep its own group→tokens
/// mapping after device groups are turned down on 29 September 2027. Writes nothing to FCM; records
/// what it read in state (each group's `exported` tokens), so that tidemark keeps the mapping too.
///
/// The caller holds the state lock around `run`.
public struct GroupsExportWorkflow: Sendable {
    /// The parts it reads and records to.
    public var parts: WorkflowParts

    /// The workflow over `parts`.
    public init(_ parts: WorkflowParts) { self.parts = parts }

    /// Exports the groups named (every group state knows when none is) and records what it read.
    public func run(names: [String] = []) async throws -> GroupsExport {
        var (state, loaded) = try await parts.loadStateAndManifests()
        try parts.stopOnErrors(loaded)
        // Audiences with no FCM group behind them have nothing to export.
        var wanted = Set(loaded.desired.groups.map(\.name)).union(
            state.groups.filter { !$0.value.audience || $0.value.key != nil }.keys)
        wanted.formUnion(names)
        guard !wanted.isEmpty else { throw WorkflowError.nothingToExport }
        let inventory = loaded.inventory
        var groups: [GroupsExport.Group] = []
        for name in wanted.sorted() {
            var key = state.groups[name]?.key
            var tokens: [String]? = nil
            if let known = key { tokens = try await parts.backend.exportGroup(name: name, key: known) }
            if tokens == nil {
                // Not known, or the key state remembers no longer names it: look the group up by name.
                key = try await parts.backend.groupKey(name: name)
                if let found = key { tokens = try await parts.backend.exportGroup(name: name, key: found) }
            }
            let managed = state.groups[name]?.members ?? TokenSet()
            let members = (tokens ?? []).map { token -> GroupsExport.Member in
                let device =
                    inventory.index(ofToken: token).map { inventory.deviceIDs[$0] }
                    ?? state.tokens.id(token).flatMap { state.deviceID(of: $0) }
                return GroupsExport.Member(token: token, deviceID: device)
            }
            let foreign = (tokens ?? []).filter { token in
                state.tokens.id(token).map { !managed.contains($0) } ?? true
            }.count
            groups.append(
                GroupsExport.Group(
                    name: name, notificationKey: tokens == nil ? nil : key, members: members,
                    notAddedByTidemark: foreign))
        }
        var export = GroupsExport(groups: groups, exportedAt: parts.timing.wallClock())
        guard groups.contains(where: { $0.notificationKey != nil }) else { return export }
        let before = state
        let now = parts.timing.unixTime()
        for group in groups {
            guard let key = group.notificationKey else { continue }
            state.recordExport(group: group.name, key: key, members: group.members.map(\.token), at: now)
        }
        parts.claim(&state)
        var write = StateWrite()
        write.includeTopicsAndGroups(before: before, after: state)
        export.serial = try await parts.store.save(&state, write, at: now)
        return export
    }
}

extension GroupsExport {
    /// One line per token: NDJSON (group, notification_key, device_id, token), or CSV with a header.
    public func file(csv: Bool) -> Data {
        var out = ""
        if csv { out = "group,notification_key,device_id,token\n" }
        func field(_ text: String) -> String {
            text.contains(where: { ",\"\n\r".contains($0) })
                ? "\"" + text.replacingOccurrences(of: "\"", with: "\"\"") + "\"" : text
        }
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        struct Line: Encodable {
            var group: String
            var notificationKey: String
            var deviceId: String?
            var token: String

            enum CodingKeys: String, CodingKey {
                case group, token
                case notificationKey = "notification_key"
                case deviceId = "device_id"
            }
        }
        for group in groups {
            guard let key = group.notificationKey else { continue }
            for member in group.members {
                if csv {
                    out +=
                        [group.name, key, member.deviceID ?? "", member.token].map(field).joined(separator: ",") + "\n"
                } else if let data = try? encoder.encode(
                    Line(group: group.name, notificationKey: key, deviceId: member.deviceID, token: member.token))
                {
                    out += String(decoding: data, as: UTF8.self) + "\n"
                }
            }
        }
        return Data(out.utf8)
    }
}
