import Foundation
import Synchronization
import Testing
import TidemarkCore
import TidemarkFCM
import TidemarkRuntime
import TidemarkTesting

/// A state store and an inventory source that are not in `Sources/`, each added with one type, one
/// registration and one conformance-suite call: the runtime opens and builds them as it does its own.

/// State at `memory://NAME` URLs: stores named alike share their content, as two runners sharing one
/// database server do. (The content lives in the conformance suite's in-memory twin.)
struct NamedMemoryStore: HistoryTrimming {
    private static let servers = Mutex<[String: InMemoryStateStore]>([:])

    let location: String
    private let backing: InMemoryStateStore

    init(url: String, workspace: String) {
        let location = "\(url) (workspace \(workspace))"
        self.location = location
        backing = Self.servers.withLock { servers in
            if let store = servers[location] { return store }
            let store = InMemoryStateStore(location: location)
            servers[location] = store
            return store
        }
    }

    func load() async throws -> State? { try await backing.load() }
    func save(_ state: inout State, _ write: StateWrite, at now: Int64) async throws -> Int {
        try await backing.save(&state, write, at: now)
    }
    func unfinishedApply() async throws -> UnfinishedApply? { try await backing.unfinishedApply() }
    func applies(limit: Int) async throws -> [ApplyRecord] { try await backing.applies(limit: limit) }
    func trimHistory(keep: Int) async throws -> Int { try await backing.trimHistory(keep: keep) }
    func lock(_ holder: LockHolder) async throws -> any StateLease { try await backing.lock(holder) }
    func lockHolder() async throws -> LockHolder? { try await backing.lockHolder() }
}

/// Devices written in tidemark.yaml itself, `ID TOKEN [LABEL=VALUE …]` a line (`lines: {devices: "…"}`).
struct LinesInventorySource: InventorySource {
    var name: String
    var text: String

    func load(into builder: inout InventoryBuilder) async throws -> InventorySnapshot {
        let source = builder.source(ConfiguredSource.display(name))
        var digest = SHA256Digest()
        for (number, line) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let words = line.split(separator: " ")
            guard words.count >= 2 else { continue }
            digest.update("\(line)\n")
            let labels = words.dropFirst(2).map { word in
                let pair = word.split(separator: "=", maxSplits: 1)
                return (String(pair[0]), pair.count > 1 ? String(pair[1]) : "")
            }
            builder.add(
                id: String(words[0]), token: String(words[1]), labels: labels, from: source, line: number + 1)
        }
        return InventorySnapshot(identity: digest.finalize())
    }
}

/// The settings of `lines:`, decoded into their own type with tidemark.yaml's lines in every error.
struct LinesSettings: SourceSettings, Equatable {
    /// The devices, a line each.
    var devices: String
    /// Read only the first this many lines.
    var limit: Int?
    /// Whether the lines are read again (unused here: shows a boolean).
    var watch = false
    /// How often (unused here: shows a duration).
    var every: Duration?

    var key: String { "lines" }

    static let kind = SourceKind.typed("lines", allowed: ["devices", "limit", "watch", "every"]) { reader in
        let devices = reader.string("devices", required: true)
        let limit = reader.integer("limit", in: 1...1_000)
        let watch = reader.bool("watch") ?? false
        let every = reader.duration("every")
        if watch, every == nil { reader.error("'lines.watch' needs 'lines.every'.", at: "watch") }
        guard let devices else { return nil }
        return LinesSettings(devices: devices, limit: limit, watch: watch, every: every)
    }
}

extension Registries {
    /// tidemark's own, with the two above registered.
    static var extended: Registries {
        var registries = Registries.standard
        registries.stores.register(scheme: "memory") { resolved in
            guard case .url(_, let url) = resolved.state else { preconditionFailure("a memory:// URL") }
            return NamedMemoryStore(url: url, workspace: resolved.workspace)
        }
        registries.sources.register(LinesSettings.kind, as: LinesSettings.self) { settings, spec, _ in
            LinesInventorySource(
                name: spec.name,
                text: settings.devices.split(separator: "\n").prefix(settings.limit ?? .max).joined(separator: "\n"))
        }
        return registries
    }
}

@Suite struct ExtensionTests {
    @Test(arguments: StateStoreConformance.Check.allCases)
    func anAddedStorePassesTheStateStoreSuite(_ check: StateStoreConformance.Check) async throws {
        try await StateStoreConformance.run(check) {
            NamedMemoryStore(url: "memory://conformance-\(UUID().uuidString)", workspace: "default")
        }
    }

