import Foundation
import Testing
import TidemarkCore
import TidemarkTesting

@testable import TidemarkEmulator

@Suite struct EmulatorTopicRouteTests {
    typealias H = EmulatorHarness

    @Test func v1CreateGetListDelete() async throws {
        let h = try H()
        let auth = h.bearer(try await h.accessToken())
        let reg = H.token(1)
        try await h.register([reg])

        let created = await h.call("POST", H.v1Path(reg) + "?topic_name=news", headers: auth, json: [:])
        #expect(created.status == 200)
        #expect(created.jsonObject?["topic_name"] as? String == "news")
        #expect(
            (created.jsonObject?["name"] as? String)?.hasSuffix("/registrations/\(reg)/topicSubscriptions/news") == true
        )
        #expect((created.jsonObject?["create_time"] as? String)?.hasSuffix("Z") == true)
        // Again: 409 ALREADY_EXISTS. The lowerCamel spelling of the parameter works too.
        let again = await h.call("POST", H.v1Path(reg) + "?topicName=news", headers: auth, json: [:])
        #expect(again.status == 409)
        #expect(again.errorStatus == "ALREADY_EXISTS")

        #expect(await h.call("GET", H.v1Path(reg, "news"), headers: auth).status == 200)
        #expect(await h.call("GET", H.v1Path(reg, "sports"), headers: auth).status == 404)

        #expect(await h.call("DELETE", H.v1Path(reg, "news"), headers: auth).status == 200)
        #expect(await h.call("DELETE", H.v1Path(reg, "news"), headers: auth).status == 404)
        #expect(await h.call("DELETE", H.v1Path(reg, "news") + "?allow_missing=true", headers: auth).status == 200)
        #expect(await h.call("DELETE", H.v1Path(reg, "news") + "?allowMissing=true", headers: auth).status == 200)

