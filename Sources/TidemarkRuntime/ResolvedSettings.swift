import Foundation
import TidemarkCore
import TidemarkFCM
import TidemarkStore

/// Every setting of one run, decided: the flags win over the environment, the environment over
/// `tidemark.yaml`, and that over tidemark's defaults. `resolve` is the one place that rule lives;
/// it reads no file and no process state, so it is tested with plain values.
public struct ResolvedSettings: Sendable {
    /// Where state lives.
    public enum StateLocation: Sendable, Equatable {
        /// A file at this absolute path (SQLite).
        case file(path: String)
        /// A URL (`postgres://…`): its scheme, lowercased, picks the store (`StateStoreRegistry`).
        case url(scheme: String, text: String)
    }

    /// `tidemark.yaml` as read (its `inventory: FILE` merged in).
    public var project: ProjectSettings
    /// The flags the run was given.
    public var flags: RuntimeFlags
    /// The environment the run was given: sources read their `url_env` from it, HTTP its proxies.
    public var environment: [String: String]
    /// The project directory, absolute.
    public var root: String
    /// The manifests directory, absolute.
    public var manifestsPath: String
    /// The manifests directory as the user named it, for messages.
    public var manifestsDisplay: String
    /// Where state lives.
    public var state: StateLocation
    /// The PostgreSQL state, parsed, when `state` is a `postgres://` URL.
    public var postgres: PostgresURL?
    /// The state as configured (relative to the project, or absolute, or a URL).
    public var stateSpec: String
    /// What chose the state, for messages that ask to check it: `--state`, `TIDEMARK_STATE_URL`,
    /// `'state' in tidemark.yaml`, or the default.
    public var stateOrigin: String
    /// The SQLite state file; with PostgreSQL state, where the embedded backend's data still lives
    /// (`.tidemark/` in the project).
    public var statePath: String
    /// The state workspace: one per project and environment.
    public var workspace: String
    /// The backend: flag, else `tidemark.yaml`, else embedded.
    public var backend: BackendKind
    /// How topic changes reach FCM: flag, else `tidemark.yaml`, else v1.
    public var transport: TopicTransport
    /// The transport the project runs on when no flag is given.
    public var configuredTransport: TopicTransport
    /// `TIDEMARK_AS_OF`: the date the deadline rules see with the embedded and emulator backends.
    public var asOf: Date?
    /// `TIDEMARK_EMBEDDED_LATENCY_MS`: how slow the embedded backend answers (for tests and demos).
    public var embeddedLatency: Duration?
    /// The credentials file: `GOOGLE_APPLICATION_CREDENTIALS`, else `credentials` in tidemark.yaml.
    public var credentialsPath: String?
    /// `FCM_EMULATOR_HOST`, for the emulator backend.
    public var emulatorHost: String?
    /// FCM's base URLs for the fcm backend: the environment, else tidemark.yaml, else Google's.
    public var fcmEndpoints: FCMEndpoints
    /// Subscription changes per second: `--qps`, else `qps` in tidemark.yaml, else FCM's 3000.
    public var writeRate: Double
    /// What `writeRate` counts: tokens (the default) or requests.
    public var quotaUnit: QuotaUnit
    /// Reads per second while refreshing; nil for no limit.
    public var readRate: Double?
    /// `TIDEMARK_TRACE_PHASES=1`: each phase of a run is written to stderr with its time (`Runtime.traced`).
    public var tracePhases = false

