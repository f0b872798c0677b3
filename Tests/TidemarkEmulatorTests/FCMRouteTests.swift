import Testing

@testable import TidemarkEmulator

/// Routing is a pure function of method and path.
@Suite struct FCMRouteTests {
    func route(_ method: String, _ path: String) -> FCMRoute {
        FCMRoute(method: method, segments: WireRequest(method: method, target: path).segments)
    }

    @Test func v1Routes() {
        let base = "/v1/projects/p/registrations/r%3AAPA91b/topicSubscriptions"
        #expect(
            route("POST", base + "?topic_name=t") == .v1(project: "p", .createSubscription(registration: "r:APA91b")))
        #expect(route("GET", base) == .v1(project: "p", .listSubscriptions(registration: "r:APA91b")))
        #expect(
            route("DELETE", base + "/t") == .v1(project: "p", .deleteSubscription(registration: "r:APA91b", topic: "t"))
        )
        #expect(
            route("PATCH", base + "/t") == .v1(project: "p", .patchSubscription(registration: "r:APA91b", topic: "t")))
        #expect(route("GET", base + "/t") == .v1(project: "p", .getSubscription(registration: "r:APA91b", topic: "t")))
        #expect(route("PUT", base) == .v1(project: "p", .methodNotFound))
        #expect(route("POST", "/v1/projects/123/messages:send") == .v1(project: "123", .send))
        #expect(route("GET", "/v1/projects/123/messages:send") == .v1(project: "123", .methodNotFound))
        #expect(route("GET", "/v1/projects/p/nonsense") == .v1(project: "p", .notFound))
        #expect(route("GET", "/v1/elsewhere") == .notFound)
    }

    @Test func iidGroupsTokenAndAdmin() {
        #expect(route("POST", "/iid/v1:batchAdd") == .iid(.batchAdd))
        #expect(route("POST", "/iid/v1:batchRemove") == .iid(.batchRemove))
        #expect(route("POST", "/iid/v1/tok/rel/topics/news") == .iid(.relation(token: "tok", topic: "news", add: true)))
        #expect(
            route("DELETE", "/iid/v1/tok/rel/topics/news") == .iid(.relation(token: "tok", topic: "news", add: false)))
        #expect(route("GET", "/iid/info/tok?details=true") == .iid(.info(token: "tok")))
        #expect(route("GET", "/iid/tok") == .iid(.info(token: "tok")))
        #expect(route("PUT", "/iid/v1:batchAdd") == .iid(.notFound))
        #expect(route("POST", "/fcm/notification") == .groups)
        #expect(route("GET", "/gcm/notification?notification_key_name=g") == .groups)
        #expect(route("POST", "/token") == .token)
        #expect(route("POST", "/oauth2/v4/token") == .token)
        #expect(route("GET", "/emulator/v1/config") == .admin)
        #expect(route("GET", "/") == .notFound)
    }
}