        // PATCH: an upsert only with allow_missing.
        #expect(await h.call("PATCH", H.v1Path(reg, "live"), headers: auth, json: [:]).status == 404)
        #expect(
            await h.call("PATCH", H.v1Path(reg, "live") + "?allow_missing=true", headers: auth, json: [:]).status == 200
        )
        #expect(await h.call("PATCH", H.v1Path(reg, "live"), headers: auth, json: [:]).status == 200)
    }

    @Test func v1ErrorsForRegistrationsAndTopics() async throws {
        let h = try H()
        let auth = h.bearer(try await h.accessToken())
        let unknown = H.token(99)
        let create = await h.call("POST", H.v1Path(unknown) + "?topic_name=news", headers: auth, json: [:])
        #expect(create.status == 404)
        #expect(await h.call("GET", H.v1Path(unknown), headers: auth).status == 404)
        let badTopic = await h.call("POST", H.v1Path(unknown) + "?topic_name=bad%2Ftopic", headers: auth, json: [:])
        #expect(badTopic.status == 400)
        #expect(badTopic.errorStatus == "INVALID_ARGUMENT")
        #expect(await h.call("POST", H.v1Path(unknown), headers: auth, json: [:]).status == 400)
    }

    @Test func v1ListPagesThroughEveryTopic() async throws {
        let h = try H()
        let auth = h.bearer(try await h.accessToken())
        let reg = H.token(2)
        try await h.register([reg])
        let topics = (0..<2500).map { String(format: "t%04d", $0) }
        _ = try await h.emulator.engine.batchAdd(project: H.project, topic: "solo", tokens: [reg])
        for topic in topics.prefix(1999) {
            _ = try await h.emulator.engine.batchAdd(project: H.project, topic: topic, tokens: [reg])
        }
        // The 2001st topic is refused.
        let over = await h.call("POST", H.v1Path(reg) + "?topic_name=one-too-many", headers: auth, json: [:])
        #expect(over.status == 400)
        #expect(over.text.contains("TOO_MANY_TOPICS"))

        var seen: [String] = []
        var pageToken: String?
        var pages = 0
        repeat {
            var path = H.v1Path(reg) + "?pageSize=3000"
            if let pageToken {
                path += "&pageToken=" + pageToken.addingPercentEncoding(withAllowedCharacters: .alphanumerics)!
            }
            if pages == 0 { path = H.v1Path(reg) }  // default page size: 1000
            let response = await h.call("GET", path, headers: auth)
            #expect(response.status == 200)
            let items = response.jsonObject?["topic_subscriptions"] as? [[String: Any]] ?? []
            #expect(items.count <= (pages == 0 ? 1000 : 2000))
            seen += items.compactMap { $0["topic_name"] as? String }
            pageToken = response.jsonObject?["next_page_token"] as? String
            pages += 1
        } while pageToken != nil && pages < 10
        #expect(pages == 2)
        #expect(seen == (Array(topics.prefix(1999)) + ["solo"]).sorted())
        #expect(await h.call("GET", H.v1Path(reg) + "?pageToken=garbage", headers: auth).status == 400)
    }

    @Test func iidBatchesGivePerTokenResultsInOrder() async throws {
        let h = try H()
        let headers = h.bearer(try await h.accessToken(), iid: true)
        try await h.register([H.token(1), H.token(3)])
        try await h.register([H.token(4)], project: "someone-else")
        let response = await h.call(
            "POST", "/iid/v1:batchAdd", headers: headers,
            json: [
                "to": "/topics/news",
                "registration_tokens": [H.token(1), H.token(2), H.token(3), H.token(4), "bad token"],
            ])
        #expect(response.status == 200)
        let results = response.jsonObject?["results"] as? [[String: String]]
        #expect(
            results == [[:], ["error": "NOT_FOUND"], [:], ["error": "INVALID_ARGUMENT"], ["error": "INVALID_ARGUMENT"]])

        let info = await h.call("GET", "/iid/info/\(H.token(1))?details=true", headers: headers)
        let rel = info.jsonObject?["rel"] as? [String: Any]
        let topics = rel?["topics"] as? [String: [String: String]]
        #expect(topics?["news"]?["addDate"]?.count == 10)
        #expect(info.jsonObject?["authorizedEntity"] as? String == FCMEmulator.projectNumber(of: H.project))
        #expect(await h.call("GET", "/iid/info/\(H.token(1))", headers: headers).jsonObject?["rel"] == nil)
        #expect(await h.call("GET", "/iid/\(H.token(1))?details=true", headers: headers).status == 200)
        let missing = await h.call("GET", "/iid/info/\(H.token(2))", headers: headers)
        #expect(missing.status == 404)
        #expect(missing.flatError == "No information found about this instance id.")

        let remove = await h.call(
            "POST", "/iid/v1:batchRemove", headers: headers,
            json: ["to": "/topics/news", "registration_tokens": [H.token(1), H.token(3)]])
        #expect(remove.jsonObject?["results"] as? [[String: String]] == [[:], [:]])
        #expect(await h.emulator.engine.subscribers(of: "news", project: H.project).isEmpty)

        #expect(await h.call("POST", "/iid/v1/\(H.token(1))/rel/topics/solo", headers: headers).status == 200)
        #expect(await h.emulator.engine.subscribers(of: "solo", project: H.project) == [H.token(1)])
    }

    @Test func iidWholeRequestErrors() async throws {
        let h = try H()
        let headers = h.bearer(try await h.accessToken(), iid: true)
        let badTopic = await h.call(
            "POST", "/iid/v1:batchAdd", headers: headers,
            json: ["to": "news", "registration_tokens": ["a:APA91b"]])
        #expect(badTopic.status == 400)
        #expect(badTopic.flatError == "Topic name format is invalid")
        let empty = await h.call(
            "POST", "/iid/v1:batchAdd", headers: headers,
            json: ["to": "/topics/news", "registration_tokens": [String]()])
        #expect(empty.flatError == "MissingIIdToken")
        let tooMany = await h.call(
            "POST", "/iid/v1:batchAdd", headers: headers,
            json: ["to": "/topics/news", "registration_tokens": (0...1000).map { H.token($0) }])
        #expect(tooMany.status == 400)

        // Switched off for the project, as for projects created after 1 Oct 2026.
        h.emulator.control.setIIDEnabled(false, project: H.project)
        let off = await h.call(
            "POST", "/iid/v1:batchAdd", headers: headers,
            json: ["to": "/topics/news", "registration_tokens": ["a:APA91b"]])
        #expect(off.status == 403)
    }

    @Test func rateLimitAnswers429WithRetryAfter() async throws {
        let clock = ManualClock()
        let h = try H(timing: clock.timing, rateLimit: 10)
        let auth = h.bearer(try await h.accessToken())
        let tokens = (0..<15).map { H.token($0) }
        try await h.register(tokens)
        var statuses: [Int] = []
        for token in tokens {
            statuses.append(await h.call("POST", H.v1Path(token) + "?topic_name=news", headers: auth, json: [:]).status)
        }
        #expect(statuses.filter { $0 == 200 }.count == 10)
        let limited = await h.call("POST", H.v1Path(tokens[14]) + "?topic_name=news", headers: auth, json: [:])
        #expect(limited.status == 429)
        #expect(limited.errorStatus == "RESOURCE_EXHAUSTED")
        #expect(limited.header("Retry-After") == "1")
        clock.advance(.seconds(1))
        #expect(await h.call("POST", H.v1Path(tokens[14]) + "?topic_name=news", headers: auth, json: [:]).status == 200)

        // IID over the limit: a whole-request 429, or per-token RESOURCE_EXHAUSTED inside a 200.
        let iid = h.bearer(try await h.accessToken(), iid: true)
        let batch: [String: Any] = ["to": "/topics/more", "registration_tokens": Array(tokens.prefix(12))]
        #expect(await h.call("POST", "/iid/v1:batchAdd", headers: iid, json: batch).status == 429)
        h.emulator.control.rateLimit = RateLimitSettings(perSecond: 10, answer: .perToken)
        #expect(await h.call("POST", "/iid/v1:batchAdd", headers: iid, json: batch).status == 200)  // a fresh bucket
        let perToken = await h.call("POST", "/iid/v1:batchAdd", headers: iid, json: batch)
        #expect(perToken.status == 200)
        #expect(
            (perToken.jsonObject?["results"] as? [[String: String]])?.allSatisfy { $0["error"] == "RESOURCE_EXHAUSTED" }
                == true)

        // In token units a batch costs its size; the bucket always admits one full batch eventually.
        var bucket = TokenBucket(rate: 3000, capacity: 3000, at: 0)
        #expect(bucket.take(1000, at: 0) == nil)
        #expect(bucket.take(1000, at: 0) == nil)
        #expect(bucket.take(1000, at: 0) == nil)
        let wait = bucket.take(1000, at: 0) ?? 0
        #expect(abs(wait - 1.0 / 3) < 1e-9)
        #expect(bucket.take(1000, at: wait) == nil)
    }

    @Test func seededFaultsRepeat() async throws {
        func draws(seed: UInt64) -> [EmulatorControl.Fault?] {
            let control = EmulatorControl()
            var faults = FaultSettings()
            faults.http429 = 0.3
            faults.http500 = 0.05
            faults.dropConnection = 0.05
            faults.seed = seed
            control.faults = faults
            return (0..<2000).map { _ in control.drawFault() }
        }
        let first = draws(seed: 7)
        #expect(first == draws(seed: 7))
        #expect(first != draws(seed: 8))
        let share429 = Double(first.filter { $0 == .status(429) }.count) / 2000
        #expect(abs(share429 - 0.3) < 0.05)
        #expect(first.contains(.drop))
    }

    @Test func injectedTokenFaultsAppearInBatchResults() async throws {
        let h = try H()
        let headers = h.bearer(try await h.accessToken(), iid: true)
        let tokens = (0..<200).map { H.token($0) }
        try await h.register(tokens)
        var faults = FaultSettings()
        faults.tokenInternal = 0.2
        h.emulator.control.faults = faults
        let response = await h.call(
            "POST", "/iid/v1:batchAdd", headers: headers,
            json: ["to": "/topics/news", "registration_tokens": tokens])
        let results = try #require(response.jsonObject?["results"] as? [[String: String]])
        let failed = tokens.indices.filter { results[$0]["error"] == "INTERNAL" }.map { tokens[$0] }
        #expect(failed.count > 10 && failed.count < 80)
        let subscribed = Set(await h.emulator.engine.subscribers(of: "news", project: H.project))
        #expect(subscribed == Set(tokens).subtracting(failed))
    }
}

