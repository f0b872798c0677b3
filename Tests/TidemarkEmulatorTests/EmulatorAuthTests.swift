import Foundation
import Synchronization
import Testing
import TidemarkAuth
import TidemarkCore
import TidemarkTesting

@testable import TidemarkEmulator

@Suite struct EmulatorAuthTests {
    @Test func everyFCMRouteNeedsCredentials() async throws {
        let h = try EmulatorHarness()
        let routes: [(String, String)] = [
            ("POST", EmulatorHarness.v1Path("a:APA91b") + "?topic_name=news"),
            ("GET", EmulatorHarness.v1Path("a:APA91b")),
            ("DELETE", EmulatorHarness.v1Path("a:APA91b", "news")),
            ("POST", "/v1/projects/\(EmulatorHarness.project)/messages:send"),
            ("POST", "/iid/v1:batchAdd"), ("POST", "/iid/v1:batchRemove"), ("GET", "/iid/info/a:APA91b"),
            ("POST", "/iid/v1/a:APA91b/rel/topics/news"), ("POST", "/fcm/notification"), ("GET", "/fcm/notification"),
        ]
        for (method, path) in routes {
            let response = await h.call(method, path, json: [:])
            #expect(response.status == 401, "\(method) \(path)")
            let legacy = await h.call(method, path, headers: ["Authorization": "key=AAAAlegacyServerKey"], json: [:])
            #expect(legacy.status == 401)
            #expect(legacy.text.contains("Authenticating using server key is deprecated"), "\(method) \(path)")
        }
        // IID answers an unauthenticated call with Google's HTML page; v1 with google.rpc.Status.
        let iid = await h.call("POST", "/iid/v1:batchAdd", json: [:])
        #expect(iid.text.contains("<TITLE>Unauthorized</TITLE>"))
        #expect(await h.call("GET", EmulatorHarness.v1Path("a:APA91b")).errorStatus == "UNAUTHENTICATED")
    }

