import Foundation
import TidemarkAuth
import TidemarkCore

/// The admin API under `/emulator/v1/` (docs/emulator.md): what a test harness needs and real FCM
/// does not offer. Unauthenticated, like other local emulators; never rate limited or faulted.
extension FCMEmulator {
    struct ConfigBody: Codable {
        var faults: FaultSettings?
        var rateLimit: RateLimitSettings?
        var autoRegister: Bool?
        var accessTokenLifetimeSeconds: Double?
        var recordChanges: Bool?

        enum CodingKeys: String, CodingKey {
            case faults
            case rateLimit = "rate_limit"
            case autoRegister = "auto_register"
            case accessTokenLifetimeSeconds = "access_token_lifetime_seconds"
            case recordChanges = "record_changes"
        }
    }

    private func bad(_ message: String) -> WireResponse { .status(400, "INVALID_ARGUMENT", message) }

    func admin(_ request: WireRequest) async -> WireResponse {
        let s = Array(request.segments.dropFirst())
        guard s.first == "v1" else { return adminNotFound(request) }
        let rest = Array(s.dropFirst())
        switch (request.method, rest.first) {
        case ("GET", "config") where rest.count == 1, ("GET", "status") where rest.count == 1:
            return await configResponse()
        case ("PUT", "config") where rest.count == 1, ("PATCH", "config") where rest.count == 1:
            return await updateConfig(request)
        case ("POST", "reset") where rest.count == 1:
            do {
                try await engine.reset()
            } catch {
                return .status(500, "INTERNAL", "Could not reset the store: \(ErrorText.describe(error))")
            }
            deliveries.clear()
            control.reset()
            traffic.reset()
            return .json(200, [String: Any]())
        case ("GET", "traffic") where rest.count == 1:
            return .encoded(200, traffic.counters)
        case ("DELETE", "traffic") where rest.count == 1:
            traffic.reset()
            return .json(200, [String: Any]())
        case (_, "projects") where rest.count >= 3:
            return await projectAdmin(request, project: rest[1], path: Array(rest.dropFirst(2)))
        default:
            return adminNotFound(request)
        }
    }

    private func configResponse() async -> WireResponse {
        let body = ConfigBody(
            faults: control.faults, rateLimit: control.rateLimit, autoRegister: await engine.autoRegister,
            accessTokenLifetimeSeconds: authority.tokenLifetime, recordChanges: traffic.recording)
        var object = (try? JSONSerialization.jsonObject(with: JSONEncoder().encode(body))) as? [String: Any] ?? [:]
        object["default_project"] = defaultProject
        object["projects"] = authority.projects.sorted()
        object["iid_disabled_projects"] = control.iidDisabledProjects
        return .json(200, object)
    }

    private func updateConfig(_ request: WireRequest) async -> WireResponse {
        let body: ConfigBody
        do {
            body = try JSONDecoder().decode(
                ConfigBody.self, from: request.body.isEmpty ? Data("{}".utf8) : request.body)
        } catch {
            return bad(
                "The config body does not parse: \((error as? DecodingError).map { ErrorText.describe($0, snakeCase: true) } ?? ErrorText.describe(error)). Keys: faults, rate_limit, auto_register, access_token_lifetime_seconds, record_changes."
            )
        }
        if let faults = body.faults {
            if let problem = faults.problem { return bad("faults: \(problem).") }
            control.faults = faults
        }
        if let rateLimit = body.rateLimit {
            guard rateLimit.perSecond.isFinite, rateLimit.perSecond >= 0, rateLimit.perSecond <= 10_000_000 else {
                return bad("rate_limit.per_second must be from 0 (no limit) to 10000000.")
            }
            control.rateLimit = rateLimit
        }
        if let autoRegister = body.autoRegister { await engine.setAutoRegister(autoRegister) }
        if let record = body.recordChanges { traffic.recording = record }
        if let lifetime = body.accessTokenLifetimeSeconds {
            guard lifetime.isFinite, lifetime >= 1, lifetime <= 315_360_000 else {
                return bad("access_token_lifetime_seconds must be from 1 to 315360000 (ten years).")
            }
            authority.tokenLifetime = lifetime
        }
        return await configResponse()
    }

