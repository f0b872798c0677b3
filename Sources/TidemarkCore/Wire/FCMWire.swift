import Foundation

/// FCM's JSON on the wire (reference `fcm-wire-protocol.md`), one Codable type per body, shared by
/// tidemark's HTTP client and its emulator so the two cannot drift apart.
///
/// Decoding is tolerant where FCM is (snake_case and lowerCamel both read; unknown fields ignored);
/// encoding writes what the reference shows.
package enum FCMWire {
    /// A v1 error: google.rpc.Status in an `error` envelope (reference §3.3).
    package struct ErrorBody: Codable, Sendable, Equatable {
        package var error: Status

        package init(error: Status) { self.error = error }
    }

    package struct Status: Codable, Sendable, Equatable {
        package var code: Int
        package var message: String
        package var status: String
        package var details: [ErrorDetail]?

        package init(code: Int, message: String, status: String, details: [ErrorDetail]? = nil) {
            self.code = code
            self.message = message
            self.status = status
            self.details = details
        }

        /// The FcmError `errorCode` when a detail carries one (UNREGISTERED, …).
        package var fcmErrorCode: String? {
            details?.first { $0.type.hasSuffix("google.firebase.fcm.v1.FcmError") }?.errorCode
        }
    }

    /// One of google.rpc's detail messages (FcmError, BadRequest, ErrorInfo, QuotaFailure), told apart by `@type`.
    package struct ErrorDetail: Codable, Sendable, Equatable {
        package var type: String
        /// FcmError.
        package var errorCode: String?
        /// BadRequest: the offending fields.
        package var fieldViolations: [FieldViolation]?
        /// ErrorInfo.
        package var reason: String?
        package var domain: String?
        /// QuotaFailure.
        package var violations: [QuotaViolation]?

        package init(
            type: String, errorCode: String? = nil, fieldViolations: [FieldViolation]? = nil, reason: String? = nil,
            domain: String? = nil, violations: [QuotaViolation]? = nil
        ) {
            self.type = type
            self.errorCode = errorCode
            self.fieldViolations = fieldViolations
            self.reason = reason
            self.domain = domain
            self.violations = violations
        }

        package static func fcmError(_ code: String) -> ErrorDetail {
            ErrorDetail(type: "type.googleapis.com/google.firebase.fcm.v1.FcmError", errorCode: code)
        }

        package static func badRequest(field: String, _ description: String) -> ErrorDetail {
            ErrorDetail(
                type: "type.googleapis.com/google.rpc.BadRequest",
                fieldViolations: [FieldViolation(field: field, description: description)])
        }

        package static func errorInfo(reason: String, domain: String) -> ErrorDetail {
            ErrorDetail(type: "type.googleapis.com/google.rpc.ErrorInfo", reason: reason, domain: domain)
        }

        package static func quotaFailure(subject: String, _ description: String) -> ErrorDetail {
            ErrorDetail(
                type: "type.googleapis.com/google.rpc.QuotaFailure",
                violations: [QuotaViolation(subject: subject, description: description)])
        }

        enum CodingKeys: String, CodingKey {
            case type = "@type"
            case errorCode, fieldViolations, reason, domain, violations
        }
    }

    package struct FieldViolation: Codable, Sendable, Equatable {
        package var field: String
        package var description: String

        package init(field: String, description: String) {
            self.field = field
            self.description = description
        }
    }

    package struct QuotaViolation: Codable, Sendable, Equatable {
        package var subject: String
        package var description: String

        package init(subject: String, description: String) {
            self.subject = subject
            self.description = description
        }
    }

    /// An IID or device-group error: a flat `{"error": "…"}`.
    package struct FlatError: Codable, Sendable, Equatable {
        package var error: String

        package init(_ error: String) { self.error = error }
    }

    // MARK: - v1 topic subscriptions (reference §8)

    package struct TopicSubscription: Codable, Sendable, Equatable {
        /// `projects/P/registrations/R/topicSubscriptions/T`.
        package var name: String?
        package var topicName: String
        /// RFC 3339.
        package var createTime: String?

        package init(name: String?, topicName: String, createTime: String?) {
            self.name = name
            self.topicName = topicName
            self.createTime = createTime
        }

        enum CodingKeys: String, CodingKey {
            case name
            case topicName = "topic_name"
            case createTime = "create_time"
        }

        enum CamelKeys: String, CodingKey { case topicName, createTime }

        package init(from decoder: any Decoder) throws {
            let snake = try decoder.container(keyedBy: CodingKeys.self)
            let camel = try decoder.container(keyedBy: CamelKeys.self)
            name = try snake.decodeIfPresent(String.self, forKey: .name)
            guard
                let topic = try snake.decodeIfPresent(String.self, forKey: .topicName)
                    ?? camel.decodeIfPresent(String.self, forKey: .topicName)
            else {
                throw DecodingError.keyNotFound(
                    CodingKeys.topicName, .init(codingPath: decoder.codingPath, debugDescription: "no topic_name"))
            }
            topicName = topic
            createTime =
                try snake.decodeIfPresent(String.self, forKey: .createTime)
                ?? camel.decodeIfPresent(String.self, forKey: .createTime)
        }
    }

    /// One page of a registration's subscriptions; no `next_page_token` means the last page.
    package struct TopicSubscriptionPage: Codable, Sendable, Equatable {
        package var topicSubscriptions: [TopicSubscription]
        package var nextPageToken: String?

        package init(topicSubscriptions: [TopicSubscription], nextPageToken: String?) {
            self.topicSubscriptions = topicSubscriptions
            self.nextPageToken = nextPageToken
        }

        enum CodingKeys: String, CodingKey {
            case topicSubscriptions = "topic_subscriptions"
            case nextPageToken = "next_page_token"
        }

        enum CamelKeys: String, CodingKey { case topicSubscriptions, nextPageToken }

        package init(from decoder: any Decoder) throws {
            let snake = try decoder.container(keyedBy: CodingKeys.self)
            let camel = try decoder.container(keyedBy: CamelKeys.self)
            // An empty list may be omitted, as proto3 JSON omits empty repeated fields.
            topicSubscriptions =
                try snake.decodeIfPresent([TopicSubscription].self, forKey: .topicSubscriptions)
                ?? camel.decodeIfPresent([TopicSubscription].self, forKey: .topicSubscriptions) ?? []
            let token =
                try snake.decodeIfPresent(String.self, forKey: .nextPageToken)
                ?? camel.decodeIfPresent(String.self, forKey: .nextPageToken)
            nextPageToken = token?.isEmpty == true ? nil : token
        }

        package func encode(to encoder: any Encoder) throws {
            var container = encoder.container(keyedBy: CodingKeys.self)
            // proto3 JSON leaves an empty repeated field out.
            if !topicSubscriptions.isEmpty { try container.encode(topicSubscriptions, forKey: .topicSubscriptions) }
            try container.encodeIfPresent(nextPageToken, forKey: .nextPageToken)
        }
    }

    // MARK: - Instance ID (reference §1)

    /// `POST iid/v1:batchAdd` and `:batchRemove`.
    package struct IIDBatchRequest: Codable, Sendable, Equatable {
        /// `/topics/NAME`.
        package var to: String
        package var registrationTokens: [String]

        package init(topic: String, tokens: [String]) {
            to = "/topics/\(topic)"
            registrationTokens = tokens
        }

        enum CodingKeys: String, CodingKey {
            case to
            case registrationTokens = "registration_tokens"
        }
    }

    /// One result per token, in the order sent; `error` absent means done.
    package struct IIDBatchResponse: Codable, Sendable, Equatable {
        package var results: [IIDResult]

        package init(results: [IIDResult]) { self.results = results }
    }

    package struct IIDResult: Codable, Sendable, Equatable {
        package var error: String?

        package init(error: String? = nil) { self.error = error }
    }

    /// `GET iid/info/TOKEN?details=true`.
    package struct IIDInfo: Codable, Sendable, Equatable {
        package var application: String?
        package var authorizedEntity: String?
        package var platform: String?
        package var scope: String?
        package var applicationVersion: String?
        /// Absent when the token has no topics.
        package var rel: Relations?

        package init(
            application: String?, authorizedEntity: String?, platform: String?, scope: String?,
            applicationVersion: String?, rel: Relations?
        ) {
            self.application = application
            self.authorizedEntity = authorizedEntity
            self.platform = platform
            self.scope = scope
            self.applicationVersion = applicationVersion
            self.rel = rel
        }

        /// Whether the body describes an instance at all (FCM always names its app and sender): an
        /// empty object from something else is not a registration without topics.
        package var describesAnInstance: Bool { application != nil || authorizedEntity != nil }

        package struct Relations: Codable, Sendable, Equatable {
            package var topics: [String: TopicRelation]

            package init(topics: [String: TopicRelation]) { self.topics = topics }
        }

        package struct TopicRelation: Codable, Sendable, Equatable {
            /// `YYYY-MM-DD`.
            package var addDate: String

            package init(addDate: String) { self.addDate = addDate }
        }
    }

    // MARK: - Device groups (reference §2)

    package enum GroupOperation: String, Codable, Sendable {
        case create, add, remove
    }

    /// `POST fcm/notification`.
    package struct GroupRequest: Codable, Sendable, Equatable {
        package var operation: GroupOperation
        package var notificationKeyName: String?
        package var notificationKey: String?
        package var registrationIDs: [String]

        package init(operation: GroupOperation, name: String?, key: String? = nil, tokens: [String]) {
            self.operation = operation
            notificationKeyName = name
            notificationKey = key
            registrationIDs = tokens
        }

        enum CodingKeys: String, CodingKey {
            case operation
            case notificationKeyName = "notification_key_name"
            case notificationKey = "notification_key"
            case registrationIDs = "registration_ids"
        }
    }

    /// A group's key: the answer to create, add, remove and the look-up by name.
    package struct GroupKey: Codable, Sendable, Equatable {
        package var notificationKey: String

        package init(_ key: String) { notificationKey = key }

        enum CodingKeys: String, CodingKey { case notificationKey = "notification_key" }
    }

    // MARK: - OAuth2 (reference §4)

    package struct AccessToken: Codable, Sendable, Equatable {
        package var accessToken: String
        package var expiresIn: Int?
        package var tokenType: String?

        package init(accessToken: String, expiresIn: Int?, tokenType: String? = "Bearer") {
            self.accessToken = accessToken
            self.expiresIn = expiresIn
            self.tokenType = tokenType
        }

        enum CodingKeys: String, CodingKey {
            case accessToken = "access_token"
            case expiresIn = "expires_in"
            case tokenType = "token_type"
        }
    }

    package struct OAuthError: Codable, Sendable, Equatable {
        package var error: String
        package var errorDescription: String?

        package init(error: String, errorDescription: String?) {
            self.error = error
            self.errorDescription = errorDescription
        }

        enum CodingKeys: String, CodingKey {
            case error
            case errorDescription = "error_description"
        }
    }

    /// The answer of Google's Security Token Service (`POST sts.googleapis.com/v1/token`, RFC 8693
    /// token exchange): a federated access token for a workload identity.
    package struct STSToken: Codable, Sendable, Equatable {
        package var accessToken: String
        package var issuedTokenType: String?
        package var tokenType: String?
        package var expiresIn: Int?

        package init(accessToken: String, expiresIn: Int?) {
            self.accessToken = accessToken
            self.issuedTokenType = "urn:ietf:params:oauth:token-type:access_token"
            self.tokenType = "Bearer"
            self.expiresIn = expiresIn
        }

        enum CodingKeys: String, CodingKey {
            case accessToken = "access_token"
            case issuedTokenType = "issued_token_type"
            case tokenType = "token_type"
            case expiresIn = "expires_in"
        }
    }

    /// `POST iamcredentials.googleapis.com/v1/projects/-/serviceAccounts/EMAIL:generateAccessToken`.
    package struct GenerateAccessTokenRequest: Codable, Sendable, Equatable {
        package var scope: [String]
        package var lifetime: String?

        package init(scope: [String], lifetime: String? = "3600s") {
            self.scope = scope
            self.lifetime = lifetime
        }
    }

    /// Its answer: a service account's access token and when it expires (RFC 3339).
    package struct GeneratedAccessToken: Codable, Sendable, Equatable {
        package var accessToken: String
        package var expireTime: String

        package init(accessToken: String, expireTime: String) {
            self.accessToken = accessToken
            self.expireTime = expireTime
        }
    }

    // MARK: - Send (reference §6)

    /// `POST v1/projects/P/messages:send`.
    package struct SendRequest: Codable, Sendable, Equatable {
        package var message: Message
        package var validateOnly: Bool?

        package init(message: Message, validateOnly: Bool? = nil) {
            self.message = message
            self.validateOnly = validateOnly
        }

        enum CodingKeys: String, CodingKey {
            case message
            case validateOnly = "validate_only"
        }
    }

    /// A message to one target: a token, a topic or a condition.
    package struct Message: Codable, Sendable, Equatable {
        package var token: String?
        package var topic: String?
        package var condition: String?
        package var notification: Notification?
        package var data: [String: String]?

        package init(
            token: String? = nil, topic: String? = nil, condition: String? = nil, notification: Notification? = nil,
            data: [String: String]? = nil
        ) {
            self.token = token
            self.topic = topic
            self.condition = condition
            self.notification = notification
            self.data = data
        }
    }

    package struct Notification: Codable, Sendable, Equatable {
        package var title: String?
        package var body: String?

        package init(title: String?, body: String?) {
            self.title = title
            self.body = body
        }
    }

    /// The answer to a send: the message's resource name.
    package struct SendResponse: Codable, Sendable, Equatable {
        package var name: String

        package init(name: String) { self.name = name }
    }

    // MARK: - Coding

    /// The encoder for bodies: sorted keys, slashes unescaped (as Google's front ends write them).
    package static var encoder: JSONEncoder {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return encoder
    }

    package static func encode(_ value: some Encodable) -> Data {
        // The wire types hold only strings, numbers and arrays of them: encoding cannot fail.
        (try? encoder.encode(value)) ?? Data("{}".utf8)
    }

    /// `T` when `data` is a JSON body of that shape, nil otherwise.
    package static func decode<T: Decodable>(_ type: T.Type, from data: Data) -> T? {
        try? JSONDecoder().decode(type, from: data)
    }
}
