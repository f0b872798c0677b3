import Foundation
import TidemarkCore

/// The deprecated Instance ID server API (reference §1): batches, the single relation, token info.
extension FCMEmulator {
    func iid(_ route: FCMRoute.IID, _ request: WireRequest, grant: AccessTokenAuthority.Grant) async -> WireResponse {
        let project = grant.project
        if control.iidTurnedDown {
            // Google's front end answers a turned-down API with an HTML page, not JSON.
            return .html(404, title: "Not Found")
        }
        guard control.isIIDEnabled(project: project) else {
            return .flatError(
                403,
                "The Instance ID server API is not enabled for project \(project); use the FCM topic subscription API (v1)."
            )
        }
        switch route {
        case .batchAdd: return await batch(request, project: project, add: true)
        case .batchRemove: return await batch(request, project: project, add: false)
        case .relation(let token, let topic, let add):
            return await relation(token: token, topic: topic, project: project, add: add)
        case .info(let token): return await info(token: token, project: project, details: request.queryFlag("details"))
        case .notFound: return .flatError(404, "Not Found")
        }
    }

    private func batch(_ request: WireRequest, project: String, add: Bool) async -> WireResponse {
        guard let body = jsonBody(request) else { return .flatError(400, "InvalidJson") }
        guard let to = body["to"] as? String, to.hasPrefix("/topics/") else {
            return .flatError(400, "Topic name format is invalid")
        }
        var topic = String(to.dropFirst(8))
        if topic.hasPrefix("private/") { topic = String(topic.dropFirst(8)) }
        guard FCMLimits.topicNameProblem(topic) == nil else { return .flatError(400, "Topic name format is invalid") }
        let tokens: [String]
        if let strings = body["registration_tokens"] as? [String] {
            tokens = strings
        } else if let raw = body["registration_tokens"] as? [Any], !raw.isEmpty {
            return .flatError(400, "InvalidToken")
        } else {
            tokens = []
        }
        guard !tokens.isEmpty else { return .flatError(400, "MissingIIdToken") }
        guard tokens.count <= engine.configuration.maxBatchTokens else {
            return .flatError(400, "TooManyTokens")
        }
        if let limited = rateLimited(project: project, tokens: tokens.count, surface: .iid) {
            guard control.rateLimit.answer == .perToken else { return limited }
            return .encoded(
                200,
                FCMWire.IIDBatchResponse(results: tokens.map { _ in FCMWire.IIDResult(error: "RESOURCE_EXHAUSTED") }))
        }
        // Tokens drawn for an injected INTERNAL are left out of the call and answered INTERNAL.
        var failing = Set<Int>()
        for index in tokens.indices where control.drawTokenFault() { failing.insert(index) }
        if !failing.isEmpty { traffic.count { $0.faults += 1 } }
        let passed = tokens.indices.filter { !failing.contains($0) }.map { tokens[$0] }
        if !passed.isEmpty {
            traffic.recordChange(
                project: project, operation: add ? "subscribe" : "unsubscribe", topic: topic,
                tokens: passed, api: "iid")
        }
        let outcomes: [TokenOutcome]
        do {
            if passed.isEmpty {
                outcomes = []
            } else if add {
                outcomes = try await engine.batchAdd(project: project, topic: topic, tokens: passed)
            } else {
                outcomes = try await engine.batchRemove(project: project, topic: topic, tokens: passed)
            }
        } catch let error as EngineError {
            return .flatError(400, error.code.rawValue)
        } catch {
            return .flatError(500, "INTERNAL")
        }
        var results: [FCMWire.IIDResult] = []
        results.reserveCapacity(tokens.count)
        var next = outcomes.makeIterator()
        for index in tokens.indices {
            if failing.contains(index) {
                results.append(FCMWire.IIDResult(error: "INTERNAL"))
            } else if case .failed(let error)? = next.next() {
                results.append(FCMWire.IIDResult(error: error.code.rawValue))
            } else {
                results.append(FCMWire.IIDResult())
            }
        }
        return .encoded(200, FCMWire.IIDBatchResponse(results: results))
    }

    private func relation(token: String, topic: String, project: String, add: Bool) async -> WireResponse {
        let bare = topic.hasPrefix("/topics/") ? String(topic.dropFirst(8)) : topic
        guard FCMLimits.topicNameProblem(bare) == nil else { return .flatError(400, "Topic name format is invalid") }
        guard FCMLimits.tokenProblem(token) == nil else { return .flatError(400, "InvalidToken") }
        if let refused = admitSingleChange(project: project, surface: .iid, subscribe: add, topic: bare, token: token) {
            return refused
        }
        do {
            let outcome =
                add
                ? try await engine.batchAdd(project: project, topic: bare, tokens: [token])[0]
                : try await engine.batchRemove(project: project, topic: bare, tokens: [token])[0]
            switch outcome {
            case .ok: return .json(200, [String: Any]())
            case .failed(let error) where error == .notFound: return .flatError(404, "NOT_FOUND")
            case .failed(let error) where error == .invalidArgument: return .flatError(400, "INVALID_ARGUMENT")
            case .failed(let error): return .flatError(400, error.code.rawValue)
            }
        } catch let error as EngineError {
            return .flatError(400, error.code.rawValue)
        } catch {
            return .flatError(500, "INTERNAL")
        }
    }

    private func info(token: String, project: String, details: Bool) async -> WireResponse {
        guard FCMLimits.tokenProblem(token) == nil else { return .flatError(400, "InvalidToken") }
        guard let registration = await engine.registration(token), !registration.unregistered else {
            // With auto-registration every well-formed token is an app instance, as v1 reads see it.
            if await engine.registration(token) == nil, await engine.topics(of: token, project: project) != nil {
                return .encoded(
                    200,
                    FCMWire.IIDInfo(
                        application: "com.example.app", authorizedEntity: Self.projectNumber(of: project),
                        platform: "ANDROID", scope: "*", applicationVersion: "1", rel: nil))
            }
            return .flatError(404, "No information found about this instance id.")
        }
        guard registration.project == project else { return .flatError(403, "PERMISSION_DENIED") }
        var info = FCMWire.IIDInfo(
            application: registration.app, authorizedEntity: Self.projectNumber(of: project),
            platform: registration.platform, scope: "*", applicationVersion: "1", rel: nil)
        if details, !registration.topics.isEmpty {
            info.rel = FCMWire.IIDInfo.Relations(
                topics: registration.topics.mapValues { FCMWire.IIDInfo.TopicRelation(addDate: RFC3339.date($0)) })
        }
        return .encoded(200, info)
    }
}