    private func projectAdmin(_ request: WireRequest, project: String, path: [String]) async -> WireResponse {
        switch (request.method, path.count, path[0]) {
        case ("PUT", 1, "config"), ("PATCH", 1, "config"):
            guard let body = jsonBody(request) else { return bad("The body is not a JSON object.") }
            if let enabled = body["iid_enabled"] as? Bool { control.setIIDEnabled(enabled, project: project) }
            return .json(
                200,
                [
                    "project": project, "iid_enabled": control.isIIDEnabled(project: project),
                    "project_number": Self.projectNumber(of: project),
                ])
        case ("GET", 1, "config"):
            return .json(
                200,
                [
                    "project": project, "iid_enabled": control.isIIDEnabled(project: project),
                    "project_number": Self.projectNumber(of: project),
                ])
        case ("POST", 1, "service-accounts"):
            do {
                let name = (jsonBody(request)?["name"] as? String) ?? "tidemark-emulator"
                let key = try ServiceAccountKey.generate(
                    projectID: project, accountName: name,
                    tokenURI: control.baseURL + "/token", timing: timing)
                try authority.trust(key)
                return WireResponse(
                    status: 200, headers: [("Content-Type", "application/json")], body: try key.jsonData())
            } catch {
                return .status(500, "INTERNAL", "Could not create a key: \(ErrorText.describe(error))")
            }
        case ("POST", 1, "keys"):
            guard let body = jsonBody(request), let pem = body["public_key"] as? String,
                let email = body["client_email"] as? String
            else { return bad("Send {\"client_email\", \"public_key\" (PEM), \"key_id\"}.") }
            do {
                try authority.trust(
                    publicKeyPEM: pem, clientEmail: email, keyID: body["key_id"] as? String ?? "",
                    project: project)
                return .json(200, ["project": project, "client_email": email])
            } catch {
                return bad(ErrorText.describe(error))
            }
        case (_, _, "registrations"):
            return await registrationsAdmin(request, project: project, path: path)
        case (_, _, "topics"):
            return await topicsAdmin(request, project: project, path: path)
        case (_, _, "groups"):
            return await groupsAdmin(request, project: project, path: path)
        case ("GET", 1, "changes"):
            let after = request.queryValue("after").flatMap { Int($0) } ?? 0
            return .encoded(200, ["changes": traffic.changes(project: project, after: after)])
        case ("GET", 1, "deliveries"):
            let list = deliveries.deliveries(project: project, token: request.queryValue("token"))
            return .encoded(200, ["deliveries": list])
        case ("DELETE", 1, "deliveries"):
            deliveries.clear(project: project)
            return .json(200, [String: Any]())
        default:
            return adminNotFound(request)
        }
    }

