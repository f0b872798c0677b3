import Foundation
import Yams

/// One webhook of `serve.notify` in tidemark.yaml: where `tidemark serve` sends its events, which
/// ones, and the secret they are signed with.
///
/// ```yaml
/// serve:
///   notify:
///     - name: oncall
///       url_env: ONCALL_WEBHOOK_URL          # or url: https://hooks.example.com/tidemark
///       secret_env: TIDEMARK_WEBHOOK_SECRET  # HMAC-SHA256 key; the variable, never the secret
///       events: [blocked, apply_failed, recovered]
///       workspaces: [prod]
///       renotify: 4h
/// ```
public struct NotifyTarget: Sendable, Equatable {
    /// What `serve` tells a webhook about.
    public enum Event: String, Sendable, CaseIterable, Codable {
        /// A drift check found memberships FCM lost or gained that no apply planned (`drift: warn`).
        case driftFound = "drift_found"
        /// A reconcile corrected drift (`drift: heal`).
        case driftHealed = "drift_healed"
        /// A reconcile failed.
        case applyFailed = "apply_failed"
        /// A rail refused the plan: nothing was applied.
        case blocked
        /// Changes are planned and wait for a person (`on_change: plan`).
        case changesWaiting = "changes_waiting"
        /// The project uses something FCM turns down on 29 September 2027 (device groups, the
        /// Instance ID API).
        case deadlineApproaching = "deadline_approaching"
        /// A workspace that failed or was blocked reconciled again.
        case recovered
    }

    /// How the target is named in the log and in `tidemark_notifications_total` (`name:`; by default
    /// `url_env`'s variable, or the URL's host: never its path, which often holds a secret).
    public var name: String
    /// Where it is written, for messages.
    public var location: SourceLocation
    /// `url:` the address, written in tidemark.yaml.
    public var url: String?
    /// `url_env:` the environment variable that holds the address.
    public var urlEnv: String?
    /// `secret_env:` the environment variable that holds the HMAC-SHA256 key the bodies are signed with.
    public var secretEnv: String
    /// `events:` what it is sent; all of them when the entry does not say.
    public var events: Set<Event> = Set(Event.allCases)
    /// `workspaces:` the workspaces it hears of; nil: all.
    public var workspaces: [String]?
    /// `renotify:` an ongoing problem is sent again after this long (default 4 hours).
    public var renotify: Duration = .seconds(4 * 3600)
    /// `signature:` how deliveries are signed.
    public var signature: Signature = .tidemark

    /// How a delivery is signed.
    public enum Signature: String, Sendable, CaseIterable {
        /// `X-Tidemark-Signature: sha256=HEX`, HMAC-SHA256 of `TIMESTAMP.BODY` under the secret as written.
        case tidemark
        /// Standard Webhooks (standardwebhooks.com): `webhook-id`, `webhook-timestamp` and
        /// `webhook-signature: v1,BASE64`, HMAC-SHA256 of `ID.TIMESTAMP.BODY` under each secret of
        /// `secret_env` (`whsec_…`, space-separated, so a rotation signs with the old and the new).
        case standard
    }

    /// A target named `name`, written at `location`, sending to `url` (or the address in `urlEnv`)
    /// signed with the secret in `secretEnv`; every event, every workspace, renotified after 4 hours.
    public init(
        name: String, location: SourceLocation, url: String? = nil, urlEnv: String? = nil, secretEnv: String
    ) {
        self.name = name
        self.location = location
        self.url = url
        self.urlEnv = urlEnv
        self.secretEnv = secretEnv
    }

    /// Whether it hears of `event` in `workspace`.
    public func wants(_ event: Event, workspace: String) -> Bool {
        events.contains(event) && (workspaces?.contains(workspace) ?? true)
    }

    /// The keys an entry of `serve.notify` may hold.
    public static let keys = ["name", "url", "url_env", "secret_env", "events", "workspaces", "renotify", "signature"]

    /// Whether `text` can be an environment variable's name (letters, digits and `_`, not starting
    /// with a digit).
    public static func isVariableName(_ text: String) -> Bool {
        text.first.map { $0 == "_" || ($0.isASCII && $0.isLetter) } == true
            && text.allSatisfy { $0 == "_" || ($0.isASCII && ($0.isLetter || $0.isNumber)) }
    }

