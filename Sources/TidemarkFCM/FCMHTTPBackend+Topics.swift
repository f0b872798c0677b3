import Foundation
import NIOHTTP1
import TidemarkCore

/// Topic subscriptions and refresh, over either transport.
extension FCMHTTPBackend {
    func registrationsURL(_ token: String) -> String {
        "\(endpoints.fcm)/v1/projects/\(Self.encode(project))/registrations/\(Self.encode(token))/topicSubscriptions"
    }

    /// The per-token outcome of a call FCM answered with `answer`.
    static func outcome(_ answer: Answer, success: Set<Int> = [200]) -> TokenOutcome {
        if success.contains(answer.status) { return .ok }
        switch (answer.status, answer.code) {
        case (_, let code?) where TokenError.Code(code) == .tooManyTopics: return .failed(.tooManyTopics)
        case (404, _): return .failed(.notFound)
        case (400, _): return .failed(.invalidArgument)
        case (429, _): return .failed(.resourceExhausted)
        case (500, _): return .failed(.internalError)
        case (503, _), (502, _), (504, _): return .failed(.unavailable)
        case (let status, let code): return .failed(TokenError(code ?? "HTTP_\(status)"))
        }
    }

    public func subscribe(topic: String, tokens: [String]) async throws -> [TokenOutcome] {
        switch transport {
        case .v1:
            return try await forEachConcurrently(tokens.count) { i in
                let url = registrationsURL(tokens[i]) + "?topic_name=\(Self.encode(topic))"
                // 409 ALREADY_EXISTS: already subscribed, which is what we wanted.
                return Self.outcome(
                    try await call(.POST, url, body: Data("{}".utf8), changes: 1, successBody: false),
                    success: [200, 409])
            }
        case .iid:
            return try await batch("v1:batchAdd", topic: topic, tokens: tokens)
        }
    }

    public func unsubscribe(topic: String, tokens: [String]) async throws -> [TokenOutcome] {
        switch transport {
        case .v1:
            return try await forEachConcurrently(tokens.count) { i in
                let url = registrationsURL(tokens[i]) + "/\(Self.encode(topic))?allow_missing=true"
                return Self.outcome(try await call(.DELETE, url, changes: 1, successBody: false))
            }
        case .iid:
            return try await batch("v1:batchRemove", topic: topic, tokens: tokens)
        }
    }

    /// One IID batch call; a whole-request failure that retries could not fix fails every token alike.
    func batch(_ operation: String, topic: String, tokens: [String]) async throws -> [TokenOutcome] {
        let body = FCMWire.encode(FCMWire.IIDBatchRequest(topic: topic, tokens: tokens))
        let answer = try await call(
            .POST, "\(endpoints.iid)/iid/\(operation)", body: body, changes: tokens.count,
            iidHeaders: true)
        guard answer.status == 200 else {
            if answer.status == 400 || answer.status == 401 || answer.status == 403 {
                throw FCMCallError(
                    status: answer.status,
                    message:
                        "IID \(operation) for topic '\(topic)' was refused: HTTP \(answer.status) \(answer.code ?? "")."
                )
            }
            return Array(repeating: Self.outcome(answer), count: tokens.count)
        }
        guard let results = answer.decode(FCMWire.IIDBatchResponse.self)?.results, results.count == tokens.count else {
            throw FCMCallError(status: 200, message: "IID \(operation) answered without one result per token.")
        }
        return results.map { result in
            guard let code = result.error else { return .ok }
            return .failed(TokenError(code))
        }
    }

    /// One read per registration; a read that fails is an error, never "no subscriptions".
    public func refresh(_ tokens: [String]) async throws -> [RegistrationStatus] {
        try await forEachConcurrently(tokens.count) { i in
            switch transport {
            case .v1: try await listTopics(tokens[i])
            case .iid: try await infoTopics(tokens[i])
            }
        }
    }

    func listTopics(_ token: String) async throws -> RegistrationStatus {
        var topics: [String] = []
        var pageToken: String?
        repeat {
            var url = registrationsURL(token) + "?pageSize=2000"
            if let pageToken { url += "&pageToken=\(Self.encode(pageToken))" }
            let answer = try await call(.GET, url)
            if answer.status == 404 { return .notFound }
            guard answer.status == 200 else {
                throw FCMCallError(
                    status: answer.status,
                    message:
                        "Listing the topics of \(Redaction.redact(token)) failed: HTTP \(answer.status) \(answer.code ?? "")."
                )
            }
            guard let page = answer.decode(FCMWire.TopicSubscriptionPage.self) else {
                throw FCMCallError(
                    status: 200,
                    message:
                        "Listing the topics of \(Redaction.redact(token)) answered 200 without a list of topic subscriptions."
                )
            }
            topics += page.topicSubscriptions.map(\.topicName)
            pageToken = page.nextPageToken
        } while pageToken != nil
        return .active(topics: topics.sorted())
    }

    func infoTopics(_ token: String) async throws -> RegistrationStatus {
        let answer = try await call(
            .GET, "\(endpoints.iid)/iid/info/\(Self.encode(token))?details=true", iidHeaders: true)
        if answer.status == 404 { return .notFound }
        guard answer.status == 200 else {
            throw FCMCallError(
                status: answer.status,
                message:
                    "Reading \(Redaction.redact(token)) from iid/info failed: HTTP \(answer.status) \(answer.code ?? "")."
            )
        }
        guard let info = answer.decode(FCMWire.IIDInfo.self) else {
            throw FCMCallError(
                status: 200,
                message:
                    "Reading \(Redaction.redact(token)) from iid/info answered 200 with a body that is not an instance's info."
            )
        }
        return .active(topics: (info.rel?.topics.keys).map { $0.sorted() } ?? [])
    }
}
