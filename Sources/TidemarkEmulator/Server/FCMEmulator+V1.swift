import Foundation
import TidemarkCore

/// The v1 topic subscription API (reference §8) and the v1 send entry point.
extension FCMEmulator {
    func v1(
        _ route: FCMRoute.V1, project named: String, _ request: WireRequest, grant: AccessTokenAuthority.Grant
    )
        async -> WireResponse
    {
        if let denied = checkProject(named, grant: grant) { return denied }
        // The URL may name the project by number; the engine knows it by ID.
        let project = grant.project
        switch route {
        case .send: return await send(request, project: project)
        case .createSubscription(let registration):
            return await createSubscription(request, project: project, registration: registration)
        case .listSubscriptions(let registration):
            return await listSubscriptions(request, project: project, registration: registration)
        case .getSubscription(let registration, let topic):
            return await getSubscription(project: project, registration: registration, topic: topic)
        case .deleteSubscription(let registration, let topic):
            return await deleteSubscription(request, project: project, registration: registration, topic: topic)
        case .patchSubscription(let registration, let topic):
            return await patchSubscription(request, project: project, registration: registration, topic: topic)
        case .methodNotFound: return methodNotFound(request)
        case .notFound: return notFound(request)
        }
    }

    private func subscription(
        project: String, registration: String, topic: String, since: Date
    )
        -> FCMWire.TopicSubscription
    {
        FCMWire.TopicSubscription(
            name: "projects/\(project)/registrations/\(registration)/topicSubscriptions/\(topic)", topicName: topic,
            createTime: RFC3339.timestamp(since))
    }

    /// A subscription as the answer to a create: the emulator's hottest path, so written by the hand
    /// writer (scripts/bench-emulator.sh) with the keys of `FCMWire.TopicSubscription`.
    private func createdSubscription(project: String, registration: String, topic: String, since: Date) -> WireResponse
    {
        let value = subscription(project: project, registration: registration, topic: topic, since: since)
        return .json(
            200, ["name": value.name ?? "", "topic_name": value.topicName, "create_time": value.createTime ?? ""])
    }

    private func topicProblem(_ topic: String) -> WireResponse? {
        guard let problem = FCMLimits.topicNameProblem(topic) else { return nil }
        return .status(
            400, "INVALID_ARGUMENT",
            "Invalid topic name '\(topic)': \(problem); topic names match [a-zA-Z0-9-_.~%]{1,900}.",
            details: [.badRequest(field: "topic_name", problem)])
    }

    /// Maps an engine failure on one registration to the v1 error answer.
    private func v1Error(_ error: Error) -> WireResponse {
        guard let error = error as? EngineError else {
            return .status(500, "INTERNAL", "Internal error encountered.")
        }
        switch error.code {
        case .alreadyExists:
            return .status(409, "ALREADY_EXISTS", "Requested entity already exists")
        case .notFound:
            return .status(404, "NOT_FOUND", "Requested entity was not found.")
        case .tooManyTopics:
            return .status(
                400, "FAILED_PRECONDITION",
                "The registration is already subscribed to \(engine.configuration.maxTopicsPerToken) topics, the most FCM allows.",
                fcmErrorCode: "TOO_MANY_TOPICS")
        case .invalidArgument, .invalidTopicName, .missingTokens, .tooManyTokens:
            return .status(400, "INVALID_ARGUMENT", "The registration token is not a valid FCM registration token")
        case .permissionDenied:
            return .status(403, "PERMISSION_DENIED", "The registration belongs to another project.")
        case .resourceExhausted:
            return .status(
                429, "RESOURCE_EXHAUSTED", "Quota exceeded for subscription changes.", fcmErrorCode: "QUOTA_EXCEEDED")
        case .unavailable:
            return .status(503, "UNAVAILABLE", "The service is currently unavailable.")
        case .internalError:
            return .status(500, "INTERNAL", "Internal error encountered.")
        }
    }