    @Test(arguments: InventorySourceConformance.Check.allCases)
    func anAddedSourcePassesTheInventorySourceSuite(_ check: InventorySourceConformance.Check) async throws {
        try await InventorySourceConformance.run(check) { devices in
            LinesInventorySource(
                name: "lines",
                text: devices.map { device in
                    let labels = device.labels.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }
                    return ([device.id, device.token] + labels).joined(separator: " ")
                }.joined(separator: "\n"))
        }
    }

    /// A project whose tidemark.yaml names both: the runtime reads the source's settings, builds it,
    /// and opens the store, with nothing in `Sources/` knowing either.
    @Test func theRuntimeBuildsBothFromTidemarkYAML() async throws {
        let project = FileManager.default.temporaryDirectory.appendingPathComponent("tm-ext-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: project) }
        try FileManager.default.createDirectory(
            at: project.appendingPathComponent("manifests"), withIntermediateDirectories: true)
        let tokens = (0..<3).map { Fixtures.token($0) }
        try """
        project: tidemark-extension
        state: memory://ci
        inventory:
          - name: handsets
            lines:
              devices: |
                phone-0 \(tokens[0]) kind=phone
                phone-1 \(tokens[1]) kind=tablet
                phone-2 \(tokens[2]) kind=phone
        """.write(to: project.appendingPathComponent("tidemark.yaml"), atomically: true, encoding: .utf8)
        try """
        topics:
          - name: phones
            members:
              - selector: {kind: phone}
        """.write(to: project.appendingPathComponent("manifests/topics.yaml"), atomically: true, encoding: .utf8)
        var flags = RuntimeFlags()
        flags.directory = project.path
        let runtime = try Runtime.load(flags, environment: [:], registries: .extended)
        #expect(runtime.stateStore() is NamedMemoryStore)
        #expect(runtime.stateDisplay == "memory://ci (workspace default)")
        let loaded = await runtime.loadManifests()
        #expect(!loaded.diagnostics.hasErrors, "\(loaded.diagnostics)")
        #expect(loaded.inventory.deviceIDs == ["phone-0", "phone-1", "phone-2"])
        // A plan over the embedded backend, with state in the added store: two phones to subscribe.
        let plan = try await runtime.withBackend { backend in
            try await PlanWorkflow(runtime.parts(backend, output: SilentOutput())).run(PlanRequest()).plan
        }
        #expect(plan.topics.map { "\($0.topic) +\($0.subscribe)" } == ["phones +2"])
        // Two runtimes on one memory:// name share their state, as runners on one server do.
        let other = try Runtime.load(flags, environment: [:], registries: .extended)
        var state = State(lineage: StateStoreConformance.lineage, serial: 0)
        try await runtime.stateStore().save(&state, StateStoreConformance.writeAll(state), at: 1)
        #expect(try await other.stateStore().load()?.serial == 1)

        // Without the registrations, the same project is refused with what this tidemark reads.
        let error = #expect(throws: DiagnosticsError.self) { try Runtime.load(flags, environment: [:]) }
        #expect(error?.description.contains("unknown key 'lines'") == true)
        try """
        project: tidemark-extension
        state: memory://ci
        """.write(to: project.appendingPathComponent("tidemark.yaml"), atomically: true, encoding: .utf8)
        let refused = #expect(throws: RuntimeError.self) { try Runtime.load(flags, environment: [:]) }
        #expect(
            refused?.description
                == "the state memory://ci (workspace default) is a URL tidemark has no store for; 'state' takes a SQLite file path or a URL of postgres://, postgresql:// (flag --state, TIDEMARK_STATE_URL, or 'state' in tidemark.yaml)."
        )
    }

    /// A kind added from outside reads typed settings: each mistake is one error naming tidemark.yaml,
    /// its line and the setting, as the built-in kinds' are; right settings build the source.
    @Test func anAddedSourceKindDecodesTypedSettingsWithTheirLines() throws {
        let project = FileManager.default.temporaryDirectory.appendingPathComponent("tm-ext-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: project) }
        try FileManager.default.createDirectory(
            at: project.appendingPathComponent("manifests"), withIntermediateDirectories: true)
        var flags = RuntimeFlags()
        flags.directory = project.path
        let mistakes: [(settings: String, line: Int, says: String)] = [
            ("limit: many", 6, "'lines.limit' must be a whole number from 1 to 1000, not 'many'"),
            ("every: soon", 6, "'lines.every' must be a duration such as 30s or 5m, not 'soon'"),
            ("watch: maybe", 6, "'lines.watch' must be true or false"),
            ("watch: true", 6, "'lines.watch' needs 'lines.every'"),
            ("limt: 3", 6, "unknown key 'limt' in 'lines'; did you mean 'limit'?"),
        ]
        for (setting, line, says) in mistakes {
            try """
            project: tidemark-extension
            state: memory://ci
            inventory:
              - name: handsets
                lines:
                  \(setting)
                  devices: "phone-0 \(Fixtures.token(0)) kind=phone"
            """.write(to: project.appendingPathComponent("tidemark.yaml"), atomically: true, encoding: .utf8)
            let error = #expect(throws: DiagnosticsError.self, "\(setting)") {
                try Runtime.load(flags, environment: [:], registries: .extended)
            }
            let errors = error?.diagnostics.filter { $0.severity == .error } ?? []
            #expect(errors.count == 1, "\(setting): \(errors)")
            #expect(errors.first?.location?.file.hasSuffix("tidemark.yaml") == true, "\(errors)")
            #expect(errors.first?.location?.line == line, "\(setting): \(errors)")
            #expect(errors.first?.message.contains(says) == true, "\(setting): \(errors.first?.message ?? "none")")
        }
        try """
        project: tidemark-extension
        state: memory://ci
        inventory:
          - name: handsets
            lines:
              limit: 1
              watch: true
              every: 5m
              devices: |
                phone-0 \(Fixtures.token(0)) kind=phone
                phone-1 \(Fixtures.token(1)) kind=phone
        """.write(to: project.appendingPathComponent("tidemark.yaml"), atomically: true, encoding: .utf8)
        let runtime = try Runtime.load(flags, environment: [:], registries: .extended)
        let settings = try #require(runtime.settings.inventory.first?.settings as? LinesSettings)
        #expect(settings.limit == 1 && settings.watch && settings.every == .seconds(300))
    }

    /// A transport registered from outside is one tidemark.yaml and --transport may name (its plans count
    /// requests as it does); unregistered, the same name is refused at its line, or naming the flag.
    @Test func anAddedTransportIsOneTidemarkYAMLMayName() throws {
        struct Batched: TopicAPI {
            var transport: TopicTransport { "batched" }
            var requests: TopicTransport.Requests { .perOperation }
            func base(_ endpoints: FCMEndpoints) -> String { endpoints.iid }
            var setting: String { "iid_url" }
            func journalStep(_ options: FCMHTTPBackend.Options) -> Int? { nil }
            func subscribe(_ backend: FCMHTTPBackend, topic: String, tokens: [String]) async throws -> [TokenOutcome] {
                try await backend.batch("v1:batchAdd", topic: topic, tokens: tokens)
            }
            func unsubscribe(
                _ backend: FCMHTTPBackend, topic: String, tokens: [String]
            ) async throws
                -> [TokenOutcome]
            {
                try await backend.batch("v1:batchRemove", topic: topic, tokens: tokens)
            }
            func read(_ backend: FCMHTTPBackend, token: String) async throws -> RegistrationStatus {
                try await backend.listTopics(token)
            }
        }
        let project = FileManager.default.temporaryDirectory.appendingPathComponent("tm-ext-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: project) }
        try FileManager.default.createDirectory(
            at: project.appendingPathComponent("manifests"), withIntermediateDirectories: true)
        try "project: tidemark-extension\ntransport: batched\n".write(
            to: project.appendingPathComponent("tidemark.yaml"), atomically: true, encoding: .utf8)
        var flags = RuntimeFlags()
        flags.directory = project.path
        var registries = Registries.standard
        registries.transports.register(Batched())
        let runtime = try Runtime.load(flags, environment: [:], registries: registries)
        #expect(runtime.transport == "batched")
        let operation = PlannedOperation(kind: .subscribe, target: "news", tokens: ["a", "b", "c"])
        #expect(runtime.detachedBackend().requests(for: [operation]) == 1)

        let refused = #expect(throws: DiagnosticsError.self) { try Runtime.load(flags, environment: [:]) }
        #expect(
            refused?.description.contains(
                "tidemark.yaml:2:12: error: unknown transport 'batched'; use v1 (the FCM topic subscription API) or iid."
            )
                == true, "\(refused?.description ?? "")")
        try "project: tidemark-extension\n".write(
            to: project.appendingPathComponent("tidemark.yaml"), atomically: true, encoding: .utf8)
        flags.transport = "batched"
        let flag = #expect(throws: RuntimeError.self) { try Runtime.load(flags, environment: [:]) }
        #expect(
            flag?.description
                == "unknown transport 'batched' (flag --transport); use v1 (the FCM topic subscription API) or iid.")
    }
}
