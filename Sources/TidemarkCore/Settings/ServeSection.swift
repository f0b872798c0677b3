import Foundation
import Yams

/// `serve:` in tidemark.yaml: the workspaces `tidemark serve` reconciles, each with where its state
/// and manifests are, which FCM project and credentials it uses, and what it may do on its own.
///
/// ```yaml
/// serve:
///   interval: 5m              # defaults for every workspace below
///   drift: heal
///   workspaces:
///     - name: prod
///       state: postgres://tidemark@db.internal/tidemark
///       manifests: manifests/prod
///       project: acme-prod
///       backend: fcm
///       credentials_env: PROD_GOOGLE_CREDENTIALS
///       max_unsubscribes: 2%
///     - name: staging
///       manifests: manifests/staging
///       on_change: plan
/// ```
public struct ServeSection: Sendable, Equatable {
    /// `source: {git: URL, branch: main, path: manifests}`: manifests that `serve` fetches itself with
    /// the `git` program, reconciling the branch's newest commit and naming it in statuses and events.
    /// Only the branch named is ever fetched, so only what was merged into it is applied.
    public struct GitSource: Sendable, Equatable {
        /// The repository: an https://, ssh:// or git:// URL, `user@host:path`, or a local path.
        public var url: String
        /// The branch (default `main`).
        public var branch = "main"
        /// The manifests directory inside the repository (default `manifests`; `.` for its root).
        public var path = "manifests"
        /// Where it is written, for messages.
        public var location: SourceLocation

        /// The branch `branch` of `url`, its manifests at `path`, written at `location`.
        public init(url: String, branch: String = "main", path: String = "manifests", location: SourceLocation) {
            self.url = url
            self.branch = branch
            self.path = path
            self.location = location
        }

        /// The URL as messages show it: without a password or token written into it.
        public var displayURL: String { GitSource.redact(url) }

        /// `url` as messages show it (`URLRedaction.display`): no password, token or query value.
        public static func redact(_ url: String) -> String { URLRedaction.display(url) }

        /// The keys `source:` may hold.
        public static let keys = ["git", "branch", "path"]

        static func decode(_ node: Node, _ what: String, _ doc: inout YAMLDocument) -> GitSource? {
            guard let pairs = doc.mapping(node, "'\(what)'", allowed: keys) else { return nil }
            guard let urlNode = pairs.first(where: { $0.key == "git" })?.value else {
                doc.error(
                    "'\(what)' must name the repository with 'git:', such as 'source: {git: https://github.com/acme/fcm-config, branch: main, path: manifests}'.",
                    node)
                return nil
            }
            guard let url = doc.string(urlNode, "'\(what).git'") else { return nil }
            if url.hasPrefix("-") || url.contains(where: { $0.isWhitespace || $0.isNewline }) {
                doc.error(
                    "'\(what).git' must be a repository URL or path, not '\(url.escapedOnOneLine)'.", urlNode)
                return nil
            }
            var source = GitSource(url: url, location: doc.location(node))
            for (key, _, value) in pairs where key != "git" {
                guard let text = doc.string(value, "'\(what).\(key)'") else { return nil }
                if key == "branch" {
                    let bad =
                        text.hasPrefix("-") || text.hasPrefix("/") || text.hasSuffix("/") || text.hasSuffix(".lock")
                        || text.contains("..") || text.contains("@{")
                        || text.contains(where: {
                            $0.isWhitespace || "~^:?*[\\".contains($0) || $0.asciiValue.map { $0 < 32 } == true
                        })
                    if bad {
                        doc.error(
                            "'\(what).branch' is not a branch name git accepts: '\(text.escapedOnOneLine)'.", value)
                        return nil
                    }
                    source.branch = text
                } else {
                    let parts = text.split(separator: "/", omittingEmptySubsequences: true)
                    if text.hasPrefix("/") || parts.contains("..") || text.hasPrefix("-") {
                        doc.error(
                            "'\(what).path' must be a directory inside the repository, such as 'manifests' or '.', not '\(text.escapedOnOneLine)'.",
                            value)
                        return nil
                    }
                    source.path = parts.isEmpty ? "." : parts.joined(separator: "/")
                }
            }
            return source
        }
    }

    /// One workspace `serve` reconciles.
    public struct Workspace: Sendable, Equatable {
        /// The workspace's name in state (`name:`).
        public var name: String
        /// Where the entry is written, for messages.
        public var location: SourceLocation
        /// `state:` a SQLite path or a `postgres://` URL; nil: the project's state.
        public var state: String?
        /// `manifests:` the manifests directory, relative to the project; nil: the project's.
        public var manifests: String?
        /// `source:` manifests fetched from git instead of a directory (or the section's `source`).
        public var source: GitSource?
        /// `project:` the Firebase project id; nil: the project's.
        public var project: String?
        /// `backend:` nil: the project's.
        public var backend: BackendKind?
        /// `credentials_env:` the environment variable that holds the path of this workspace's
        /// service-account key (or external-account file); nil: the project's credentials.
        public var credentialsEnv: String?
        /// `refresh:` what its reconciles read; nil: the project's.
        public var refresh: RefreshMode?
        /// `refresh_budget:` nil: the project's.
        public var refreshBudget: RefreshBudget?
        /// The schedule and what it may do on its own.
        public var settings: ServeSettings
    }