    @Test func tokenEndpointVerifiesTheAssertion() async throws {
        let h = try EmulatorHarness()
        let token = try await h.accessToken()
        #expect(token.hasPrefix("ya29."))
        // A key the emulator does not know, and a tampered signature, are invalid_grant.
        let stranger = try ServiceAccountKey.generate(
            projectID: EmulatorHarness.project, accountName: "stranger",
            tokenURI: "x")
        await #expect(throws: AuthError.self) { try await h.accessToken(for: stranger) }
        let now = Int(Date().timeIntervalSince1970)
        let good = try JWT.sign(
            JWTClaims(iss: h.key.clientEmail, aud: "anything", scope: "s", iat: now, exp: now + 600),
            keyID: h.key.privateKeyID, with: try h.key.signingKey())
        var parts = good.split(separator: ".").map(String.init)
        parts[1] = Base64URL.encode(
            Data(#"{"iss":"\#(h.key.clientEmail)","aud":"x","iat":\#(now),"exp":\#(now + 600),"scope":"s2"}"#.utf8))
        let forged = await h.call("POST", "/token", json: nil)
        #expect(forged.status == 400)
        let response = await h.emulator.handle(
            WireRequest(
                method: "POST", target: "/token",
                body: Data(
                    "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion=\(parts.joined(separator: "."))"
                        .utf8)))
        #expect(response.status == 400)
        #expect(response.jsonObject?["error"] as? String == "invalid_grant")
        // Expired assertions are refused too.
        let old = try JWT.sign(
            JWTClaims(iss: h.key.clientEmail, aud: "a", scope: "s", iat: now - 7200, exp: now - 3600),
            keyID: h.key.privateKeyID, with: try h.key.signingKey())
        let expired = await h.emulator.handle(
            WireRequest(
                method: "POST", target: "/token",
                body: Data("grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer&assertion=\(old)".utf8)))
        #expect(expired.status == 400)
    }

    /// The token endpoint checks an assertion as Google does: a known `kid` (a JWT without one is
    /// refused however well signed), a token endpoint as audience, a scope, and times that make sense;
    /// numbers past any range are a 400, never a crash.
    @Test func theTokenEndpointChecksWhatGoogleChecks() async throws {
        let h = try EmulatorHarness()
        let now = Int(Date().timeIntervalSince1970)
        let key = h.key
        func post(_ assertion: String) async -> WireResponse {
            await h.emulator.handle(
                WireRequest(
                    method: "POST", target: "/token",
                    body: Data(
                        "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion=\(assertion)".utf8))
            )
        }
        func signed(
            kid: String?, aud: String = "https://oauth2.googleapis.com/token",
            scope: String? = "https://www.googleapis.com/auth/firebase.messaging", iat: Int? = nil, exp: Int? = nil
        ) throws -> String {
            try JWT.sign(
                JWTClaims(iss: key.clientEmail, aud: aud, scope: scope, iat: iat ?? now, exp: exp ?? now + 600),
                keyID: kid, with: try key.signingKey())
        }
        #expect(await post(try signed(kid: key.privateKeyID)).status == 200)
        let cases: [(String, String)] = [
            (try signed(kid: nil), "names no key id"),
            (try signed(kid: "0123456789abcdef"), "no key is registered"),
            (try signed(kid: key.privateKeyID, aud: "anything"), "is not a token endpoint"),
            (try signed(kid: key.privateKeyID, scope: nil), "has no scope"),
            (try signed(kid: key.privateKeyID, iat: Int.min + 10, exp: Int.max - 10), "exp must be after iat"),
            (try signed(kid: key.privateKeyID, iat: now + 86_400, exp: now + 86_400 + 600), "reasonable timeframe"),
        ]
        for (assertion, part) in cases {
            let answer = await post(assertion)
            #expect(answer.status == 400, "\(part)")
            #expect((answer.jsonObject?["error_description"] as? String)?.contains(part) == true, "\(answer.text)")
        }
        // An exp far past what an integer holds is not a JWT tidemark or Google reads: 400, no crash.
        var parts = try signed(kid: key.privateKeyID).split(separator: ".").map(String.init)
        parts[1] = Base64URL.encode(
            Data(
                #"{"iss":"\#(key.clientEmail)","aud":"https://oauth2.googleapis.com/token","scope":"s","iat":1,"exp":1e300}"#
                    .utf8))
        #expect(await post(parts.joined(separator: ".")).status == 400)
    }

    /// The admin API refuses values out of range with a sentence, never its decoder's text, and
    /// survives them.
    @Test func theAdminAPIRefusesNumbersOutOfRange() async throws {
        let h = try EmulatorHarness()
        for body in [
            #"{"access_token_lifetime_seconds": 1e300}"#, #"{"access_token_lifetime_seconds": -1}"#,
            #"{"rate_limit": {"per_second": 1e308}}"#, #"{"access_token_lifetime_seconds": "soon"}"#,
            #"{"faults": 7}"#,
        ] {
            let answer = await h.emulator.handle(
                WireRequest(method: "PUT", target: "/emulator/v1/config", body: Data(body.utf8)))
            #expect(answer.status == 400, "\(body)")
            for dump in ["DecodingError", "CodingKeys", "dataCorrupted", "typeMismatch"] {
                #expect(!answer.text.contains(dump), "\(body): \(answer.text)")
            }
        }
        #expect(await h.emulator.handle(WireRequest(method: "GET", target: "/emulator/v1/config")).status == 200)
    }

    @Test func accessTokensExpireAndAreBoundToTheirProject() async throws {
        let clock = ManualClock()
        let authority = AccessTokenAuthority(timing: clock.timing)
        try authority.trust(EmulatorHarness.sharedKey)
        authority.tokenLifetime = 60
        let now = Int(clock.timing.wallClock().timeIntervalSince1970)
        let key = EmulatorHarness.sharedKey
        let assertion = try JWT.sign(
            JWTClaims(
                iss: key.clientEmail, aud: "https://oauth2.googleapis.com/token",
                scope: "https://www.googleapis.com/auth/cloud-platform", iat: now, exp: now + 3600),
            keyID: key.privateKeyID, with: try key.signingKey())
        let (token, grant) = try authority.exchange(assertion: assertion)
        #expect(grant.project == EmulatorHarness.project)
        #expect(authority.authenticate(bearer: token) == .granted(grant))
        clock.advance(.seconds(61))
        #expect(authority.authenticate(bearer: token) == .expired)
        #expect(authority.authenticate(bearer: "ya29.made-up") == .invalid)
    }

    @Test func anotherProjectsTokenIsForbidden() async throws {
        let h = try EmulatorHarness()
        let other = try await h.accessToken(for: EmulatorHarness.otherKey)
        let response = await h.call("GET", EmulatorHarness.v1Path("a:APA91b"), headers: h.bearer(other))
        #expect(response.status == 403)
        #expect(response.errorStatus == "PERMISSION_DENIED")
        var groupHeaders = h.bearer(other, iid: true)
        groupHeaders["project_id"] = FCMEmulator.projectNumber(of: EmulatorHarness.project)
        #expect(await h.call("GET", "/fcm/notification?notification_key_name=x", headers: groupHeaders).status == 403)
    }

    @Test func iidAndGroupsNeedAccessTokenAuthHeader() async throws {
        let h = try EmulatorHarness()
        let token = try await h.accessToken()
        let without = await h.call(
            "POST", "/iid/v1:batchAdd", headers: h.bearer(token),
            json: ["to": "/topics/news", "registration_tokens": ["a:APA91b"]])
        #expect(without.status == 401)
        let with = await h.call(
            "POST", "/iid/v1:batchAdd", headers: h.bearer(token, iid: true),
            json: ["to": "/topics/news", "registration_tokens": ["a:APA91b"]])
        #expect(with.status == 200)
    }

    @Test func unknownPathsAnswer404() async throws {
        let h = try EmulatorHarness()
        let token = try await h.accessToken()
        for path in ["/", "/nothing/here", "/v1/projects/\(EmulatorHarness.project)/somethingElse", "/emulator/v2/x"] {
            #expect(await h.call("GET", path, headers: h.bearer(token, iid: true)).status == 404, "\(path)")
        }
        #expect(await h.call("GET", "/iid/v1/x/unknown", headers: h.bearer(token, iid: true)).status == 404)
    }
}
