import Foundation
import Testing
import TidemarkCore

@testable import TidemarkEmulator

@Suite struct EmulatorGroupSendTests {
    typealias H = EmulatorHarness

    func groupHeaders(_ h: H) async throws -> [String: String] {
        var headers = h.bearer(try await h.accessToken(), iid: true)
        headers["project_id"] = FCMEmulator.projectNumber(of: H.project)
        return headers
    }

    @Test func deviceGroupLifecycle() async throws {
        let h = try H()
        let headers = try await groupHeaders(h)
        try await h.register((0..<25).map { H.token($0) })

        let created = await h.call(
            "POST", "/fcm/notification", headers: headers,
            json: [
                "operation": "create", "notification_key_name": "user-1",
                "registration_ids": [H.token(0), H.token(1), "bad token", H.token(77)],
            ])
        #expect(created.status == 200)
        let key = try #require(created.jsonObject?["notification_key"] as? String)
        // Invalid and unknown tokens are dropped on create.
        #expect(await h.emulator.engine.groupMembers(project: H.project, name: "user-1") == [H.token(0), H.token(1)])

        let dup = await h.call(
            "POST", "/fcm/notification", headers: headers,
            json: ["operation": "create", "notification_key_name": "user-1", "registration_ids": [H.token(2)]])
        #expect(dup.flatError == "notification_key already exists")
        let none = await h.call(
            "POST", "/fcm/notification", headers: headers,
            json: ["operation": "create", "notification_key_name": "user-2", "registration_ids": ["bad token"]])
        #expect(none.flatError == "no valid registration ids")

        // Each look-up may give a new alias; every alias works.
        let lookup = await h.call("GET", "/fcm/notification?notification_key_name=user-1", headers: headers)
        let alias = try #require(lookup.jsonObject?["notification_key"] as? String)
        #expect(alias != key)
        let added = await h.call(
            "POST", "/fcm/notification", headers: headers,
            json: [
                "operation": "add", "notification_key_name": "user-1", "notification_key": alias,
                "registration_ids": [H.token(2)],
            ])
        #expect(added.status == 200)
        let mismatch = await h.call(
            "POST", "/fcm/notification", headers: headers,
            json: [
                "operation": "add", "notification_key_name": "someone-else", "notification_key": key,
                "registration_ids": [H.token(3)],
            ])
        #expect(mismatch.flatError == "notification_key_name doesn't match the group name of the notification_key")

        // The 20-member cap.
        let crowd = await h.call(
            "POST", "/fcm/notification", headers: headers,
            json: ["operation": "add", "notification_key": key, "registration_ids": (3..<25).map { H.token($0) }])
        #expect(crowd.status == 400)

        // Removing every member deletes the group; its keys stop working.
        let removed = await h.call(
            "POST", "/fcm/notification", headers: headers,
            json: [
                "operation": "remove", "notification_key": key,
                "registration_ids": [H.token(0), H.token(1), H.token(2)],
            ])
        #expect(removed.status == 200)
        let gone = await h.call("GET", "/fcm/notification?notification_key_name=user-1", headers: headers)
        #expect(gone.flatError == "notification_key not found")
        let addToGone = await h.call(
            "POST", "/fcm/notification", headers: headers,
            json: ["operation": "add", "notification_key": alias, "registration_ids": [H.token(5)]])
        #expect(addToGone.flatError == "notification_key not found")

        var noSender = headers
        noSender["project_id"] = nil
        #expect(await h.call("GET", "/fcm/notification?notification_key_name=x", headers: noSender).status == 400)
    }

