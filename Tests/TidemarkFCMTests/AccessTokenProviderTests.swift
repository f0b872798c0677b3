import AsyncHTTPClient
import Foundation
import Synchronization
import Testing
import TidemarkAuth
import TidemarkCore
import TidemarkEmulator
import TidemarkTesting

@testable import TidemarkFCM

/// The OAuth2 flow against the emulator's real token endpoint, on a live socket (port 0).
@Suite struct AccessTokenProviderTests {
    /// Runs `body` with a live emulator and an HTTP client, then shuts both down.
    func withEmulator(_ body: (EmulatorServer, HTTPClient) async throws -> Void) async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("tm-fcm-\(UUID().uuidString)")
            .path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var options = EmulatorServer.Options()
        options.port = 0
        options.dataDirectory = directory
        options.project = "fcm-test"
        let server = try EmulatorServer(options: options)
        let (ports, continuation) = AsyncStream<Int>.makeStream()
        let task = Task { try await server.run { port in continuation.yield(port) } }
        var iterator = ports.makeAsyncIterator()
        _ = await iterator.next()
        let client = HTTPClient(eventLoopGroupProvider: .singleton)
        do {
            try await body(server, client)
        } catch {
            try await client.shutdown()
            task.cancel()
            throw error
        }
        try await client.shutdown()
        task.cancel()
        _ = await task.result
    }

    @Test func fetchesCachesAndRefreshesBeforeExpiry() async throws {
        try await withEmulator { server, client in
            server.emulator.authority.tokenLifetime = 90
            let clock = ManualClock(epoch: Date())
            let key = try ServiceAccountKey.load(path: server.keyFilePath)
            let provider = AccessTokenProvider(key: key, client: client, timing: clock.timing)
            let first = try await provider.token()
            #expect(try await provider.token() == first)
            // 50 s left: within the refresh margin, so a new token is fetched.
            clock.advance(.seconds(40))
            let second = try await provider.token()
            #expect(second != first)
            #expect(server.emulator.authority.authenticate(bearer: second) != .invalid)
        }
    }

    /// Providers sharing a cache (serve's runtimes, one per reconcile and per batch) fetch one token for
    /// the same credentials, until it is within a minute of expiring or refused; other credentials,
    /// and a provider without the cache, fetch their own.
    @Test func providersSharingACacheFetchOneTokenForTheSameCredentials() async throws {
        try await withEmulator { server, client in
            server.emulator.authority.tokenLifetime = 90
            let clock = ManualClock(epoch: Date())
            let key = try ServiceAccountKey.load(path: server.keyFilePath)
            var other = try ServiceAccountKey.generate(projectID: "fcm-test", accountName: "other", tokenURI: "")
            other.tokenURI = key.tokenURI
            try server.emulator.authority.trust(other)
            let cache = AccessTokenCache()
            func provider(_ key: ServiceAccountKey, shared: Bool = true) -> AccessTokenProvider {
                AccessTokenProvider(
                    credentials: .serviceAccount(key), routes: HTTPRoutes(direct: client), timing: clock.timing,
                    cache: shared ? cache : nil)
            }
            func grants() -> Int { server.emulator.traffic.counters.tokenGrants }

            let first = try await provider(key).token()
            #expect(try await provider(key).token() == first)
            #expect(try await provider(key).token() == first)
            #expect(grants() == 1, "three providers, one exchange")
            #expect(cache.count == 1)

            let theirs = try await provider(other).token()
            #expect(theirs != first && grants() == 2, "other credentials have a token of their own")
            _ = try await provider(key, shared: false).token()
            #expect(grants() == 3, "a provider without the cache fetches its own")

            // Refused (a 401): the provider forgets it, and so does the cache; the next one fetches anew.
            let refused = provider(key)
            #expect(try await refused.token() == first)
            await refused.invalidate()
            let renewed = try await provider(key).token()
            #expect(renewed != first && grants() == 4)
            #expect(try await refused.token() == renewed, "the refused provider takes what the cache now holds")
            #expect(try await provider(other).token() == theirs, "forgetting one token leaves the others")

            // Within a minute of expiring, a kept token is not handed out.
            clock.advance(.seconds(40))
            let later = try await provider(key).token()
            #expect(later != renewed && grants() == 5)
            #expect(server.emulator.authority.authenticate(bearer: later) != .invalid)
        }
    }

    /// 5xx and network failures at the token endpoint are retried under the policy; a refusal of the key is not.
    @Test func theTokenEndpointIsRetried() async throws {
        try await withEmulator { server, client in
            let clock = ManualClock(epoch: Date())
            let key = try ServiceAccountKey.load(path: server.keyFilePath)
            server.emulator.control.failTokenEndpoint(times: 2)
            let provider = AccessTokenProvider(key: key, client: client, timing: clock.timing)
            let token = try await provider.token()
            #expect(server.emulator.authority.authenticate(bearer: token) != .invalid)
            #expect(clock.sleeps.count == 2, "two 503s, two waits: \(clock.sleeps)")
            #expect(clock.sleeps.allSatisfy { $0 >= .seconds(1) }, "Retry-After is honoured")
            // An outage longer than the policy's budget ends in one clear line.
            server.emulator.control.failTokenEndpoint(times: 1000)
            let impatient = AccessTokenProvider(
                key: key, client: client, timing: ManualClock(epoch: Date()).timing,
                policy: RetryPolicy(baseDelay: .milliseconds(10), maxDelay: .seconds(2), budget: .seconds(10)))
            do {
                _ = try await impatient.token()
                Issue.record("a token endpoint that only answers 503 cannot give a token")
            } catch let error as CredentialError {
                #expect(error.message.contains("answered HTTP 503"), "\(error.message)")
                #expect(error.message.contains("not the key"))
            }
            server.emulator.control.failTokenEndpoint(times: 0)
        }
    }

    @Test func refusalsSayWhatToFix() async throws {
        try await withEmulator { server, client in
            var stranger = try ServiceAccountKey.generate(projectID: "fcm-test", accountName: "stranger", tokenURI: "")
            stranger.tokenURI = try ServiceAccountKey.load(path: server.keyFilePath).tokenURI
            let provider = AccessTokenProvider(key: stranger, client: client)
            do {
                _ = try await provider.token()
                Issue.record("an unknown key must be refused")
            } catch let error as CredentialError {
                #expect(error.message.contains("invalid_grant"))
                #expect(error.message.contains("create a new key"))
                #expect(!error.message.contains("BEGIN PRIVATE KEY"))
            }
        }
        #expect(throws: CredentialError.self) { try ServiceAccountKey.load(path: "/nonexistent/key.json") }
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("tm-bad-key-\(UUID().uuidString).json")
            .path
        defer { try? FileManager.default.removeItem(atPath: path) }
        try #"{"type":"service_account","project_id":"p","client_email":"a@b"}"#.write(
            toFile: path, atomically: true,
            encoding: .utf8)
        do {
            _ = try ServiceAccountKey.load(path: path)
            Issue.record("a key without private_key must be refused")
        } catch let error as CredentialError {
            #expect(error.message.contains("\"private_key\""))
        }
    }

    /// A token endpoint that quotes its request in its refusal (the signed assertion is in it) never
    /// puts a credential in tidemark's message: what the request carried, and anything shaped like a
    /// JWT or an access token, is replaced, and the quote is cut short.
    @Test func anEndpointThatEchoesItsRequestShowsNoSecret() async throws {
        try await withEmulator { server, client in
            let key = try ServiceAccountKey.load(path: server.keyFilePath)
            server.emulator.control.echoTokenRequests(true)
            let provider = AccessTokenProvider(key: key, client: client)
            do {
                _ = try await provider.token()
                Issue.record("an echoing refusal gives no token")
            } catch let error as CredentialError {
                #expect(error.message.contains("invalid_request"), "\(error.message)")
                #expect(error.message.contains("[redacted]"), "\(error.message)")
                #expect(!error.message.contains("eyJ"), "\(error.message)")
                #expect(error.message.count < 900, "\(error.message)")
            }
            server.emulator.control.echoTokenRequests(false)
        }
        // What the other credential paths quote goes through the same scrub.
        let subject = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJyZXBvOm8vcjpyZWYifQ.c2lnbmF0dXJl"
        let echoed = Data(
            #"{"error":"invalid_grant","error_description":"subject_token=\#(subject)&scope=x access ya29.a0AfH6SMB-secret https://user:pw@host/x?sig=abc123"}"#
                .utf8)
        let said = AccessTokenProvider.refusal(echoed, status: 400, hiding: [subject])
        for secret in [subject, "ya29.a0AfH6SMB-secret", "pw@", "abc123"] {
            #expect(!said.contains(secret), "\(said)")
        }
        #expect(said.hasPrefix("invalid_grant ("))
        let long = Data(#"{"error":"x","error_description":"\#(String(repeating: "a", count: 5000))"}"#.utf8)
        #expect(AccessTokenProvider.refusal(long, status: 400).count <= QuotedAnswer.limit + 1)
        #expect(QuotedAnswer.safe("line\nnext\u{1B}[31m") == "line\\nnext\\u{1B}[31m")
    }

    /// A token_uri with a password in its user information or a secret in its query: no message shows
    /// either, whether the endpoint cannot be reached or it quotes the request back.
    @Test func aTokenURIsCredentialsAreNeverPrinted() async throws {
        let client = HTTPClient(eventLoopGroupProvider: .singleton)
        var key = try ServiceAccountKey.generate(projectID: "fcm-test", accountName: "ci", tokenURI: "")
        key.tokenURI = "http://robot:PASSWORD-hunter2@127.0.0.1:1/token?sig=QUERYSECRET42&x=1"
        do {
            _ = try await AccessTokenProvider(key: key, client: client).token()
            Issue.record("a closed port gives no token")
        } catch let error as CredentialError {
            #expect(error.message.contains("http://robot:***@127.0.0.1:1/token?sig=***&x=***"), "\(error.message)")
            for secret in ["PASSWORD-hunter2", "QUERYSECRET42"] {
                #expect(!error.message.contains(secret), "\(error.message)")
            }
        }
        try await client.shutdown()
        try await withEmulator { server, client in
            var echoed = try ServiceAccountKey.load(path: server.keyFilePath)
            echoed.tokenURI += "?sig=QUERYSECRET42"
            server.emulator.control.echoTokenRequests(true)
            do {
                _ = try await AccessTokenProvider(key: echoed, client: client).token()
                Issue.record("an echoing refusal gives no token")
            } catch let error as CredentialError {
                #expect(error.message.contains("invalid_request"), "\(error.message)")
                #expect(!error.message.contains("QUERYSECRET42"), "\(error.message)")
            }
            server.emulator.control.echoTokenRequests(false)
        }
    }
}
