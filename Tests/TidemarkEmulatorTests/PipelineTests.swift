import Foundation
import Testing
import TidemarkCore

@testable import TidemarkEmulator

/// Manifests in memory → refresh against the engine → plan: unregistered tokens are reported by device and skipped.
@Suite struct PipelineTests {
    @Test func unregisteredTokensAreReportedNotPlanned() async throws {
        let csv =
            "device_id,token,region\nphone-1,aaaaaaaa:APA91b,north\nphone-2,bbbbbbbb:APA91b,north\nphone-3,cccccccc:APA91b,north\n"
        let files = InMemoryFileSource([
            "inv.yaml": "inventory:\n  files: [devices.csv]\n",
            "devices.csv": csv,
            "topics.yaml": "topics:\n  - name: north\n    members: [{selector: {region: north}}]\n",
        ])
        let engine = try FCMEngine()
        try await engine.unregister(token: "bbbbbbbb:APA91b")
        let backend = EmbeddedBackend(engine: engine, project: "p")
        var state = State(lineage: "", serial: 0)
        let loaded = await state.interning { await ManifestLoader(files: files).load(into: &$0) }
        let refresh = try await Refresher(backend: backend).refresh(
            TokenSet(0..<UInt32(state.tokens.count)),
            table: state.tokens.table, groups: [], at: 1)
        let plan = Planner(tidemarkVersion: "t").plan(
            loaded: loaded, state: state, refresh: refresh,
            backend: backend.identity, now: Date())
        #expect(plan.operations.flatMap(\.tokens) == ["aaaaaaaa:APA91b", "cccccccc:APA91b"])
        #expect(plan.observations.dead == ["bbbbbbbb:APA91b"])
        let warning = try #require(plan.diagnostics.first { $0.severity == .warning })
        #expect(warning.message.contains("1 token is no longer registered in FCM (device 'phone-2')"))
        #expect(plan.topics.first?.notes.contains { $0.contains("1 declared token is unregistered") } == true)
    }
}
