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

    @Test func accessTokensExpireAndAreBoundToTheirProject() async throws {
        let clock = ManualClock()
        let authority = AccessTokenAuthority(timing: clock.timing)
        try authority.trust(EmulatorHarness.sharedKey)
        authority.tokenLifetime = 60
        let now = Int(clock.timing.wallClock().timeIntervalSince1970)
        let key = EmulatorHarness.sharedKey
        let assertion = try JWT.sign(
            JWTClaims(
                iss: key.clientEmail, aud: "a",
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