    func createSubscription(_ request: WireRequest, project: String, registration: String) async -> WireResponse {
        guard let topic = request.queryValue("topic_name", "topicName"), !topic.isEmpty else {
            return .status(
                400, "INVALID_ARGUMENT", "topic_name is required: POST …/topicSubscriptions?topic_name=TOPIC.")
        }
        if let problem = topicProblem(topic) { return problem }
        if let refused = admitSingleChange(
            project: project, surface: .v1, subscribe: true, topic: topic,
            token: registration)
        {
            return refused
        }
        do {
            let since = try await engine.createSubscription(project: project, registration: registration, topic: topic)
            return createdSubscription(project: project, registration: registration, topic: topic, since: since)
        } catch {
            return v1Error(error)
        }
    }

    func deleteSubscription(
        _ request: WireRequest, project: String, registration: String, topic: String
    ) async
        -> WireResponse
    {
        if let problem = topicProblem(topic) { return problem }
        if let refused = admitSingleChange(
            project: project, surface: .v1, subscribe: false, topic: topic,
            token: registration)
        {
            return refused
        }
        do {
            try await engine.deleteSubscription(
                project: project, registration: registration, topic: topic,
                allowMissing: request.queryFlag("allow_missing", "allowMissing"))
            return .json(200, [String: Any]())
        } catch {
            return v1Error(error)
        }
    }

    func getSubscription(project: String, registration: String, topic: String) async -> WireResponse {
        if let problem = topicProblem(topic) { return problem }
        do {
            let since = try await engine.subscription(project: project, registration: registration, topic: topic)
            return .encoded(200, subscription(project: project, registration: registration, topic: topic, since: since))
        } catch {
            return v1Error(error)
        }
    }

    /// PATCH is an upsert with `allow_missing`; without it, a missing subscription is NOT_FOUND.
    func patchSubscription(
        _ request: WireRequest, project: String, registration: String, topic: String
    ) async
        -> WireResponse
    {
        if let problem = topicProblem(topic) { return problem }
        if request.queryFlag("allow_missing", "allowMissing") {
            if let refused = admitSingleChange(
                project: project, surface: .v1, subscribe: true, topic: topic,
                token: registration)
            {
                return refused
            }
            do {
                let since = try await engine.createSubscription(
                    project: project, registration: registration, topic: topic)
                return createdSubscription(project: project, registration: registration, topic: topic, since: since)
            } catch let error as EngineError where error.code == .alreadyExists {
                // Already there: return it as it is.
            } catch {
                return v1Error(error)
            }
        }
        return await getSubscription(project: project, registration: registration, topic: topic)
    }

    /// List: sorted by topic; `pageSize` defaults to 1000 and is capped at 2000; the page token is opaque.
    func listSubscriptions(_ request: WireRequest, project: String, registration: String) async -> WireResponse {
        var pageSize = 1000
        if let text = request.queryValue("page_size", "pageSize") {
            guard let value = Int(text), value >= 0 else {
                return .status(400, "INVALID_ARGUMENT", "page_size must be a non-negative integer, not '\(text)'.")
            }
            pageSize = value == 0 ? 1000 : min(value, FCMLimits.maxTopicsPerToken)
        }
        var after: String?
        if let token = request.queryValue("page_token", "pageToken"), !token.isEmpty {
            guard let data = Data(base64Encoded: token), let decoded = String(data: data, encoding: .utf8),
                decoded.hasPrefix("after:")
            else { return .status(400, "INVALID_ARGUMENT", "The page token is not one this server issued.") }
            after = String(decoded.dropFirst(6))
        }
        guard let topics = await engine.topics(of: registration, project: project) else {
            return .status(404, "NOT_FOUND", "Requested entity was not found.")
        }
        let remaining = after.map { last in topics.drop { $0.topic <= last } } ?? topics[...]
        let page = remaining.prefix(pageSize)
        let list = FCMWire.TopicSubscriptionPage(
            topicSubscriptions: page.map {
                subscription(project: project, registration: registration, topic: $0.topic, since: $0.since)
            },
            nextPageToken: remaining.count > page.count
                ? page.last.map { Data("after:\($0.topic)".utf8).base64EncodedString() } : nil)
        return .encoded(200, list)
    }
}
