import Foundation
import Testing
import TidemarkCore
import TidemarkFCM
import TidemarkRuntime
import TidemarkStore

/// The one precedence rule: a flag wins over the environment, the environment over tidemark.yaml,
/// and tidemark.yaml over the default; checked with plain values, no file and no process state.
/// (The project directory `.` resolves to `/work/.`, as it always has: paths are shown as given.)
@Suite struct ResolvedSettingsTests {
    static func resolve(
        _ flags: RuntimeFlags = RuntimeFlags(), _ environment: [String: String] = [:],
        _ file: ProjectSettings = ProjectSettings(), cwd: String = "/work"
    ) throws -> ResolvedSettings {
        try ResolvedSettings.resolve(flags: flags, environment: environment, file: file, workingDirectory: cwd)
    }

    static func flags(_ change: (inout RuntimeFlags) -> Void) -> RuntimeFlags {
        var flags = RuntimeFlags()
        change(&flags)
        return flags
    }

    static func file(_ change: (inout ProjectSettings) -> Void) -> ProjectSettings {
        var file = ProjectSettings()
        change(&file)
        return file
    }

    @Test func stateComesFromTheFlagThenTheEnvironmentThenTheFileThenTheDefault() throws {
        let fileState = Self.file { $0.state = "from-file.db" }
        let environment = ["TIDEMARK_STATE_URL": "/srv/from-env.db"]
        #expect(try Self.resolve().state == .file(path: "/work/./.tidemark/state.db"))
        #expect(try Self.resolve(RuntimeFlags(), [:], fileState).state == .file(path: "/work/./from-file.db"))
        #expect(try Self.resolve(RuntimeFlags(), environment, fileState).state == .file(path: "/srv/from-env.db"))
        let flagged = Self.flags { $0.state = "flag.db" }
        #expect(try Self.resolve(flagged, environment, fileState).state == .file(path: "/work/./flag.db"))
        // -C moves the project, and relative state with it.
        let moved = Self.flags { $0.directory = "app" }
        let resolved = try Self.resolve(moved, [:], fileState)
        #expect(resolved.state == .file(path: "/work/app/from-file.db"))
        #expect(resolved.stateDisplay == "app/from-file.db")
    }

    @Test func workspaceBackendAndTransportComeFromTheFlagThenTheFile() throws {
        let file = Self.file {
            $0.workspace = "staging"
            $0.backend = .emulator
            $0.transport = .iid
        }
        var resolved = try Self.resolve(RuntimeFlags(), [:], file)
        #expect(resolved.workspace == "staging")
        #expect(resolved.backend == .emulator)
        #expect(resolved.transport == .iid)
        #expect(resolved.stateDisplay == ".tidemark/state.db (workspace staging)")
        let flags = Self.flags {
            $0.workspace = "prod"
            $0.backend = .fcm
            $0.transport = .v1
        }
        resolved = try Self.resolve(flags, [:], file)
        #expect(resolved.workspace == "prod")
        #expect(resolved.backend == .fcm)
        #expect(resolved.transport == .v1)
        // The project's own transport is still known, for a plan that reads through the other.
        #expect(resolved.configuredTransport == .iid)
        let defaults = try Self.resolve()
        #expect(defaults.workspace == "default")
        #expect(defaults.backend == .embedded)
        #expect(defaults.transport == .v1)
        #expect(defaults.legacyWorkspacePath == nil)
        #expect(resolved.legacyWorkspacePath == "/work/./.tidemark/state.prod.db")
    }

