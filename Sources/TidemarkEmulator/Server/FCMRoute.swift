import Foundation

/// Where a request goes, parsed once from its method and path segments: routing is a pure function,
/// tested on its own, and each surface's handler switches over a closed set of cases.
enum FCMRoute: Equatable, Sendable {
    /// OAuth2's token endpoint (`/token`, `/oauth2/…/token`, `/o/…/token`).
    case token
    /// The Security Token Service's exchange (`/v1/token`, `/sts/v1/token`).
    case sts
    /// IAM credentials' generateAccessToken (`/v1/projects/-/serviceAccounts/EMAIL:generateAccessToken`,
    /// also under `/iamcredentials`).
    case generateAccessToken(email: String)
    /// A Compute Engine metadata server (`/computeMetadata/…`).
    case metadata([String])
    /// tidemark's admin API under `/emulator/`.
    case admin
    /// The Instance ID API.
    case iid(IID)
    /// `/fcm/notification` (and the legacy `/gcm/notification`).
    case groups
    /// `/v1/projects/P/…`; `project` as the URL names it (an ID or a number).
    case v1(project: String, V1)
    case notFound

    enum IID: Equatable, Sendable {
        case batchAdd
        case batchRemove
        /// `POST|DELETE iid/v1/TOKEN/rel/topics/TOPIC`.
        case relation(token: String, topic: String, add: Bool)
        /// `GET iid/info/TOKEN` (and the older `GET iid/TOKEN`).
        case info(token: String)
        case notFound
    }

    enum V1: Equatable, Sendable {
        case send
        case createSubscription(registration: String)
        case listSubscriptions(registration: String)
        case getSubscription(registration: String, topic: String)
        case deleteSubscription(registration: String, topic: String)
        case patchSubscription(registration: String, topic: String)
        /// The path exists, the method does not.
        case methodNotFound
        case notFound
    }

    init(method: String, segments all: [String]) {
        let s = all.first == "iamcredentials" || all.first == "sts" ? Array(all.dropFirst()) : all
        if s == ["v1", "token"] {
            self = .sts
            return
        }
        if s.count == 5, s[0] == "v1", s[1] == "projects", s[3] == "serviceAccounts",
            s[4].hasSuffix(":generateAccessToken")
        {
            let email = String(s[4].dropLast(":generateAccessToken".count))
            self = .generateAccessToken(email: email.removingPercentEncoding ?? email)
            return
        }
        if s.first == "computeMetadata" {
            self = .metadata(Array(s.dropFirst()))
            return
        }
        switch s.first {
        case "token" where s.count == 1, "oauth2" where s.last == "token", "o" where s.last == "token":
            self = .token
        case "emulator":
            self = .admin
        case "iid":
            self = .iid(Self.iid(method, s))
        case "fcm" where s.count == 2 && s[1] == "notification", "gcm" where s.count == 2 && s[1] == "notification":
            self = .groups
        case "v1" where s.count >= 3 && s[1] == "projects":
            self = .v1(project: s[2], Self.v1(method, s))
        default:
            self = .notFound
        }
    }

    private static func iid(_ method: String, _ s: [String]) -> IID {
        switch (method, s.count) {
        case ("POST", 2) where s[1] == "v1:batchAdd": .batchAdd
        case ("POST", 2) where s[1] == "v1:batchRemove": .batchRemove
        case ("POST", 6) where s[1] == "v1" && s[3] == "rel" && s[4] == "topics",
            ("DELETE", 6) where s[1] == "v1" && s[3] == "rel" && s[4] == "topics":
            .relation(token: s[2], topic: s[5], add: method == "POST")
        case ("GET", 3) where s[1] == "info": .info(token: s[2])
        case ("GET", 2) where s[1] != "info" && s[1] != "v1": .info(token: s[1])
        default: .notFound
        }
    }

    private static func v1(_ method: String, _ s: [String]) -> V1 {
        // /v1/projects/P/messages:send
        if s.count == 4, s[3] == "messages:send" { return method == "POST" ? .send : .methodNotFound }
        // /v1/projects/P/registrations/REG/topicSubscriptions[/T]
        guard s.count >= 6, s.count <= 7, s[3] == "registrations", s[5] == "topicSubscriptions" else {
            return .notFound
        }
        let registration = s[4]
        if s.count == 6 {
            switch method {
            case "POST": return .createSubscription(registration: registration)
            case "GET": return .listSubscriptions(registration: registration)
            default: return .methodNotFound
            }
        }
        let topic = s[6]
        switch method {
        case "GET": return .getSubscription(registration: registration, topic: topic)
        case "DELETE": return .deleteSubscription(registration: registration, topic: topic)
        case "PATCH": return .patchSubscription(registration: registration, topic: topic)
        default: return .methodNotFound
        }
    }
}
