import Foundation
import Testing
import TidemarkAuth
import TidemarkCore

@testable import TidemarkEmulator

/// Callers Google (or any browser-safe local server) turns away: the emulator runs on developers'
/// machines next to a browser, and must not let them in.
@Suite struct HostileCallerTests {
    static let messaging = "https://www.googleapis.com/auth/firebase.messaging"

    func selfSigned(
        _ h: EmulatorHarness, aud: String, scope: String?, key: ServiceAccountKey? = nil
    ) throws -> String {
        let key = key ?? h.key
        let now = Int(Date().timeIntervalSince1970)
        return try JWT.sign(
            JWTClaims(iss: key.clientEmail, aud: aud, scope: scope, iat: now, exp: now + 600),
            keyID: key.privateKeyID, with: try key.signingKey())
    }

    /// A self-signed JWT stands for an access token only with the API as its audience and, when it
    /// names scopes, the messaging or cloud-platform scope among them.
    @Test func selfSignedJWTsNeedTheAPIAudienceAndAMessagingScope() async throws {
        let h = try EmulatorHarness()
        try await h.register([EmulatorHarness.token(1)])
        let path = EmulatorHarness.v1Path(EmulatorHarness.token(1))
        let cases: [(aud: String, scope: String?, status: Int)] = [
            ("https://fcm.googleapis.com/", nil, 200),
            ("https://fcm.googleapis.com/", Self.messaging, 200),
            ("https://fcm.googleapis.com/", "https://www.googleapis.com/auth/cloud-platform", 200),
            ("https://fcm.googleapis.com/", "https://www.googleapis.com/auth/userinfo.email", 403),
            ("https://evil.example/", nil, 401),
            ("https://evil.example/", Self.messaging, 401),
            ("https://oauth2.googleapis.com/token", Self.messaging, 401),
        ]
        for c in cases {
            let jwt = try selfSigned(h, aud: c.aud, scope: c.scope)
            let response = await h.call("GET", path, headers: h.bearer(jwt))
            #expect(response.status == c.status, "aud \(c.aud), scope \(c.scope ?? "none"): \(response.text)")
            if c.status == 403 { #expect(response.errorStatus == "PERMISSION_DENIED") }
            if c.status == 401 { #expect(response.errorStatus == "UNAUTHENTICATED") }
        }
        // Over IID too: a foreign scope is refused with IID's flat error.
        let foreign = try selfSigned(h, aud: "https://iid.googleapis.com/", scope: "openid")
        #expect(
            await h.call("GET", "/iid/info/\(EmulatorHarness.token(1))", headers: h.bearer(foreign, iid: true)).status
                == 403)
    }

    /// The assertion made for the token endpoint is not an access token: sent as a bearer, it is refused,
    /// as Google refuses it.
    @Test func theTokenEndpointAssertionIsNotABearer() async throws {
        let h = try EmulatorHarness()
        try await h.register([EmulatorHarness.token(1)])
        let path = EmulatorHarness.v1Path(EmulatorHarness.token(1))
        for aud in ["https://oauth2.googleapis.com/token", "http://127.0.0.1:9099/token", h.key.tokenURI] {
            let assertion = try selfSigned(h, aud: aud, scope: Self.messaging)
            let response = await h.call("GET", path, headers: h.bearer(assertion))
            #expect(response.status == 401, "aud \(aud)")
            // …while the same assertion is exactly what the token endpoint takes.
            let form = "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion=\(assertion)"
            let exchanged = await h.emulator.handle(
                WireRequest(method: "POST", target: "/token", body: Data(form.utf8)))
            #expect(exchanged.status == 200)
        }
        // A JWT signed by a key the emulator does not trust is refused whatever it claims.
        let stranger = try ServiceAccountKey.generate(
            projectID: EmulatorHarness.project, accountName: "stranger", tokenURI: "x")
        let forged = try selfSigned(h, aud: "https://fcm.googleapis.com/", scope: Self.messaging, key: stranger)
        #expect(await h.call("GET", path, headers: h.bearer(forged)).status == 401)
    }

    /// DNS rebinding: a web page whose name resolves to 127.0.0.1 reaches the emulator with its own
    /// name in `Host`; only loopback names are answered, on every route.
    @Test func foreignHostHeadersAreRefused() async throws {
        let h = try EmulatorHarness()
        let token = try await h.accessToken()
        for host in [
            "evil.example", "evil.example:9099", "127.0.0.1.evil.example", "[::2]:9099", "", "a:b:c",
            // Exactly the names documented: brackets hold an IPv6 address, a port is ASCII digits.
            "[127.0.0.1]", "[127.0.0.1]:9099", "[localhost]", "127.0.0.1:\u{0663}", "127.0.0.1:999999",
        ] {
            for (method, path) in [("POST", "/emulator/v1/reset"), ("GET", EmulatorHarness.v1Path("a:APA91b"))] {
                var headers = h.bearer(token)
                headers["Host"] = host
                let response = await h.call(method, path, headers: headers, json: [:])
                #expect(response.status == 403, "Host '\(host)' \(method) \(path)")
            }
        }
        for host in ["127.0.0.1:9099", "localhost:8080", "[::1]:9099", "LOCALHOST", "127.0.0.1"] {
            let response = await h.call("GET", "/emulator/v1/config", headers: ["Host": host])
            #expect(response.status != 403, "Host '\(host)': \(response.text)")
        }
    }

    /// A web page in the developer's browser can POST cross-origin (`text/plain` needs no preflight) to
    /// mint a service-account key or wipe the emulator: such requests carry `Origin` (and, in current
    /// browsers, `Sec-Fetch-Site`), and are refused before anything happens.
    @Test func crossOriginBrowserRequestsAreRefused() async throws {
        let h = try EmulatorHarness()
        try await h.register([EmulatorHarness.token(1)])
        let attempts: [[String: String]] = [
            ["Host": "127.0.0.1:9099", "Origin": "https://evil.example", "Content-Type": "text/plain"],
            ["Host": "127.0.0.1:9099", "Origin": "null"],
            ["Host": "127.0.0.1:9099", "Sec-Fetch-Site": "cross-site"],
            ["Host": "127.0.0.1:9099", "Origin": "http://127.0.0.1:9999"],
        ]
        for headers in attempts {
            let key = await h.call(
                "POST", "/emulator/v1/projects/\(EmulatorHarness.project)/service-accounts", headers: headers)
            #expect(key.status == 403, "\(headers)")
            #expect(!key.text.contains("private_key"))
            let reset = await h.call("POST", "/emulator/v1/reset", headers: headers)
            #expect(reset.status == 403, "\(headers)")
        }
        #expect(
            await h.emulator.engine.registrations(project: EmulatorHarness.project).count == 1,
            "nothing was wiped")
        // The emulator's own origin, and callers that are not browsers, are answered.
        let same = await h.call(
            "GET", "/emulator/v1/config", headers: ["Host": "127.0.0.1:9099", "Origin": "http://127.0.0.1:9099"])
        #expect(same.status == 200)
        #expect(await h.call("GET", "/emulator/v1/config").status == 200)
    }
}