    @Test func sendResolvesTargetsAndRecordsDeliveries() async throws {
        let h = try H()
        let auth = h.bearer(try await h.accessToken())
        let send = "/v1/projects/\(H.project)/messages:send"
        try await h.register((0..<4).map { H.token($0) })
        _ = try await h.emulator.engine.batchAdd(project: H.project, topic: "a", tokens: [H.token(0), H.token(1)])
        _ = try await h.emulator.engine.batchAdd(project: H.project, topic: "b", tokens: [H.token(1), H.token(2)])

        func recipients(_ message: [String: Any]) async throws -> [String] {
            let response = await h.call("POST", send, headers: auth, json: ["message": message])
            #expect(response.status == 200, "\(response.text)")
            let name = try #require(response.jsonObject?["name"] as? String)
            return h.emulator.deliveries.deliveries(project: H.project).first { $0.name == name }?.recipients ?? []
        }
        #expect(try await recipients(["topic": "a"]) == [H.token(0), H.token(1)])
        #expect(try await recipients(["topic": "/topics/b"]) == [H.token(1), H.token(2)])
        #expect(try await recipients(["condition": "'a' in topics && !('b' in topics)"]) == [H.token(0)])
        // `!` includes instances with no topics at all.
        #expect(try await recipients(["condition": "!('a' in topics)"]) == [H.token(2), H.token(3)])
        #expect(try await recipients(["token": H.token(3), "data": ["k": "v"]]) == [H.token(3)])

        let dry = await h.call("POST", send, headers: auth, json: ["message": ["topic": "a"], "validate_only": true])
        #expect(dry.jsonObject?["name"] as? String == "projects/\(H.project)/messages/fake_message_id")
        let dryCamel = await h.call(
            "POST", send, headers: auth, json: ["message": ["topic": "a"], "validateOnly": true])
        #expect(dryCamel.jsonObject?["name"] as? String == "projects/\(H.project)/messages/fake_message_id")
        #expect(h.emulator.deliveries.deliveries(project: H.project).count == 5)
        #expect(h.emulator.deliveries.deliveries(project: H.project, token: H.token(3)).count == 2)

        let two = await h.call("POST", send, headers: auth, json: ["message": ["topic": "a", "token": H.token(0)]])
        #expect(two.status == 400)
        #expect(two.text.contains("FcmError"))
        let badCondition = await h.call(
            "POST", send, headers: auth,
            json: ["message": ["condition": "'a' in topics &&"]])
        #expect(badCondition.errorStatus == "INVALID_ARGUMENT")
        let unknown = await h.call("POST", send, headers: auth, json: ["message": ["token": H.token(50)]])
        #expect(unknown.status == 404)
        #expect(unknown.text.contains("UNREGISTERED"))
        let badData = await h.call("POST", send, headers: auth, json: ["message": ["topic": "a", "data": ["n": 1]]])
        #expect(badData.status == 400)
    }

    @Test func adminAPISeedsAndReadsState() async throws {
        let h = try H()
        let base = "/emulator/v1/projects/\(H.project)"
        let registered = await h.call(
            "POST", "\(base)/registrations",
            json: ["registrations": [["token": H.token(1), "platform": "IOS", "app": "com.x"], ["token": H.token(2)]]])
        #expect(registered.jsonObject?["registered"] as? Int == 2)
        let subscribed = await h.call(
            "POST", "\(base)/topics/drifted/subscribers", json: ["tokens": [H.token(1), H.token(9)]])
        #expect(subscribed.jsonObject?["results"] as? [[String: String]] == [[:], ["error": "NOT_FOUND"]])
        let listed = await h.call("GET", "\(base)/topics/drifted/subscribers")
        #expect(listed.jsonObject?["subscribers"] as? [String] == [H.token(1)])
        let topics = await h.call("GET", "\(base)/topics")
        #expect((topics.jsonObject?["topics"] as? [[String: Any]])?.first?["subscribers"] as? Int == 1)

        #expect(await h.call("DELETE", "\(base)/registrations/\(H.token(1))").status == 200)
        let info = await h.call("GET", "\(base)/registrations/\(H.token(1))")
        #expect(info.jsonObject?["registered"] as? Bool == false)
        #expect(await h.call("GET", "\(base)/topics/drifted/subscribers").jsonObject?["subscribers"] as? [String] == [])

        let config = await h.call(
            "PUT", "/emulator/v1/config",
            json: ["faults": ["http_429": 0.5, "seed": 3], "rate_limit": ["per_second": 100, "unit": "requests"]])
        #expect(config.status == 200)
        #expect(h.emulator.control.faults.http429 == 0.5)
        #expect(h.emulator.control.rateLimit == RateLimitSettings(perSecond: 100, unit: .requests))
        let invalid = await h.call("PUT", "/emulator/v1/config", json: ["faults": ["http_500": 2]])
        #expect(invalid.status == 400)

        let account = await h.call("POST", "/emulator/v1/projects/second/service-accounts", json: [:])
        #expect(account.jsonObject?["project_id"] as? String == "second")
        #expect(h.emulator.authority.projects.contains("second"))

        #expect(await h.call("POST", "/emulator/v1/reset").status == 200)
        #expect(await h.emulator.engine.registrations(project: H.project).isEmpty)
        #expect(h.emulator.control.faults == FaultSettings())
    }
}
