import Foundation
import Testing
import TidemarkCore

/// The shared wire types read what FCM sends (both casings where FCM's own docs disagree) and write
/// what the reference shows.
@Suite struct FCMWireTests {
    func data(_ text: String) -> Data { Data(text.utf8) }

    @Test func listPagesReadSnakeAndCamelCase() throws {
        let snake = try #require(
            FCMWire.decode(
                FCMWire.TopicSubscriptionPage.self,
                from: data(
                    """
                    {"topic_subscriptions":[{"name":"projects/p/registrations/r/topicSubscriptions/a","topic_name":"a",
                    "create_time":"2026-01-15T01:30:15.01Z"}],"next_page_token":"abc"}
                    """)))
        #expect(snake.topicSubscriptions.map(\.topicName) == ["a"] && snake.nextPageToken == "abc")
        let camel = try #require(
            FCMWire.decode(
                FCMWire.TopicSubscriptionPage.self,
                from: data(
                    """
                    {"topicSubscriptions":[{"topicName":"b","createTime":"2026-01-15T01:30:15Z"}],"nextPageToken":""}
                    """)))
        #expect(
            camel.topicSubscriptions.map(\.topicName) == ["b"] && camel.nextPageToken == nil,
            "an empty token is the last page")
        let empty = try #require(FCMWire.decode(FCMWire.TopicSubscriptionPage.self, from: data("{}")))
        #expect(empty.topicSubscriptions.isEmpty, "proto3 JSON leaves an empty list out")
        #expect(String(decoding: FCMWire.encode(empty), as: UTF8.self) == "{}")
        // A subscription without a topic name is not a subscription.
        #expect(
            FCMWire.decode(FCMWire.TopicSubscriptionPage.self, from: data(#"{"topic_subscriptions":[{"name":"x"}]}"#))
                == nil)
        // Nor is an HTML page.
        #expect(
            FCMWire.decode(FCMWire.TopicSubscriptionPage.self, from: data("<HTML><BODY>Not Found</BODY></HTML>")) == nil
        )
    }

    @Test func requestsAreWrittenAsTheReferenceShows() {
        #expect(
            String(decoding: FCMWire.encode(FCMWire.IIDBatchRequest(topic: "news", tokens: ["a", "b"])), as: UTF8.self)
                == #"{"registration_tokens":["a","b"],"to":"/topics/news"}"#)
        #expect(
            String(
                decoding: FCMWire.encode(FCMWire.GroupRequest(operation: .add, name: "g", key: "k", tokens: ["a"])),
                as: UTF8.self)
                == #"{"notification_key":"k","notification_key_name":"g","operation":"add","registration_ids":["a"]}"#)
        #expect(
            String(
                decoding: FCMWire.encode(FCMWire.SendRequest(message: FCMWire.Message(topic: "t"), validateOnly: true)),
                as: UTF8.self)
                == #"{"message":{"topic":"t"},"validate_only":true}"#)
    }

    @Test func errorsCarryTheirCodes() throws {
        let body = try #require(
            FCMWire.decode(
                FCMWire.ErrorBody.self,
                from: data(
                    """
                    {"error":{"code":404,"message":"Requested entity was not found.","status":"NOT_FOUND",
                    "details":[{"@type":"type.googleapis.com/google.firebase.fcm.v1.FcmError","errorCode":"UNREGISTERED"}]}}
                    """)))
        #expect(body.error.status == "NOT_FOUND" && body.error.fcmErrorCode == "UNREGISTERED")
        let written = FCMWire.ErrorBody(
            error: FCMWire.Status(
                code: 429, message: "m", status: "RESOURCE_EXHAUSTED",
                details: [.fcmError("QUOTA_EXCEEDED"), .quotaFailure(subject: "project:p", "per second")]))
        #expect(FCMWire.decode(FCMWire.ErrorBody.self, from: FCMWire.encode(written)) == written)
        #expect(FCMWire.decode(FCMWire.FlatError.self, from: data(#"{"error":"NotFound"}"#))?.error == "NotFound")
        #expect(FCMWire.decode(FCMWire.ErrorBody.self, from: data(#"{"error":"NotFound"}"#)) == nil)
    }

    @Test func iidBodies() throws {
        let results = try #require(
            FCMWire.decode(FCMWire.IIDBatchResponse.self, from: data(#"{"results":[{},{"error":"NOT_FOUND"}]}"#)))
        #expect(results.results.map(\.error) == [nil, "NOT_FOUND"])
        let info = try #require(
            FCMWire.decode(
                FCMWire.IIDInfo.self,
                from: data(
                    """
                    {"application":"com.example","scope":"*","rel":{"topics":{"a":{"addDate":"2015-07-30"}}}}
                    """)))
        #expect(info.rel?.topics.keys.sorted() == ["a"])
        #expect(FCMWire.decode(FCMWire.IIDInfo.self, from: data(#"{"application":"x"}"#))?.rel == nil)
    }
}
