import Foundation
import NIOHTTP1
import TidemarkCore

/// `v1/projects/P/messages:send` (reference §3), used to check a message's targeting with
/// `validate_only` before anything is delivered.
extension FCMHTTPBackend {
    /// Who a message goes to: exactly one target, as FCM requires.
    public enum SendTarget: Sendable, Equatable {
        case token(String)
        case topic(String)
        case condition(String)
    }

    /// A failed send, with FCM's error code (`FcmError.errorCode`, else `status`).
    public struct SendError: RetryableError, TidemarkError, Equatable {
        /// `fcm_send_refused`.
        public var reason: FailureReason { "fcm_send_refused" }

        /// The HTTP status.
        public var status: Int
        /// FCM's error code.
        public var code: String
        /// FCM's message.
        public var message: String
        /// Never retried: retries already ran.
        public var isRetryable: Bool { false }
        /// "FCM refused the message: HTTP STATUS CODE: MESSAGE".
        public var description: String { "FCM refused the message: HTTP \(status) \(code): \(message)" }
    }

    /// Sends (or with `validateOnly`, only validates) a notification; returns the message name.
    public func send(
        to target: SendTarget, title: String? = nil, body: String? = nil, data: [String: String] = [:],
        validateOnly: Bool
    ) async throws -> String {
        var message = FCMWire.Message(data: data.isEmpty ? nil : data)
        switch target {
        case .token(let token): message.token = token
        case .topic(let topic): message.topic = topic
        case .condition(let condition): message.condition = condition
        }
        if title != nil || body != nil { message.notification = FCMWire.Notification(title: title, body: body) }
        let payload = FCMWire.encode(FCMWire.SendRequest(message: message, validateOnly: validateOnly))
        let answer = try await call(
            .POST, "\(endpoints.fcm)/v1/projects/\(Self.encode(project))/messages:send",
            body: payload)
        if answer.status == 200, let name = answer.decode(FCMWire.SendResponse.self)?.name { return name }
        let error = answer.rpcStatus
        throw SendError(
            status: answer.status, code: answer.code ?? "HTTP_\(answer.status)",
            message: QuotedAnswer.safe(error?.message ?? ""))
    }
}
