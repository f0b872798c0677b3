import Foundation
import Testing
import TidemarkAuth

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// `tidemark emulator serve` as a real process on a real socket (port 0): graceful shutdown,
/// state that survives a restart, a key file clients can use, faults that drop connections.
@Suite(.serialized) struct EmulatorServeTests {
    struct Server {
        let process: Process
        let base: String
        let keyFile: String

        static func start(_ cli: CLIRunner, data: String?, extra: [String] = []) throws -> Server {
            var arguments = ["emulator", "serve", "--port", "0"]
            if !extra.contains("--project") { arguments += ["--project", "serve-test"] }
            arguments += extra
            if let data { arguments += ["--data", data] }
            let (process, out, _) = try cli.start(arguments)
            var buffer = ""
            let deadline = Date().addingTimeInterval(30)
            while Date() < deadline {
                let chunk = out.fileHandleForReading.availableData
                if chunk.isEmpty { break }
                buffer += String(decoding: chunk, as: UTF8.self)
                if buffer.contains("Press Ctrl-C") { break }
            }
            let base = try #require(buffer.firstMatch(of: /listening on (http:\/\/\S+)/)?.1)
            let keyFile = try #require(buffer.firstMatch(of: /GOOGLE_APPLICATION_CREDENTIALS=(\S+)/)?.1)
            return Server(process: process, base: String(base), keyFile: String(keyFile))
        }

        /// What a tidemark process needs to use this emulator as its backend.
        var environment: [String: String] {
            ["FCM_EMULATOR_HOST": String(base.dropFirst("http://".count)), "GOOGLE_APPLICATION_CREDENTIALS": keyFile]
        }

        /// An emulator for the demo project that accepts the demo's tokens and has no rate limit.
        static func startForDemo(_ cli: CLIRunner) throws -> Server {
            try start(cli, data: nil, extra: ["--auto-register", "--rate-limit", "0", "--project", "tidemark-demo"])
        }

        func stop() -> Int32 {
            process.terminate()
            process.waitUntilExit()
            return process.terminationStatus
        }

        func call(
            _ method: String, _ path: String, headers: [String: String] = [:], body: Data? = nil
        ) async throws
            -> (Int, [String: Any])
        {
            var request = URLRequest(url: URL(string: base + path)!)
            request.httpMethod = method
            for (name, value) in headers { request.setValue(value, forHTTPHeaderField: name) }
            request.httpBody = body
            let (data, response) = try await URLSession.shared.data(for: request)
            let json = (try? JSONSerialization.jsonObject(with: data)) as? [String: Any] ?? [:]
            return ((response as! HTTPURLResponse).statusCode, json)
        }

        func json(_ object: Any) -> Data { try! JSONSerialization.data(withJSONObject: object) }

        /// Signs an assertion with the key file and exchanges it at the key's token_uri, as a client library does.
        func accessToken() async throws -> String {
            let key = try JSONDecoder().decode(
                ServiceAccountKey.self, from: Data(contentsOf: URL(fileURLWithPath: keyFile)))
            #expect(key.tokenURI == base + "/token")
            let now = Int(Date().timeIntervalSince1970)
            let assertion = try JWT.sign(
                JWTClaims(
                    iss: key.clientEmail, aud: key.tokenURI,
                    scope: "https://www.googleapis.com/auth/firebase.messaging", iat: now, exp: now + 3600),
                keyID: key.privateKeyID, with: try key.signingKey())
            let (status, body) = try await call(
                "POST", "/token",
                headers: ["Content-Type": "application/x-www-form-urlencoded"],
                body: Data(
                    "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion=\(assertion)".utf8))
            #expect(status == 200)
            return try #require(body["access_token"] as? String)
        }
    }

    static let token = "serve1:APA91bH" + String(repeating: "s", count: 30)