    /// The workspaces, in the file's order; empty: the project's own workspace, with `defaults`.
    public var workspaces: [Workspace] = []
    /// The schedule keys written directly under `serve:`: every entry's defaults, and the settings of
    /// the project's own workspace when `workspaces:` lists none.
    public var defaults = ServeSettings()
    /// `notify:` the webhooks that hear of events.
    public var notify: [NotifyTarget] = []
    /// `source:` under `serve:`: manifests from git for the project's own workspace, and for every
    /// entry that names neither `manifests` nor a `source` of its own.
    public var source: GitSource?
    /// Where `serve:` is written.
    public var location: SourceLocation

    /// An empty section written at `location`.
    public init(location: SourceLocation) { self.location = location }

    /// The keys an entry of `serve.workspaces` may hold.
    public static let workspaceKeys =
        [
            "name", "state", "manifests", "source", "project", "backend", "credentials_env", "refresh",
            "refresh_budget",
        ] + scheduleKeys
    /// The keys that set what a workspace may do and when: under `serve:` they are every
    /// workspace's defaults; in an entry, its own.
    public static let scheduleKeys = [
        "interval", "jitter", "retry_interval", "degraded_after", "drift", "on_change", "max_unsubscribes", "suspend",
        "history_keep", "windows", "heal_outside_windows",
    ]

    /// The workspace named `name`, if the section lists it.
    public func workspace(_ name: String) -> Workspace? { workspaces.first { $0.name == name } }

    /// Decodes `serve:` from `node`; problems go to `doc`.
    static func decode(_ node: Node, _ doc: inout YAMLDocument) -> ServeSection {
        var section = ServeSection(location: doc.location(node))
        guard let pairs = doc.mapping(node, "'serve'", allowed: ["workspaces", "notify", "source"] + scheduleKeys)
        else {
            return section
        }
        var defaults = ServeSettings()
        if let source = pairs.first(where: { $0.key == "source" })?.value {
            section.source = GitSource.decode(source, "serve.source", &doc)
        }
        for (key, _, value) in pairs where !["workspaces", "notify", "source"].contains(key) {
            decodeSchedule(key, value, into: &defaults, &doc, prefix: "serve.")
        }
        section.defaults = defaults
        if let list = pairs.first(where: { $0.key == "notify" })?.value {
            for (index, item) in (doc.sequence(list, "'serve.notify'") ?? []).enumerated() {
                if let target = NotifyTarget.decode(item, index: index, &doc) { section.notify.append(target) }
            }
        }
        guard let list = pairs.first(where: { $0.key == "workspaces" })?.value else {
            // No list: the project's own workspace, with the settings written under `serve:`.
            return section
        }
        for item in doc.sequence(list, "'serve.workspaces'") ?? [] {
            guard var entry = decodeWorkspace(item, defaults: defaults, &doc) else { continue }
            if entry.manifests == nil, entry.source == nil { entry.source = section.source }
            if let earlier = section.workspaces.first(where: { $0.name == entry.name }) {
                doc.error(
                    "workspace '\(entry.name)' is listed twice under 'serve.workspaces' (first at line \(earlier.location.line)); each workspace is reconciled by one entry.",
                    item)
                continue
            }
            section.workspaces.append(entry)
        }
        if section.workspaces.isEmpty, !doc.diagnostics.hasErrors {
            doc.error(
                "'serve.workspaces' lists no workspace; list at least one, or leave 'workspaces:' out to reconcile the project's own workspace.",
                list)
        }
        let names = Set(section.workspaces.map(\.name))
        for target in section.notify {
            for name in target.workspaces ?? [] where !names.contains(name) {
                doc.diagnostics.append(
                    Diagnostic(
                        .error,
                        "'serve.notify' entry '\(target.name)' names workspace '\(name.escapedOnOneLine)', which 'serve.workspaces' does not list; it lists \(section.workspaces.map(\.name).joined(separator: ", ")).",
                        at: target.location))
            }
        }
        return section
    }