    /// The problem with `text` as a webhook's address, if any.
    public static func urlProblem(_ text: String) -> String? {
        guard let url = URL(string: text), let scheme = url.scheme?.lowercased(), ["http", "https"].contains(scheme),
            let host = url.host, !host.isEmpty
        else {
            return "must be an http:// or https:// address with a host"
        }
        return nil
    }

    /// Decodes the entry `node` of `serve.notify`, the `index`th; problems go to `doc`.
    static func decode(_ node: Node, index: Int, _ doc: inout YAMLDocument) -> NotifyTarget? {
        let what = "serve.notify[\(index)]"
        guard let pairs = doc.mapping(node, "an entry of 'serve.notify'", allowed: keys) else { return nil }
        var name: String?
        var url: String?
        var urlEnv: String?
        var secretEnv: String?
        var events: Set<Event>?
        var workspaces: [String]?
        var renotify: Duration?
        var signature: Signature?
        var broken = false
        for (key, _, value) in pairs {
            switch key {
            case "events":
                var chosen = Set<Event>()
                for (text, item) in doc.strings(value, "'\(what).events'") ?? [] {
                    if let event = Event(rawValue: text) {
                        chosen.insert(event)
                    } else {
                        let known = Event.allCases.map(\.rawValue)
                        let near = nearest(text, in: known).map { "; did you mean '\($0)'?" } ?? ""
                        doc.error(
                            "unknown event '\(text.escapedOnOneLine)' in '\(what).events'\(near) The events are \(known.joined(separator: ", ")).",
                            item)
                        broken = true
                    }
                }
                events = chosen
            case "workspaces":
                workspaces = (doc.strings(value, "'\(what).workspaces'") ?? []).map(\.0)
            default:
                guard let text = doc.string(value, "'\(what).\(key)'") else {
                    broken = true
                    continue
                }
                switch key {
                case "name": name = text
                case "url":
                    if let problem = urlProblem(text) {
                        doc.error(
                            "'\(what).url' \(problem), not '\(text.escapedOnOneLine)'; an address that holds a secret is better kept in a variable named by 'url_env'.",
                            value)
                        broken = true
                    } else {
                        url = text
                    }
                case "url_env", "secret_env":
                    guard isVariableName(text) else {
                        doc.error(
                            "'\(what).\(key)' names an environment variable (letters, digits and '_'), not '\(text.escapedOnOneLine)'; the variable holds the \(key == "url_env" ? "address" : "secret"), never tidemark.yaml.",
                            value)
                        broken = true
                        continue
                    }
                    if key == "url_env" { urlEnv = text } else { secretEnv = text }
                case "signature":
                    guard let chosen = Signature(rawValue: text) else {
                        doc.error(
                            "'\(what).signature' must be tidemark (X-Tidemark-Signature) or standard (Standard Webhooks), not '\(text.escapedOnOneLine)'.",
                            value)
                        broken = true
                        continue
                    }
                    signature = chosen
                default:  // renotify
                    guard let duration = ServeSettings.duration(text), duration >= .seconds(60) else {
                        doc.error(
                            "'\(what).renotify' must be a duration of at least 1m, such as 4h, not '\(text.escapedOnOneLine)'.",
                            value)
                        broken = true
                        continue
                    }
                    renotify = duration
                }
            }
        }
        if (url == nil) == (urlEnv == nil), !broken {
            doc.error(
                "an entry of 'serve.notify' needs exactly one of 'url' (the address) and 'url_env' (the variable that holds it).",
                node)
            return nil
        }
        guard let secretEnv else {
            if !broken {
                doc.error(
                    "an entry of 'serve.notify' needs 'secret_env': the environment variable that holds the key every event is signed with (HMAC-SHA256, header X-Tidemark-Signature), so that the receiver can tell tidemark's events from forged ones.",
                    node)
            }
            return nil
        }
        guard !broken else { return nil }
        var target = NotifyTarget(
            name: name ?? urlEnv ?? URL(string: url ?? "")?.host ?? "webhook", location: doc.location(node),
            url: url, urlEnv: urlEnv, secretEnv: secretEnv)
        if let events { target.events = events }
        target.workspaces = workspaces
        if let renotify { target.renotify = renotify }
        if let signature { target.signature = signature }
        return target
    }
}
