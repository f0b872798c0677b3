import Foundation
import TidemarkAuth
import TidemarkCore

@testable import TidemarkEmulator

/// An emulator with no socket, a trusted service-account key and helpers to call its routes.
struct EmulatorHarness {
    static let project = "emu-test"
    let emulator: FCMEmulator
    let key: ServiceAccountKey

    /// RSA key generation is the slow part; one key serves every test.
    static let sharedKey: ServiceAccountKey = try! ServiceAccountKey.generate(
        projectID: project,
        tokenURI: "http://127.0.0.1:9099/token")
    static let otherKey: ServiceAccountKey = try! ServiceAccountKey.generate(
        projectID: "someone-else",
        tokenURI: "http://127.0.0.1:9099/token")

    init(store: (any EngineStore)? = nil, timing: Timing = .live, rateLimit: Double = 0) throws {
        key = Self.sharedKey
        let authority = AccessTokenAuthority()
        try authority.trust(key)
        try authority.trust(Self.otherKey)
        let control = EmulatorControl(timing: timing)
        control.rateLimit = RateLimitSettings(perSecond: rateLimit)
        emulator = FCMEmulator(
            engine: try FCMEngine(configuration: .init(autoRegister: false), store: store),
            authority: authority, control: control, defaultProject: Self.project)
    }

    static func token(_ i: Int) -> String { "dev\(i):APA91bH" + String(repeating: "k", count: 30) }

    func call(
        _ method: String, _ target: String, headers: [String: String] = [:], json: Any? = nil
    ) async
        -> WireResponse
    {
        let body = json.map { try! JSONSerialization.data(withJSONObject: $0) } ?? Data()
        return await emulator.handle(WireRequest(method: method, target: target, headers: headers, body: body))
    }

    /// An access token from the emulator's token endpoint, for `key`.
    func accessToken(
        for key: ServiceAccountKey? = nil, scope: String = "https://www.googleapis.com/auth/firebase.messaging"
    )
        async throws -> String
    {
        let key = key ?? self.key
        let now = Int(Date().timeIntervalSince1970)
        let assertion = try JWT.sign(
            JWTClaims(
                iss: key.clientEmail, aud: "https://oauth2.googleapis.com/token",
                scope: scope, iat: now, exp: now + 3600), keyID: key.privateKeyID, with: try key.signingKey())
        let form = "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion=\(assertion)"
        let response = await emulator.handle(
            WireRequest(
                method: "POST", target: "/token",
                headers: ["Content-Type": "application/x-www-form-urlencoded"], body: Data(form.utf8)))
        guard response.status == 200, let token = response.jsonObject?["access_token"] as? String else {
            throw AuthError(.invalidClaims, "token exchange failed: \(String(decoding: response.body, as: UTF8.self))")
        }
        return token
    }

    func bearer(_ token: String, iid: Bool = false) -> [String: String] {
        var headers = ["Authorization": "Bearer \(token)"]
        if iid { headers["access_token_auth"] = "true" }
        return headers
    }

    func register(_ tokens: [String], project: String = project) async throws {
        try await emulator.engine.register(tokens.map { FCMEngine.Instance(token: $0) }, project: project)
    }

    static func v1Path(_ registration: String, _ topic: String? = nil, project: String = project) -> String {
        let reg = registration.addingPercentEncoding(withAllowedCharacters: .alphanumerics)!
        var path = "/v1/projects/\(project)/registrations/\(reg)/topicSubscriptions"
        if let topic { path += "/\(topic)" }
        return path
    }
}

extension WireResponse {
    var text: String { String(decoding: body, as: UTF8.self) }
    var errorStatus: String? { (jsonObject?["error"] as? [String: Any])?["status"] as? String }
    var flatError: String? { jsonObject?["error"] as? String }
}