    private static func decodeWorkspace(
        _ node: Node, defaults: ServeSettings, _ doc: inout YAMLDocument
    ) -> Workspace? {
        guard let pairs = doc.mapping(node, "an entry of 'serve.workspaces'", allowed: workspaceKeys) else {
            return nil
        }
        guard let nameNode = pairs.first(where: { $0.key == "name" })?.value else {
            doc.error("an entry of 'serve.workspaces' has no 'name'; name the workspace, such as 'name: prod'.", node)
            return nil
        }
        guard let name = doc.string(nameNode, "'name'") else { return nil }
        if let problem = ProjectSettings.workspaceProblem(name) {
            doc.error("workspace 'name' \(problem)", nameNode)
            return nil
        }
        var entry = Workspace(name: name, location: doc.location(node), settings: defaults)
        let what = "serve.workspaces[\(name)]."
        for (key, _, value) in pairs where key != "name" {
            if scheduleKeys.contains(key) {
                decodeSchedule(key, value, into: &entry.settings, &doc, prefix: what)
                continue
            }
            if key == "source" {
                if pairs.contains(where: { $0.key == "manifests" }) {
                    doc.error(
                        "'\(what)source' and '\(what)manifests' both say where the manifests are; keep one.", value)
                    continue
                }
                entry.source = GitSource.decode(value, "\(what)source", &doc)
                continue
            }
            guard let text = doc.string(value, "'\(what)\(key)'") else { continue }
            switch key {
            case "state": entry.state = text
            case "manifests": entry.manifests = text
            case "project":
                if let problem = ProjectSettings.projectIDProblem(text) {
                    doc.error("'\(what)project' \(problem), not '\(text.escapedOnOneLine)'.", value)
                } else {
                    entry.project = text
                }
            case "backend":
                if let kind = BackendKind(rawValue: text) {
                    entry.backend = kind
                } else {
                    doc.error("unknown backend '\(text)' in '\(what)backend'; use embedded, emulator or fcm.", value)
                }
            case "credentials_env":
                if NotifyTarget.isVariableName(text) {
                    entry.credentialsEnv = text
                } else {
                    doc.error(
                        "'\(what)credentials_env' names an environment variable (letters, digits and '_'), such as PROD_GOOGLE_CREDENTIALS, not '\(text.escapedOnOneLine)'; the variable holds the path of the key file, never the key itself.",
                        value)
                }
            case "refresh":
                if let mode = RefreshMode(rawValue: text) {
                    entry.refresh = mode
                } else {
                    doc.error("'\(what)refresh' must be touched, sample, all or none, not '\(text)'.", value)
                }
            case "refresh_budget":
                do {
                    entry.refreshBudget = try RefreshBudget(parsing: text)
                } catch {
                    doc.error("'\(what)refresh_budget': \(error.description)", value)
                }
            default: break
            }
        }
        return entry
    }

    private static func decodeSchedule(
        _ key: String, _ value: Node, into settings: inout ServeSettings, _ doc: inout YAMLDocument, prefix: String
    ) {
        let what = "'\(prefix)\(key)'"
        switch key {
        case "suspend":
            if let flag = doc.bool(value, what) { settings.suspend = flag }
            return
        case "windows":
            settings.windows = ServeWindow.decodeList(value, "\(prefix)windows", &doc)
            return
        case "heal_outside_windows":
            if let flag = doc.bool(value, what) { settings.healOutsideWindows = flag }
            return
        case "history_keep":
            guard let text = value.scalar?.string, let keep = Int(text), keep >= 1 else {
                doc.error(
                    "\(what) must be a whole number of applies, at least 1 (such as 500), not \(YAMLDocument.kind(value)).",
                    value)
                return
            }
            settings.historyKeep = keep
            return
        case "max_unsubscribes":
            let text = value.scalar?.string ?? ""
            do {
                settings.maxUnsubscribes = try UnsubscribeLimit(parsing: text, setting: "\(prefix)max_unsubscribes")
            } catch {
                doc.error(error.description, value)
            }
            return
        default: break
        }
        guard let text = doc.string(value, what) else { return }
        switch key {
        case "interval", "jitter", "retry_interval", "degraded_after":
            guard let duration = ServeSettings.duration(text) else {
                doc.error("\(what) must be a duration such as 90s, 5m or 1h, not '\(text.escapedOnOneLine)'.", value)
                return
            }
            if key != "jitter", duration < .seconds(1) {
                doc.error("\(what) must be at least 1s, not '\(text)'.", value)
                return
            }
            switch key {
            case "interval": settings.interval = duration
            case "jitter": settings.jitter = duration
            case "degraded_after": settings.degradedAfter = duration
            default: settings.retryInterval = duration
            }
        case "drift":
            if let policy = ServeSettings.DriftPolicy(rawValue: text) {
                settings.drift = policy
            } else {
                doc.error("\(what) must be heal, warn or off, not '\(text.escapedOnOneLine)'.", value)
            }
        case "on_change":
            if let policy = ServeSettings.ChangePolicy(rawValue: text) {
                settings.onChange = policy
            } else {
                doc.error("\(what) must be apply or plan, not '\(text.escapedOnOneLine)'.", value)
            }
        default: break
        }
    }
}
