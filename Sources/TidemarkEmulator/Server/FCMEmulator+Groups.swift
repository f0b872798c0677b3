import Foundation
import TidemarkCore

/// Device groups: `POST /fcm/notification` (create / add / remove) and the key look-up (reference §2).
extension FCMEmulator {
    func groups(_ request: WireRequest, grant: AccessTokenAuthority.Grant) async -> WireResponse {
        let project = grant.project
        guard let sender = request.headers["project_id"], !sender.isEmpty else {
            return .flatError(400, "project_id header is missing: send the project's sender ID (project number)")
        }
        guard sender == project || sender == Self.projectNumber(of: project) else {
            return .flatError(403, "SENDER_ID_MISMATCH")
        }
        if control.groupsTurnedDown {
            // Turned down on 29 September 2027, the call that lists a group's tokens with them.
            return .html(404, title: "Not Found")
        }
        switch request.method {
        case "GET":
            // The export call (unconfirmed shape, reference §9): a group's tokens by its key.
            if let key = request.queryValue("notification_key"), !key.isEmpty {
                guard let members = await engine.groupMembers(project: project, key: key) else {
                    return .flatError(400, GroupError.Kind.notFound.rawValue)
                }
                return .json(200, ["notification_key": key, "registration_ids": members])
            }
            guard let name = request.queryValue("notification_key_name"), !name.isEmpty else {
                return .flatError(400, "notification_key_name is required")
            }
            do {
                return .encoded(200, FCMWire.GroupKey(try await engine.groupKey(project: project, name: name)))
            } catch {
                return groupError(error)
            }
        case "POST":
            return await groupOperation(request, project: project)
        default:
            return .flatError(404, "Not Found")
        }
    }

    private func groupError(_ error: Error) -> WireResponse {
        guard let error = error as? GroupError else { return .flatError(500, "INTERNAL") }
        return .flatError(400, error.kind.rawValue)
    }

    private func groupOperation(_ request: WireRequest, project: String) async -> WireResponse {
        guard let body = jsonBody(request) else { return .flatError(400, "InvalidJson") }
        guard let operation = body["operation"] as? String else { return .flatError(400, "operation is required") }
        let name = body["notification_key_name"] as? String
        let key = body["notification_key"] as? String
        let tokens = (body["registration_ids"] as? [Any])?.compactMap { $0 as? String } ?? []
        do {
            switch operation.lowercased() {
            case "create":
                guard let name, !name.isEmpty else { return .flatError(400, "notification_key_name is required") }
                guard control.mayCreateGroups(project: project) else {
                    return .flatError(
                        403,
                        "Device groups are not available to projects created on or after 1 December 2026; send to each token (sendEachForMulticast) or use topics."
                    )
                }
                guard !tokens.isEmpty else { return .flatError(400, GroupError.Kind.noValidRegistrationIDs.rawValue) }
                let key = try await engine.createGroup(project: project, name: name, tokens: tokens)
                return .encoded(200, FCMWire.GroupKey(key))
            case "add", "remove":
                guard let key, !key.isEmpty else { return .flatError(400, GroupError.Kind.notFound.rawValue) }
                guard !tokens.isEmpty else { return .flatError(400, GroupError.Kind.noValidRegistrationIDs.rawValue) }
                let used =
                    operation.lowercased() == "add"
                    ? try await engine.addToGroup(project: project, name: name, key: key, tokens: tokens)
                    : try await engine.removeFromGroup(project: project, name: name, key: key, tokens: tokens)
                return .encoded(200, FCMWire.GroupKey(used))
            default:
                return .flatError(400, "invalid operation '\(operation)'; use create, add or remove")
            }
        } catch {
            return groupError(error)
        }
    }
}
