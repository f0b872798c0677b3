import Foundation
import NIOHTTP1
import TidemarkCore

/// Device groups over `/fcm/notification` (reference §2).
extension FCMHTTPBackend {
    var groupsURL: String { "\(endpoints.fcm)/fcm/notification" }

    func groupCall(_ request: FCMWire.GroupRequest) async throws -> Answer {
        try await call(.POST, groupsURL, body: FCMWire.encode(request), groupHeaders: true)
    }

    func groupFailure(_ answer: Answer, _ what: String) -> Error {
        if let text = answer.code, let kind = GroupError.Kind(rawValue: text) { return GroupError(kind) }
        return FCMCallError(
            status: answer.status,
            message: "\(what) failed: HTTP \(answer.status) \(QuotedAnswer.safe(answer.code ?? "")).")
    }

    /// The key of group `name` (the IID look-up, read-limited), or nil when FCM knows no such group.
    public func groupKey(name: String) async throws -> String? {
        try await options.readLimiter?.acquire()
        let answer = try await call(.GET, groupsURL + "?notification_key_name=\(Self.encode(name))", groupHeaders: true)
        if answer.status == 200, let key = answer.decode(FCMWire.GroupKey.self)?.notificationKey { return key }
        if answer.code == GroupError.Kind.notFound.rawValue { return nil }
        throw groupFailure(answer, "Looking up device group '\(name)'")
    }

    /// FCM's export call: a group's tokens by its key. Its exact shape is not in FCM's stored docs
    /// (reference §9): by default a GET of `/fcm/notification?notification_key=KEY` with the group
    /// headers, answering the tokens in `registration_ids`; `group_export` in tidemark.yaml changes
    /// the query parameter and the field. An answer without that field fails loudly: it is never
    /// read as an empty group.
    public func exportGroup(name: String, key: String) async throws -> [String]? {
        try await options.readLimiter?.acquire()
        let export = options.groupExport
        let answer = try await call(.GET, groupsURL + "?\(export.query)=\(Self.encode(key))", groupHeaders: true)
        if answer.status == 200 {
            let object = try? JSONSerialization.jsonObject(with: answer.body) as? [String: Any]
            guard let tokens = object?[export.field] as? [String] else {
                throw FCMCallError(
                    status: answer.status,
                    message:
                        "Exporting device group '\(name)': FCM's answer has no '\(export.field)' list of tokens; if FCM names it otherwise, set group_export: {field: …} in tidemark.yaml."
                )
            }
            return tokens
        }
        if answer.code == GroupError.Kind.notFound.rawValue { return nil }
        throw groupFailure(answer, "Exporting device group '\(name)'")
    }

    /// Creates the group. A taken name is `GroupError(.alreadyExists)`: the executor adopts the group by look-up.
    public func createGroup(name: String, tokens: [String]) async throws -> String {
        let answer = try await groupCall(FCMWire.GroupRequest(operation: .create, name: name, tokens: tokens))
        if answer.status == 200, let key = answer.decode(FCMWire.GroupKey.self)?.notificationKey { return key }
        throw groupFailure(answer, "Creating device group '\(name)'")
    }

    /// Adds members. A group that vanished is `GroupError(.notFound)`: the executor creates it again.
    public func addToGroup(name: String, key: String, tokens: [String]) async throws -> String {
        let answer = try await groupCall(FCMWire.GroupRequest(operation: .add, name: name, key: key, tokens: tokens))
        if answer.status == 200 { return answer.decode(FCMWire.GroupKey.self)?.notificationKey ?? key }
        throw groupFailure(answer, "Adding to device group '\(name)'")
    }

    /// Removes members; a group that is already gone is `GroupError(.notFound)`, which the executor counts as done.
    public func removeFromGroup(name: String, key: String, tokens: [String]) async throws {
        let answer = try await groupCall(FCMWire.GroupRequest(operation: .remove, name: name, key: key, tokens: tokens))
        if answer.status == 200 { return }
        throw groupFailure(answer, "Removing from device group '\(name)'")
    }
}