    @Test func anInvalidWorkspaceIsRefusedNamingTheFlag() {
        let error = #expect(throws: RuntimeError.self) {
            try Self.resolve(Self.flags { $0.workspace = "../x" })
        }
        #expect(error?.description.hasPrefix("--workspace ") == true)
    }

    @Test func credentialsAndEndpointsComeFromTheEnvironmentThenTheFile() throws {
        let file = Self.file {
            $0.credentials = "keys/sa.json"
            $0.fcmURL = "https://fcm-proxy.internal"
        }
        var resolved = try Self.resolve(RuntimeFlags(), [:], file)
        #expect(resolved.credentialsPath == "/work/./keys/sa.json")
        #expect(resolved.fcmEndpoints == FCMEndpoints(fcm: "https://fcm-proxy.internal", iid: FCMEndpoints.google.iid))
        resolved = try Self.resolve(
            RuntimeFlags(),
            [
                "GOOGLE_APPLICATION_CREDENTIALS": "/secrets/key.json", "TIDEMARK_FCM_URL": "http://127.0.0.1:1",
                "TIDEMARK_IID_URL": "http://127.0.0.1:2", "FCM_EMULATOR_HOST": "127.0.0.1:9099",
            ], file)
        #expect(resolved.credentialsPath == "/secrets/key.json")
        #expect(resolved.fcmEndpoints == FCMEndpoints(fcm: "http://127.0.0.1:1", iid: "http://127.0.0.1:2"))
        #expect(resolved.emulatorHost == "127.0.0.1:9099")
        // An empty variable is as good as none.
        resolved = try Self.resolve(RuntimeFlags(), ["GOOGLE_APPLICATION_CREDENTIALS": "", "FCM_EMULATOR_HOST": ""])
        #expect(resolved.credentialsPath == nil)
        #expect(resolved.emulatorHost == nil)
    }

    @Test func ratesComeFromTheFlagThenTheFileThenFCMsQuota() throws {
        var resolved = try Self.resolve()
        #expect(resolved.writeRate == Double(FCMLimits.defaultQuota))
        #expect(resolved.quotaUnit == .tokens)
        #expect(resolved.readRate == nil)
        let file = Self.file {
            $0.qps = 500
            $0.qpsUnit = .requests
            $0.readQPS = 50
        }
        resolved = try Self.resolve(RuntimeFlags(), [:], file)
        #expect((resolved.writeRate, resolved.quotaUnit, resolved.readRate) == (500, .requests, 50))
        let flags = Self.flags {
            $0.qps = 100
            $0.qpsUnit = .tokens
            $0.readQPS = 10
        }
        resolved = try Self.resolve(flags, [:], file)
        #expect((resolved.writeRate, resolved.quotaUnit, resolved.readRate) == (100, .tokens, 10))
        // Half a second's worth, at most one batch; reads a second's worth, at most 100.
        #expect(ResolvedSettings.writeBurst(3000) == 1000)
        #expect(ResolvedSettings.writeBurst(100) == 50)
        #expect(ResolvedSettings.readBurst(500) == 100)
    }

    @Test func manifestsFlagIsRelativeToTheWorkingDirectoryAndTheFileSettingToTheProject() throws {
        var resolved = try Self.resolve(Self.flags { $0.directory = "app" })
        #expect(resolved.manifestsPath == "/work/app/manifests")
        #expect(resolved.manifestsDisplay == "app/manifests")
        resolved = try Self.resolve(
            Self.flags {
                $0.directory = "app"
                $0.manifests = "elsewhere"
            })
        #expect(resolved.manifestsPath == "/work/elsewhere")
        #expect(resolved.manifestsDisplay == "elsewhere")
        resolved = try Self.resolve(Self.flags { $0.directory = "app" }, [:], Self.file { $0.manifests = "fcm" })
        #expect(resolved.manifestsPath == "/work/app/fcm")
        #expect(resolved.manifestsDisplay == "app/fcm")
    }

    @Test func anInventoryFileInsideTheManifestsIsRefused() {
        let file = Self.file { $0.inventoryFile = "manifests/sources.yaml" }
        let error = #expect(throws: RuntimeError.self) { try Self.resolve(RuntimeFlags(), [:], file) }
        #expect(error?.description.contains("inside the manifests directory") == true)
        #expect(throws: Never.self) {
            try Self.resolve(RuntimeFlags(), [:], Self.file { $0.inventoryFile = "sources.yaml" })
        }
    }

    @Test func theDateOfTheDeadlineRulesIsCheckedAndUsedOnlyOffFCM() throws {
        let error = #expect(throws: RuntimeError.self) { try Self.resolve(RuntimeFlags(), ["TIDEMARK_AS_OF": "soon"]) }
        #expect(error?.description == "TIDEMARK_AS_OF must be a date such as 2027-10-01, not 'soon'.")
        let day = try #require(FCMDeadlines.parseDay("2027-10-01"))
        let now = try #require(FCMDeadlines.parseDay("2026-11-24"))
        let embedded = try Self.resolve(RuntimeFlags(), ["TIDEMARK_AS_OF": "2027-10-01"])
        #expect(embedded.asOf == day)
        #expect(embedded.deadlines(now: now) == DeadlineCheck(transport: .v1, enforcedAt: day, now: day))
        // The fcm backend is held to the real date, whatever TIDEMARK_AS_OF says.
        let fcm = try Self.resolve(Self.flags { $0.backend = .fcm }, ["TIDEMARK_AS_OF": "2027-10-01"])
        #expect(fcm.deadlines(now: now) == DeadlineCheck(transport: .v1, enforcedAt: now, now: day))
        #expect(try Self.resolve().deadlines(now: now) == DeadlineCheck(transport: .v1, enforcedAt: nil, now: now))
    }

    @Test func embeddedLatencyIsCheckedOnlyForTheEmbeddedBackend() throws {
        #expect(throws: RuntimeError.self) { try Self.resolve(RuntimeFlags(), ["TIDEMARK_EMBEDDED_LATENCY_MS": "-1"]) }
        let fcm = try Self.resolve(Self.flags { $0.backend = .fcm }, ["TIDEMARK_EMBEDDED_LATENCY_MS": "-1"])
        #expect(fcm.embeddedLatency == nil)
        #expect(
            try Self.resolve(RuntimeFlags(), ["TIDEMARK_EMBEDDED_LATENCY_MS": "20"]).embeddedLatency
                == .milliseconds(20))
    }

    @Test func aPostgresURLIsParsedAndNeverShownWithItsPassword() throws {
        let resolved = try Self.resolve(
            RuntimeFlags(), ["TIDEMARK_STATE_URL": "postgres://ops:s3cret@db.internal:6432/tidemark?sslmode=require"])
        #expect(resolved.state == .url(scheme: "postgres", text: resolved.stateSpec))
        #expect(resolved.postgres?.host == "db.internal")
        #expect(resolved.stateDisplay == "postgres://ops@db.internal:6432/tidemark (workspace default)")
        #expect(!resolved.stateDisplay.contains("s3cret"))
        // The embedded backend still keeps its data in the project.
        #expect(resolved.statePath == "/work/./.tidemark/state.db")
        let error = #expect(throws: RuntimeError.self) {
            try Self.resolve(Self.flags { $0.state = "postgres://ops:s3cret@/tidemark" })
        }
        #expect(error?.description.contains("s3cret") == false)
        // Another scheme is a URL for the registry to place, shown without its password.
        let other = try Self.resolve(Self.flags { $0.state = "etcd://root:pw@127.0.0.1:2379/tm" })
        #expect(other.state == .url(scheme: "etcd", text: "etcd://root:pw@127.0.0.1:2379/tm"))
        #expect(other.stateDisplay == "etcd://root:***@127.0.0.1:2379/tm (workspace default)")
        #expect(
            try Self.resolve(Self.flags { $0.state = "./odd://name.db" }).state
                == .file(path: "/work/././odd://name.db"))
    }
}