    private func registrationsAdmin(_ request: WireRequest, project: String, path: [String]) async -> WireResponse {
        switch (request.method, path.count) {
        case ("POST", 1):
            guard let body = jsonBody(request) else { return bad("The body is not a JSON object.") }
            let items = (body["registrations"] as? [[String: Any]]) ?? (body["token"] != nil ? [body] : [])
            guard !items.isEmpty else {
                return bad("Send {\"registrations\": [{\"token\", \"platform\", \"app\"}, …]} or one {\"token\", …}.")
            }
            var instances: [FCMEngine.Instance] = []
            for item in items {
                guard let token = item["token"] as? String else { return bad("Each registration needs a token.") }
                if let problem = FCMLimits.tokenProblem(token) {
                    return bad("Token '\(token.prefix(40))': \(problem).")
                }
                instances.append(
                    FCMEngine.Instance(
                        token: token, platform: item["platform"] as? String ?? "ANDROID",
                        app: item["app"] as? String ?? "com.example.app"))
            }
            do {
                try await engine.register(instances, project: project)
            } catch {
                return bad(ErrorText.describe(error))
            }
            return .json(200, ["registered": instances.count])
        case ("GET", 1):
            let list = await engine.registrations(project: project)
            return .json(
                200,
                [
                    "registrations": list.map {
                        [
                            "token": $0.token, "platform": $0.registration.platform, "app": $0.registration.app,
                            "topics": $0.registration.topics.count,
                        ] as [String: Any]
                    }
                ])
        case ("GET", 2):
            guard let registration = await engine.registration(path[1]), registration.project == project else {
                return .status(404, "NOT_FOUND", "No app instance \(path[1]) in project \(project).")
            }
            return .json(
                200,
                [
                    "token": path[1], "platform": registration.platform, "app": registration.app,
                    "registered": !registration.unregistered, "topics": registration.topics.keys.sorted(),
                ])
        case ("DELETE", 2):
            do {
                try await engine.unregister(token: path[1])
            } catch {
                return .status(500, "INTERNAL", ErrorText.describe(error))
            }
            return .json(200, [String: Any]())
        default:
            return adminNotFound(request)
        }
    }

    private func topicsAdmin(_ request: WireRequest, project: String, path: [String]) async -> WireResponse {
        switch (request.method, path.count) {
        case ("GET", 1):
            let all = await engine.allSubscriptions(project: project)
            return .json(
                200, ["topics": all.keys.sorted().map { ["name": $0, "subscribers": all[$0]!.count] as [String: Any] }])
        case ("GET", 3) where path[2] == "subscribers":
            return .json(
                200, ["topic": path[1], "subscribers": await engine.subscribers(of: path[1], project: project)])
        case ("POST", 3) where path[2] == "subscribers", ("DELETE", 3) where path[2] == "subscribers":
            // What an app does for itself: subscribe (or unsubscribe) on the device, outside any quota.
            guard let tokens = jsonBody(request)?["tokens"] as? [String], !tokens.isEmpty else {
                return bad("Send {\"tokens\": [\"…\"]}.")
            }
            if let problem = FCMLimits.topicNameProblem(path[1]) { return bad("Topic '\(path[1])': \(problem).") }
            var results: [[String: String]] = []
            do {
                for start in stride(from: 0, to: tokens.count, by: FCMLimits.maxBatchTokens) {
                    let chunk = Array(tokens[start..<min(tokens.count, start + FCMLimits.maxBatchTokens)])
                    let outcomes =
                        request.method == "POST"
                        ? try await engine.batchAdd(project: project, topic: path[1], tokens: chunk)
                        : try await engine.batchRemove(project: project, topic: path[1], tokens: chunk)
                    results += outcomes.map { if case .failed(let e) = $0 { ["error": e.code.rawValue] } else { [:] } }
                }
            } catch {
                return bad(ErrorText.describe(error))
            }
            return .json(200, ["results": results])
        default:
            return adminNotFound(request)
        }
    }

    private func groupsAdmin(_ request: WireRequest, project: String, path: [String]) async -> WireResponse {
        switch (request.method, path.count) {
        case ("GET", 1):
            let list = await engine.groups(project: project)
            return .json(
                200,
                ["groups": list.map { ["name": $0.name, "members": $0.members, "keys": $0.keys] as [String: Any] }])
        case ("GET", 2):
            guard let members = await engine.groupMembers(project: project, name: path[1]) else {
                return .status(404, "NOT_FOUND", "No device group \(path[1]) in project \(project).")
            }
            return .json(200, ["name": path[1], "members": members])
        case ("DELETE", 2):
            do {
                guard try await engine.deleteGroup(project: project, name: path[1]) else {
                    return .status(404, "NOT_FOUND", "No device group \(path[1]) in project \(project).")
                }
            } catch {
                return .status(500, "INTERNAL", ErrorText.describe(error))
            }
            return .json(200, [String: Any]())
        default:
            return adminNotFound(request)
        }
    }
}