    /// Decides every setting from `flags`, `environment` and `file` (tidemark.yaml as decoded);
    /// `workingDirectory` anchors relative flags. Throws a `RuntimeError` naming the value to change.
    public static func resolve(
        flags: RuntimeFlags, environment: [String: String], file: ProjectSettings, workingDirectory: String
    ) throws -> ResolvedSettings {
        let asOf = try Self.asOf(environment)
        let root = absolute(flags.directory, in: workingDirectory)
        let manifestsPath: String
        let manifestsDisplay: String
        if let manifests = flags.manifests {
            manifestsPath = absolute(manifests, in: workingDirectory)
            manifestsDisplay = manifests
        } else {
            let relative = file.manifests ?? "manifests"
            manifestsPath = absolute(relative, in: root)
            manifestsDisplay = display(flags.directory, relative)
        }
        if let inventoryFile = file.inventoryFile {
            let path = URL(fileURLWithPath: absolute(inventoryFile, in: root)).standardizedFileURL.path
            let manifests = URL(fileURLWithPath: manifestsPath).standardizedFileURL.path
            if path.hasPrefix(manifests + "/") {
                throw RuntimeError(
                    "\(file.inventoryFileLocation.map { "\($0): " } ?? "")the inventory file \(inventoryFile) is inside the manifests directory, which pull requests edit; sources that run SQL or a command must live in tidemark.yaml or a file beside it that is reviewed like it (CODEOWNERS)."
                )
            }
        }
        let (stateSpec, stateOrigin) =
            flags.state.map { ($0, "--state") }
            ?? environment["TIDEMARK_STATE_URL"].map { ($0, "TIDEMARK_STATE_URL") }
            ?? file.state.map { ($0, "'state' in tidemark.yaml") }
            ?? (".tidemark/state.db", "the default (no --state, TIDEMARK_STATE_URL or 'state' in tidemark.yaml)")
        let workspace = flags.workspace ?? file.workspace ?? "default"
        if let problem = ProjectSettings.workspaceProblem(workspace) { throw RuntimeError("--workspace \(problem)") }
        let state: StateLocation
        let statePath: String
        var postgres: PostgresURL?
        if let scheme = urlScheme(stateSpec) {
            state = .url(scheme: scheme, text: stateSpec)
            if PostgresURL.isPostgres(stateSpec.lowercased()) {
                do {
                    postgres = try PostgresURL(stateSpec, environment: environment)
                } catch {
                    throw RuntimeError(ErrorText.describe(error))
                }
            }
            // The embedded backend keeps its data in the project even when state lives on a server.
            statePath = (root as NSString).appendingPathComponent(".tidemark/state.db")
        } else {
            statePath = absolute(stateSpec, in: root)
            state = .file(path: statePath)
        }
        let backend = flags.backend ?? file.backend ?? .embedded
        var embeddedLatency: Duration?
        if backend == .embedded, let text = environment["TIDEMARK_EMBEDDED_LATENCY_MS"] {
            guard let millis = Int(text), millis >= 0 else {
                throw RuntimeError(
                    "TIDEMARK_EMBEDDED_LATENCY_MS must be a whole number of milliseconds, not '\(text)'.")
            }
            embeddedLatency = .milliseconds(millis)
        }
        var credentialsPath: String?
        if let path = environment["GOOGLE_APPLICATION_CREDENTIALS"], !path.isEmpty {
            credentialsPath = path
        } else if let path = file.credentials {
            credentialsPath = absolute(path, in: root)
        }
        let writeRate = flags.qps ?? file.qps ?? Double(FCMLimits.defaultQuota)
        return ResolvedSettings(
            project: file, flags: flags, environment: environment, root: root, manifestsPath: manifestsPath,
            manifestsDisplay: manifestsDisplay, state: state, postgres: postgres, stateSpec: stateSpec,
            stateOrigin: stateOrigin, statePath: statePath,
            workspace: workspace, backend: backend, transport: flags.transport ?? file.transport ?? .v1,
            configuredTransport: file.transport ?? .v1, asOf: asOf, embeddedLatency: embeddedLatency,
            credentialsPath: credentialsPath,
            emulatorHost: environment["FCM_EMULATOR_HOST"].flatMap { $0.isEmpty ? nil : $0 },
            fcmEndpoints: FCMEndpoints(
                fcm: environment["TIDEMARK_FCM_URL"] ?? file.fcmURL ?? FCMEndpoints.google.fcm,
                iid: environment["TIDEMARK_IID_URL"] ?? file.iidURL ?? FCMEndpoints.google.iid),
            writeRate: writeRate, quotaUnit: flags.qpsUnit ?? file.qpsUnit ?? .tokens,
            readRate: flags.readQPS ?? file.readQPS, tracePhases: environment["TIDEMARK_TRACE_PHASES"] == "1")
    }