    @Test func restartWithTheSameDataKeepsSubscriptionsGroupsAndKey() async throws {
        let cli = try CLIRunner()
        defer { cli.remove() }
        let data = cli.project.appendingPathComponent("emulator-data").path
        let first = try Server.start(cli, data: data)
        let keyBefore = try Data(contentsOf: URL(fileURLWithPath: first.keyFile))
        let attributes = try FileManager.default.attributesOfItem(atPath: first.keyFile)
        #expect((attributes[.posixPermissions] as? Int) == 0o600)

        let auth = ["Authorization": "Bearer \(try await first.accessToken())"]
        _ = try await first.call(
            "POST", "/emulator/v1/projects/serve-test/registrations",
            body: first.json(["token": Self.token]))
        let reg = Self.token.addingPercentEncoding(withAllowedCharacters: .alphanumerics)!
        let (created, _) = try await first.call(
            "POST",
            "/v1/projects/serve-test/registrations/\(reg)/topicSubscriptions?topic_name=kept", headers: auth,
            body: first.json([:]))
        #expect(created == 200)
        var groupHeaders = auth
        groupHeaders["access_token_auth"] = "true"
        groupHeaders["project_id"] = "serve-test"
        groupHeaders["Content-Type"] = "application/json"
        let (grouped, _) = try await first.call(
            "POST", "/fcm/notification", headers: groupHeaders,
            body: first.json([
                "operation": "create", "notification_key_name": "kept-group", "registration_ids": [Self.token],
            ]))
        #expect(grouped == 200)
        #expect(first.stop() == 0)

        let second = try Server.start(cli, data: data)
        defer { _ = second.stop() }
        // Same key pair (reused), new port in token_uri.
        let keyAfter = try JSONDecoder().decode(
            ServiceAccountKey.self, from: Data(contentsOf: URL(fileURLWithPath: second.keyFile)))
        let original = try JSONDecoder().decode(ServiceAccountKey.self, from: keyBefore)
        #expect(keyAfter.privateKey == original.privateKey)
        let auth2 = ["Authorization": "Bearer \(try await second.accessToken())"]
        let (got, body) = try await second.call(
            "GET",
            "/v1/projects/serve-test/registrations/\(reg)/topicSubscriptions/kept", headers: auth2)
        #expect(got == 200)
        #expect(body["topic_name"] as? String == "kept")
        let (_, groups) = try await second.call("GET", "/emulator/v1/projects/serve-test/groups/kept-group")
        #expect(groups["members"] as? [String] == [Self.token])
    }

    @Test func faultFlagsAnd429WithRetryAfter() async throws {
        let cli = try CLIRunner()
        defer { cli.remove() }
        let server = try Server.start(cli, data: nil, extra: ["--fault-429", "1", "--seed", "5"])
        defer { _ = server.stop() }
        let auth = ["Authorization": "Bearer \(try await server.accessToken())"]
        var request = URLRequest(
            url: URL(string: server.base + "/v1/projects/serve-test/registrations/x/topicSubscriptions")!)
        for (name, value) in auth { request.setValue(value, forHTTPHeaderField: name) }
        let (_, response) = try await URLSession.shared.data(for: request)
        let http = try #require(response as? HTTPURLResponse)
        #expect(http.statusCode == 429)
        #expect(http.value(forHTTPHeaderField: "Retry-After") == "1")
        // The admin API and the token endpoint are never faulted.
        let (status, config) = try await server.call("GET", "/emulator/v1/config")
        #expect(status == 200)
        #expect((config["faults"] as? [String: Any])?["http_429"] as? Double == 1)
    }

    @Test func droppedConnectionsAndMemoryMode() async throws {
        let cli = try CLIRunner()
        defer { cli.remove() }
        let server = try Server.start(cli, data: nil)
        defer { _ = server.stop() }
        let auth = ["Authorization": "Bearer \(try await server.accessToken())"]
        _ = try await server.call("PUT", "/emulator/v1/config", body: server.json(["faults": ["drop_connection": 1]]))
        await #expect(throws: (any Error).self) {
            _ = try await server.call(
                "GET", "/v1/projects/serve-test/registrations/x/topicSubscriptions", headers: auth)
        }
        _ = try await server.call("POST", "/emulator/v1/reset")
        let (status, _) = try await server.call(
            "GET", "/v1/projects/serve-test/registrations/x/topicSubscriptions",
            headers: auth)
        #expect(status == 404)
    }
}
