import Foundation
import TidemarkCore

/// One HTTP request as the emulator's handlers see it: path split into percent-decoded segments.
///
/// Independent of the HTTP server, so every route is tested without a socket.
public struct WireRequest: Sendable {
    /// The HTTP method, upper case.
    public var method: String
    /// The path as sent, still percent-encoded.
    public var path: String
    /// Path segments, percent-decoded (`%3A` → `:`).
    public var segments: [String]
    /// Query parameters, percent-decoded; the first value wins.
    public var query: [String: String]
    /// Header fields by lowercased name.
    public var headers: [String: String]
    /// The body as sent.
    public var body: Data

    /// A request; `method` is upper-cased and `target` split into path and query.
    public init(method: String, target: String, headers: [String: String] = [:], body: Data = Data()) {
        self.method = method.uppercased()
        let parts = target.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false)
        path = String(parts[0])
        segments = path.split(separator: "/").map(Self.percentDecode)
        var query: [String: String] = [:]
        if parts.count > 1 {
            for pair in parts[1].split(separator: "&") {
                let kv = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
                let key = Self.formDecode(kv[0])
                if query[key] == nil { query[key] = kv.count > 1 ? Self.formDecode(kv[1]) : "" }
            }
        }
        self.query = query
        var lowered: [String: String] = [:]
        for (name, value) in headers { lowered[name.lowercased()] = value }
        self.headers = lowered
        self.body = body
    }

    /// Percent-decodes one path segment; a segment without `%` is taken as it is.
    static func percentDecode(_ text: Substring) -> String {
        guard text.utf8.contains(UInt8(ascii: "%")) else { return String(text) }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(text.utf8.count)
        var iterator = text.utf8.makeIterator()
        while let byte = iterator.next() {
            guard byte == UInt8(ascii: "%") else {
                bytes.append(byte)
                continue
            }
            guard let high = iterator.next(), let low = iterator.next(), let h = hexValue(high), let l = hexValue(low)
            else { return String(text) }
            bytes.append(h << 4 | l)
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    private static func hexValue(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): byte - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): byte - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): byte - UInt8(ascii: "A") + 10
        default: nil
        }
    }

    static func formDecode(_ text: Substring) -> String {
        percentDecode(text.contains("+") ? Substring(text.replacingOccurrences(of: "+", with: " ")) : text)
    }

    /// The first of several spellings of a query parameter (`topic_name` or `topicName`).
    public func queryValue(_ names: String...) -> String? {
        for name in names { if let value = query[name] { return value } }
        return nil
    }

    /// A boolean query parameter: `true` / `1` are true.
    public func queryFlag(_ names: String...) -> Bool {
        for name in names { if let value = query[name] { return value == "true" || value == "1" } }
        return false
    }
}

/// One HTTP response from the emulator's handlers.
public struct WireResponse: Sendable {
    /// The HTTP status.
    public var status: Int
    /// Header fields, in order.
    public var headers: [(String, String)]
    /// The body.
    public var body: Data
    /// Close the connection without answering (an injected fault).
    public var dropConnection = false

    /// A response with `status`, `headers` and `body`.
    public init(status: Int, headers: [(String, String)] = [], body: Data = Data()) {
        self.status = status
        self.headers = headers
        self.body = body
    }

    /// A JSON response; `object` is anything `JSONSerialization` takes.
    public static func json(_ status: Int, _ object: Any) -> WireResponse {
        let data = JSONWriter.data(object)
        return WireResponse(status: status, headers: [("Content-Type", "application/json; charset=UTF-8")], body: data)
    }

    /// A JSON response from a `Codable` value.
    public static func encoded(_ status: Int, _ value: some Encodable) -> WireResponse {
        let data = FCMWire.encode(value)
        return WireResponse(status: status, headers: [("Content-Type", "application/json; charset=UTF-8")], body: data)
    }

    /// Google's HTML error page, as its front end answers unauthenticated IID and device-group calls.
    public static func html(_ status: Int, title: String) -> WireResponse {
        let page = """
            <HTML>
            <HEAD>
            <TITLE>\(title)</TITLE>
            </HEAD>
            <BODY BGCOLOR="#FFFFFF" TEXT="#000000">
            <H1>\(title)</H1>
            <H2>Error \(status)</H2>
            </BODY>
            </HTML>

            """
        return WireResponse(
            status: status, headers: [("Content-Type", "text/html; charset=UTF-8")], body: Data(page.utf8))
    }

    /// A flat `{"error": "…"}` body, the shape of IID and device-group errors.
    public static func flatError(_ status: Int, _ text: String) -> WireResponse {
        encoded(status, FCMWire.FlatError(text))
    }

    /// A google.rpc.Status body, the shape of v1 errors (reference §3.3).
    package static func status(
        _ http: Int, _ status: String, _ message: String, fcmErrorCode: String? = nil,
        details extra: [FCMWire.ErrorDetail] = []
    ) -> WireResponse {
        var details = extra
        if let fcmErrorCode { details.insert(.fcmError(fcmErrorCode), at: 0) }
        return encoded(
            http,
            FCMWire.ErrorBody(
                error: FCMWire.Status(
                    code: http, message: message, status: status, details: details.isEmpty ? nil : details)))
    }

    /// The parsed JSON body, for tests.
    public var jsonObject: [String: Any]? { (try? JSONSerialization.jsonObject(with: body)) as? [String: Any] }

    /// The first header field named `name` (case-insensitive), if any.
    public func header(_ name: String) -> String? {
        headers.first { $0.0.lowercased() == name.lowercased() }?.1
    }
}