    /// `TIDEMARK_AS_OF` (YYYY-MM-DD), nil when unset or empty.
    static func asOf(_ environment: [String: String]) throws -> Date? {
        guard let text = environment["TIDEMARK_AS_OF"], !text.isEmpty else { return nil }
        guard let day = FCMDeadlines.parseDay(text) else {
            throw RuntimeError("TIDEMARK_AS_OF must be a date such as 2027-10-01, not '\(text)'.")
        }
        return day
    }

    /// The scheme of `text` when it is a URL (`scheme://…`, the scheme letters, digits, `+`, `-` and
    /// `.` after a letter), lowercased; nil for a file path.
    static func urlScheme(_ text: String) -> String? {
        guard let end = text.range(of: "://") else { return nil }
        let scheme = text[..<end.lowerBound]
        guard let first = scheme.first, first.isASCII, first.isLetter,
            scheme.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || "+-.".contains($0)) })
        else { return nil }
        return scheme.lowercased()
    }

    /// `path` made absolute against `base`.
    static func absolute(_ path: String, in base: String) -> String {
        path.hasPrefix("/") ? path : (base as NSString).appendingPathComponent(path)
    }

    /// A path inside the project as the user sees it: under `-C DIR` when one was given.
    public static func display(_ directory: String, _ path: String) -> String {
        if path.hasPrefix("/") || directory == "." { return path }
        return (directory as NSString).appendingPathComponent(path)
    }

    /// A path inside the project as the user sees it.
    public func display(_ path: String) -> String { Self.display(flags.directory, path) }

    /// The state, for messages: the file or the server, and the workspace unless it is `default`.
    public var stateDisplay: String {
        if let postgres { return "\(postgres.display) (workspace \(workspace))" }
        if case .url(_, let text) = state { return "\(PostgresURL.redact(text)) (workspace \(workspace))" }
        let file = display(stateSpec)
        return workspace == "default" ? file : "\(file) (workspace \(workspace))"
    }

    /// Where an older tidemark kept a SQLite workspace other than `default`: a file of its own beside
    /// the state file (state.prod.db). The store moves it into the state file on first use.
    public var legacyWorkspacePath: String? {
        guard case .file = state, workspace != "default" else { return nil }
        let stem = (statePath as NSString).deletingPathExtension
        let suffix = (statePath as NSString).pathExtension
        return stem + "." + workspace + (suffix.isEmpty ? "" : "." + suffix)
    }

    /// FCM's deadlines as this run sees them: against the real date for the `fcm` backend; for the
    /// embedded backend and the emulator only against `TIDEMARK_AS_OF` when given, so the demo and
    /// tests keep working after 2027 (before it, and without it, they warn).
    public func deadlines(now: Date) -> DeadlineCheck {
        var check = DeadlineCheck(transport: transport, enforcedAt: backend == .fcm ? now : asOf, now: asOf ?? now)
        check.acknowledged = project.acknowledgedDeadlines
        return check
    }

    /// The shrink guard: `max_shrink` at the top of tidemark.yaml, and each source's own.
    public var shrinkGuard: ShrinkGuard {
        var guard_ = project.shrinkGuard
        for source in project.inventory {
            if let share = source.maxShrink { guard_.perSource[source.name] = share }
        }
        return guard_
    }

    /// The rate limiter's burst for `rate`: half a second's worth, at most one full batch. FCM's own
    /// bucket holds a second's worth: the other half absorbs requests that reach FCM closer together
    /// than they left (one runner's requests delayed, another's not), so pacing at the full rate is
    /// never answered 429.
    public static func writeBurst(_ rate: Double) -> Double { min(rate / 2, Double(FCMLimits.maxBatchTokens)) }

    /// The read limiter's burst: a second's worth, at most 100.
    public static func readBurst(_ rate: Double) -> Double { min(rate, 100) }
}
