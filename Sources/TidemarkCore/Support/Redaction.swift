import Foundation

/// Shortens registration tokens for human output: the last five characters and a short hash.
///
/// Enough to tell tokens apart and find one in an inventory, not enough to send to the device.
public enum Redaction {
    /// `…`, the token's last five characters, `#` and six hex digits of a hash of the whole token. A
    /// token already redacted stays as it is (a sealed plan's readable part renders as the plan does).
    public static func redact(_ token: String) -> String {
        if isRedacted(token) { return token }
        var hash: UInt32 = 2_166_136_261
        for byte in token.utf8 {
            hash = (hash ^ UInt32(byte)) &* 16_777_619
        }
        let hex = String(hash, radix: 16)
        let padded = String(repeating: "0", count: max(0, 8 - hex.count)) + hex
        return "…\(token.suffix(5))#\(padded.prefix(6))"
    }

    /// Whether `text` is what `redact` makes: `…`, five characters, `#` and six hex digits.
    public static func isRedacted(_ text: String) -> Bool {
        let characters = Array(text)
        guard characters.count == 13, characters[0] == "…", characters[6] == "#" else { return false }
        return characters[7...].allSatisfy(\.isHexDigit)
    }
}

/// Text quoted from a server's answer, made safe to print: a server that echoes its request (a token
/// endpoint quoting the assertion, a proxy quoting the body) must not put a credential in a CI log.
public enum QuotedAnswer {
    /// The most characters of an answer a message quotes.
    public static let limit = 300

    /// `text` with every one of `secrets` (as sent, and form-encoded) and anything shaped like a
    /// credential (a JWT, a Google access token, a password in a URL) replaced, control characters
    /// escaped, and cut to `limit` characters.
    public static func safe(_ text: String, hiding secrets: [String] = []) -> String {
        var out = text
        for secret in secrets where secret.count >= 4 {
            out = out.replacingOccurrences(of: secret, with: "[redacted]")
            var allowed = CharacterSet.alphanumerics
            allowed.insert(charactersIn: "-._~")
            if let encoded = secret.addingPercentEncoding(withAllowedCharacters: allowed), encoded != secret {
                out = out.replacingOccurrences(of: encoded, with: "[redacted]")
            }
        }
        out = replacing(
            in: out, pattern: #"eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*"#, with: "[redacted JWT]")
        out = replacing(in: out, pattern: #"ya29\.[A-Za-z0-9._-]+"#, with: "[redacted token]")
        out = replacing(in: out, pattern: #"(?<=://)[^/\s:@]*:[^/\s@]*@"#, with: "[redacted]@")
        out = replacing(
            in: out,
            pattern:
                #"(?i)((?:access_token|assertion|subject_token|client_secret|password|token|key|sig|signature)=)[^&\s"']+"#,
            with: "$1[redacted]")
        out = out.escapedOnOneLine
        if out.count > limit { out = String(out.prefix(limit)) + "…" }
        return out
    }

    static func replacing(in text: String, pattern: String, with template: String) -> String {
        guard let regex = try? NSRegularExpression(pattern: pattern) else { return text }
        return regex.stringByReplacingMatches(
            in: text, range: NSRange(text.startIndex..., in: text), withTemplate: template)
    }
}

/// The one way tidemark prints a URL it was given: a key file's `token_uri`, an external account's
/// subject token URL, a git repository, a database, FCM's or a webhook's address.
///
/// A URL may carry a credential in its user information (`https://user:PASSWORD@host/…`, or a token as
/// the user name) or in its query (`?sig=…`); neither is printed. The scheme, host, port, path and the
/// query's parameter names stay, so a message still says where tidemark went.
public enum URLRedaction {
    /// What stands in for a hidden part.
    public static let mask = "***"

    /// `url` with the password of its user information hidden (or the whole user information, when it
    /// is one word: a token as user name), every query value hidden and any fragment dropped. Text that
    /// is not a URL with `://` keeps everything but a query's values.
    public static func display(_ url: String) -> String {
        var rest = Substring(url)
        var out = ""
        if let scheme = rest.range(of: "://") {
            out += rest[..<scheme.upperBound]
            rest = rest[scheme.upperBound...]
            let authorityEnd = rest.firstIndex { $0 == "/" || $0 == "?" || $0 == "#" } ?? rest.endIndex
            let authority = rest[..<authorityEnd]
            if let at = authority.lastIndex(of: "@") {
                let userinfo = authority[..<at]
                if let colon = userinfo.firstIndex(of: ":") {
                    out += userinfo[..<colon] + ":" + mask
                } else {
                    out += mask
                }
                out += authority[at...]
            } else {
                out += authority
            }
            rest = rest[authorityEnd...]
        }
        if let hash = rest.firstIndex(of: "#") { rest = rest[..<hash] }
        guard let question = rest.firstIndex(of: "?") else { return out + rest }
        out += rest[..<question]
        let query = rest[rest.index(after: question)...]
        guard !query.isEmpty else { return out }
        let items = query.split(separator: "&", omittingEmptySubsequences: false).map { item -> String in
            guard let equals = item.firstIndex(of: "=") else { return item.isEmpty ? "" : mask }
            let value = item[item.index(after: equals)...]
            if readable.contains(item[..<equals].lowercased()), value.count <= 40,
                value.allSatisfy({ $0.isLetter || $0.isNumber || "-_.".contains($0) })
            {
                return String(item)
            }
            return item[..<equals] + "=" + mask
        }
        return out + "?" + items.joined(separator: "&")
    }

    /// Query parameters whose values say how to connect, never who: shown, so a redacted URL stays
    /// readable (`?sslmode=require&lease=5`). Every other value is hidden.
    static let readable: Set<String> = [
        "sslmode", "lease", "connect_timeout", "application_name", "target_session_attrs", "alt",
    ]

    /// The parts of `url` that `display` hides (a password, a user name that is a token, query values),
    /// as written and percent-decoded, for hiding them again where a server quotes its request back.
    public static func secrets(in url: String) -> [String] {
        var found: [String] = []
        var rest = Substring(url)
        if let scheme = rest.range(of: "://") {
            rest = rest[scheme.upperBound...]
            let authorityEnd = rest.firstIndex { $0 == "/" || $0 == "?" || $0 == "#" } ?? rest.endIndex
            let authority = rest[..<authorityEnd]
            if let at = authority.lastIndex(of: "@") {
                let userinfo = authority[..<at]
                if let colon = userinfo.firstIndex(of: ":") {
                    found.append(String(userinfo[userinfo.index(after: colon)...]))
                } else {
                    found.append(String(userinfo))
                }
            }
            rest = rest[authorityEnd...]
        }
        if let hash = rest.firstIndex(of: "#") {
            found.append(String(rest[rest.index(after: hash)...]))
            rest = rest[..<hash]
        }
        if let question = rest.firstIndex(of: "?") {
            for item in rest[rest.index(after: question)...].split(separator: "&") {
                let value = item.firstIndex(of: "=").map { item[item.index(after: $0)...] } ?? item
                found.append(String(value))
            }
        }
        let decoded = found.compactMap { $0.removingPercentEncoding }
        return Array(Set((found + decoded).filter { !$0.isEmpty }))
    }
}
