import Foundation
import TidemarkCore

/// `POST /v1/projects/P/messages:send` (reference §3): validation, targeting, recorded deliveries.
extension FCMEmulator {
    private func invalid(_ message: String, field: String? = nil) -> WireResponse {
        let details: [FCMWire.ErrorDetail] = field.map { [.badRequest(field: $0, message)] } ?? []
        return .status(400, "INVALID_ARGUMENT", message, fcmErrorCode: "INVALID_ARGUMENT", details: details)
    }

    func send(_ request: WireRequest, project: String) async -> WireResponse {
        guard let body = jsonBody(request) else { return invalid("The request body is not a JSON object.") }
        guard let message = body["message"] as? [String: Any] else {
            return invalid("The request has no message object.", field: "message")
        }
        let validateOnly = (body["validate_only"] as? Bool) ?? (body["validateOnly"] as? Bool) ?? false
        let targets = ["token", "topic", "condition", "fid"].filter { message[$0] != nil }
        guard targets.count == 1, let kind = targets.first else {
            return invalid(
                "Exactly one of message.token, message.topic or message.condition must be set; found \(targets.isEmpty ? "none" : targets.joined(separator: ", ")).",
                field: "message")
        }
        guard let target = message[kind] as? String, !target.isEmpty else {
            return invalid("message.\(kind) must be a non-empty string.", field: "message.\(kind)")
        }
        if let data = message["data"] {
            guard let map = data as? [String: Any], map.values.allSatisfy({ $0 is String }) else {
                return invalid("message.data must map strings to strings.", field: "message.data")
            }
        }
        let payload = JSONWriter.data(message)
        let limit = kind == "token" || kind == "fid" ? 4096 : 2048
        if payload.count > limit {
            return invalid(
                "The message is \(payload.count) bytes; a \(kind) message may carry at most \(limit).",
                field: "message")
        }

        let recipients: [String]
        switch kind {
        case "topic":
            let topic = target.hasPrefix("/topics/") ? String(target.dropFirst(8)) : target
            if let problem = FCMLimits.topicNameProblem(topic) {
                return invalid("Invalid topic name '\(topic)': \(problem).", field: "message.topic")
            }
            recipients = await engine.subscribers(of: topic, project: project)
        case "condition":
            do {
                let condition = try FCMCondition.parse(target)
                recipients = await engine.recipients(project: project, condition: condition)
            } catch {
                return invalid("\(error)", field: "message.condition")
            }
        default:
            if let members = await engine.groupMembers(project: project, key: target) {
                recipients = members
            } else if FCMLimits.tokenProblem(target) != nil {
                return invalid("The registration token is not a valid FCM registration token", field: "message.\(kind)")
            } else if let registration = await engine.registration(target), !registration.unregistered {
                guard registration.project == project else {
                    return .status(403, "PERMISSION_DENIED", "SenderId mismatch", fcmErrorCode: "SENDER_ID_MISMATCH")
                }
                recipients = [target]
            } else {
                return .status(404, "NOT_FOUND", "Requested entity was not found.", fcmErrorCode: "UNREGISTERED")
            }
        }
        if validateOnly {
            return .encoded(200, FCMWire.SendResponse(name: "projects/\(project)/messages/fake_message_id"))
        }
        let name = deliveries.record(
            project: project, targetKind: kind == "fid" ? "token" : kind, target: target,
            recipients: recipients, message: String(decoding: payload, as: UTF8.self), at: timing.wallClock())
        return .encoded(200, FCMWire.SendResponse(name: name))
    }
}
