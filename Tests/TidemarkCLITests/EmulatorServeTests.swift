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
        /// A session of its own: the shared one is shared by every test running at once, and under the
        /// whole parallel suite its few connections per host made a poll wait past an apply's end.
        let session: URLSession = {
            let configuration = URLSessionConfiguration.ephemeral
            configuration.timeoutIntervalForRequest = 30
            return URLSession(configuration: configuration)
        }()

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
            let (data, response) = try await session.data(for: request)
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

    /// A body over the limit is answered 413 in Google's error shape, with or without a
    /// Content-Length, and the emulator goes on serving.
    @Test func anOversizedBodyIs413AndTheEmulatorLivesOn() async throws {
        let cli = try CLIRunner()
        defer { cli.remove() }
        let server = try Server.start(cli, data: nil)
        defer { _ = server.stop() }
        let big = Data(repeating: UInt8(ascii: "a"), count: 20 << 20)
        let (status, body) = try await server.call(
            "POST", "/iid/v1:batchAdd", headers: ["Content-Type": "application/json"], body: big)
        #expect(status == 413)
        #expect((body["error"] as? [String: Any])?["code"] as? Int == 413, "\(body)")
        // Still serving.
        let (config, _) = try await server.call("GET", "/emulator/v1/config")
        #expect(config == 200)
    }

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
        let (_, response) = try await server.session.data(for: request)
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

    /// Sends one raw HTTP/1.1 request (so the Host header is exactly the test's) and returns the status.
    static func rawStatus(_ base: String, _ request: String) throws -> Int {
        let port = try #require(UInt16(base.split(separator: ":").last ?? ""))
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        try #require(connected == 0)
        let bytes = Array(request.utf8)
        _ = bytes.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, 0) }
        var buffer = [UInt8](repeating: 0, count: 256)
        let n = recv(fd, &buffer, buffer.count, 0)
        let line = String(decoding: buffer.prefix(max(0, n)), as: UTF8.self)
        return try #require(Int(line.split(separator: " ").dropFirst().first ?? ""))
    }

    /// Over a real socket: a DNS-rebound Host and a cross-origin browser POST are refused before they
    /// touch anything; the key file is private from the moment it exists.
    @Test func hostileCallersAreRefusedOnTheSocket() async throws {
        let cli = try CLIRunner()
        defer { cli.remove() }
        let data = cli.project.appendingPathComponent("emulator-data").path
        let server = try Server.start(cli, data: data)
        defer { _ = server.stop() }
        let reset = "POST /emulator/v1/reset HTTP/1.1\r\nContent-Length: 0\r\nConnection: close\r\n"
        #expect(try Self.rawStatus(server.base, reset + "Host: evil.example\r\n\r\n") == 403)
        #expect(
            try Self.rawStatus(
                server.base,
                reset + "Host: 127.0.0.1\r\nOrigin: https://evil.example\r\nContent-Type: text/plain\r\n\r\n")
                == 403)
        #expect(try Self.rawStatus(server.base, reset + "Host: localhost\r\n\r\n") == 200)
        let mode = try FileManager.default.attributesOfItem(atPath: server.keyFile)[.posixPermissions] as? Int
        #expect(mode == 0o600)
        let leftovers = try FileManager.default.contentsOfDirectory(atPath: data).filter { $0.contains(".tmp-") }
        #expect(leftovers.isEmpty)
    }
}
