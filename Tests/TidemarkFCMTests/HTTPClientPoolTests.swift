import AsyncHTTPClient
import Testing

@testable import TidemarkFCM

/// The clients `serve` shares between the backends of its batches: one set of routes per proxy
/// settings, the same each time, and none after the pool is shut down.
@Suite struct HTTPClientPoolTests {
    @Test func theSameSettingsGetTheSameClientsAndOtherSettingsTheirOwn() async throws {
        let pool = HTTPClientPool()
        let direct = try #require(pool.routes(for: ProxySettings()))
        let again = try #require(pool.routes(for: ProxySettings()))
        #expect(direct.direct === again.direct)
        let proxy = ProxySettings.Proxy(host: "127.0.0.1", port: 3128)
        let proxied = try #require(pool.routes(for: ProxySettings(https: proxy)))
        #expect(proxied.direct !== direct.direct)
        #expect(proxied.client(for: "https://fcm.googleapis.com/") !== proxied.direct)
        #expect(pool.count == 2)
        await pool.shutdown()
        #expect(pool.count == 0)
        #expect(pool.routes(for: ProxySettings()) == nil, "a closed pool makes no clients")
    }
}
