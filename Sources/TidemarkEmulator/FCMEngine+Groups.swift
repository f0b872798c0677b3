import Foundation
import TidemarkCore

/// Device groups (reference §2): at most 20 members, invalid tokens dropped on create, deleted when
/// emptied, and every key alias ever issued stays valid.
extension FCMEngine {
    private func newKey() -> String {
        keyCounter &+= 1
        var generator = timing.generator
        let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
        let body = String((0..<134).map { _ in alphabet[Int(generator.next() % 64)] })
        return "APA91b" + body
    }

    private func validMembers(_ tokens: [String], project: String) -> [String] {
        var ignored: [EngineChange] = []
        var seen = Set<String>()
        return tokens.filter { token in
            guard seen.insert(token).inserted else { return false }
            if case .success = liveRegistration(token, project: project, create: false, changes: &ignored) {
                return true
            }
            return false
        }
    }

    /// `create`: invalid tokens are dropped; the name must be new.
    public func createGroup(project: String, name: String, tokens: [String]) throws -> String {
        let id = GroupID(project: project, name: name)
        guard groups[id] == nil else { throw GroupError(.alreadyExists) }
        let members = validMembers(tokens, project: project)
        guard !members.isEmpty else { throw GroupError(.noValidRegistrationIDs) }
        guard members.count <= configuration.maxGroupMembers else { throw GroupError(.tooManyMembers) }
        let key = newKey()
        groups[id] = Group(members: members, keys: [key])
        groupByKey[key] = id
        try persistGroup(id)
        return key
    }

    private func group(forKey key: String, name: String?, project: String) throws -> GroupID {
        guard let id = groupByKey[key], id.project == project, groups[id] != nil else { throw GroupError(.notFound) }
        if let name, name != id.name { throw GroupError(.nameMismatch) }
        return id
    }

    /// `add`: returns the key used.
    public func addToGroup(project: String, name: String?, key: String, tokens: [String]) throws -> String {
        let id = try group(forKey: key, name: name, project: project)
        let members = validMembers(tokens, project: project)
        guard !members.isEmpty else { throw GroupError(.noValidRegistrationIDs) }
        var group = groups[id]!
        let merged = group.members + members.filter { !group.members.contains($0) }
        guard merged.count <= configuration.maxGroupMembers else { throw GroupError(.tooManyMembers) }
        group.members = merged
        groups[id] = group
        try persistGroup(id)
        return key
    }

    /// `remove`: removing the last member deletes the group and all its keys.
    public func removeFromGroup(project: String, name: String?, key: String, tokens: [String]) throws -> String {
        let id = try group(forKey: key, name: name, project: project)
        guard !tokens.isEmpty else { throw GroupError(.noValidRegistrationIDs) }
        var group = groups[id]!
        let removing = Set(tokens)
        group.members.removeAll { removing.contains($0) }
        if group.members.isEmpty {
            groups[id] = nil
            for key in group.keys { groupByKey[key] = nil }
        } else {
            groups[id] = group
        }
        try persistGroup(id)
        return key
    }

    /// Key look-up by name: each call may issue a new alias; all stay valid.
    public func groupKey(project: String, name: String) throws -> String {
        let id = GroupID(project: project, name: name)
        guard var group = groups[id] else { throw GroupError(.notFound) }
        let key = newKey()
        group.keys.append(key)
        groups[id] = group
        groupByKey[key] = id
        try persistGroup(id)
        return key
    }

    /// The members of a group, which real FCM cannot list.
    public func groupMembers(project: String, name: String) -> [String]? {
        groups[GroupID(project: project, name: name)]?.members
    }

    /// The members of the group that `key` (any alias) names, or nil.
    public func groupMembers(project: String, key: String) -> [String]? {
        guard let id = groupByKey[key], id.project == project else { return nil }
        return groups[id]?.members
    }

    /// Every group of a project: name, members, and how many key aliases were issued.
    public func groups(project: String) -> [(name: String, members: [String], keys: Int)] {
        groups.filter { $0.key.project == project }.map { ($0.key.name, $0.value.members, $0.value.keys.count) }
            .sorted { $0.name < $1.name }
    }

    /// Deletes a group outright (admin API; how a group "vanishes" in drift rehearsals).
    public func deleteGroup(project: String, name: String) throws -> Bool {
        let id = GroupID(project: project, name: name)
        guard let group = groups.removeValue(forKey: id) else { return false }
        for key in group.keys { groupByKey[key] = nil }
        try persistGroup(id)
        return true
    }

    private func persistGroup(_ id: GroupID) throws {
        if let group = groups[id] {
            try store?.persist([.group(project: id.project, name: id.name, members: group.members, keys: group.keys)])
        } else {
            try store?.persist([.deleteGroup(project: id.project, name: id.name)])
        }
    }
}