@Suite struct EmulatorJSONTests {
    @Test func readerAgreesWithFoundation() throws {
        let samples = [
            #"{"to":"/topics/news","registration_tokens":["a:b","c\"d","\u00e9\ud83d\ude00"],"n":-12,"x":1.5e3,"t":true,"f":false,"z":null,"o":{"k":[1,"two",{}]},"e":[]}"#,
            #"  [ 1 , 2.25 , "x" ]  "#,
        ]
        for sample in samples {
            let ours = try #require(JSONReader.parse(Data(sample.utf8)))
            let theirs = try JSONSerialization.jsonObject(with: Data(sample.utf8), options: [.fragmentsAllowed])
            let a = try JSONSerialization.data(withJSONObject: ours, options: [.sortedKeys])
            let b = try JSONSerialization.data(withJSONObject: theirs, options: [.sortedKeys])
            #expect(String(decoding: a, as: UTF8.self) == String(decoding: b, as: UTF8.self))
            // And the writer round-trips it.
            let written = JSONWriter.data(ours)
            let reread = try JSONSerialization.jsonObject(with: written, options: [.fragmentsAllowed])
            #expect(try JSONSerialization.data(withJSONObject: reread, options: [.sortedKeys]) == b)
        }
        for broken in [#"{"a":}"#, #"{"a":1"#, #"["a",]"#, #""unterminated"#, "{} x", #"{"a":"\q"}"#, ""] {
            #expect(JSONReader.parse(Data(broken.utf8)) == nil, "\(broken)")
        }
        #expect((JSONReader.parse(Data(#"{"r":["x","y"]}"#.utf8)) as? [String: Any])?["r"] as? [String] == ["x", "y"])
    }
}
