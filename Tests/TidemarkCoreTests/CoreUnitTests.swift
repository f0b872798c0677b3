import Foundation
import Testing
import TidemarkTesting

@testable import TidemarkCore

@Suite struct TokenSetTests {
    @Test(arguments: 0..<100)
    func setOperationsMatchSwiftSets(seed: Int) {
        var rng = SeededGenerator(seed: UInt64(seed))
        let a = (0..<Int.random(in: 0...50, using: &rng)).map { _ in UInt32.random(in: 0..<60, using: &rng) }
        let b = (0..<Int.random(in: 0...50, using: &rng)).map { _ in UInt32.random(in: 0..<60, using: &rng) }
        let x = TokenSet(a)
        let y = TokenSet(b)
        #expect(x.ids == Set(a).sorted())
        #expect(x.union(y).ids == Set(a).union(b).sorted())
        #expect(x.intersection(y).ids == Set(a).intersection(b).sorted())
        #expect(x.subtracting(y).ids == Set(a).subtracting(b).sorted())
        #expect(TokenSet.union(of: [x, y, TokenSet(), x]).ids == Set(a).union(b).sorted())
        for probe in 0..<60 { #expect(x.contains(UInt32(probe)) == a.contains(UInt32(probe))) }
    }
}

@Suite struct SHA256Tests {
    @Test func knownVectors() {
        #expect(SHA256Digest.hex(Data()) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
        #expect(
            SHA256Digest.hex(Data("abc".utf8)) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        let long = Data(String(repeating: "a", count: 1_000_000).utf8)
        #expect(SHA256Digest.hex(long) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0")
        var split = SHA256Digest()
        split.update(Data("ab".utf8))
        split.update("c")
        #expect(split.finalize() == SHA256Digest.hex(Data("abc".utf8)))
    }
}

@Suite struct RenderingTests {
    func plan(_ operations: [PlannedOperation], topics: [TopicChange] = [], groups: [GroupChange] = []) -> Plan {
        Plan(
            tidemarkVersion: "test", createdAt: Date(timeIntervalSince1970: 0), lineage: "0123456789abcdef", serial: 7,
            manifestsDigest: String(repeating: "ab", count: 32),
            backend: BackendIdentity(kind: .embedded, project: "p"),
            refreshed: true, operations: operations, topics: topics, groups: groups, diagnostics: [],
            observations: Observations())
    }

    @Test func verdictLeadsWithCounts() {
        let tokens = (0..<1204).map { "tok\($0):APA91bxxxxxxxx" }
        let p = plan([
            PlannedOperation(kind: .unsubscribe, target: "a", tokens: Array(tokens.prefix(37))),
            PlannedOperation(kind: .subscribe, target: "b", tokens: Array(tokens.prefix(1000))),
            PlannedOperation(kind: .subscribe, target: "b", tokens: Array(tokens.suffix(204))),
            PlannedOperation(kind: .subscribe, target: "c", tokens: []),
            PlannedOperation(kind: .groupCreate, target: "g", tokens: ["x:APA91b"]),
        ])
        #expect(
            PlanRenderer().verdict(p)
                == "Plan: 3 topics and 1 group change: +1,204 subscriptions, −37 unsubscriptions, 1 group call.")
        #expect(PlanRenderer().verdict(plan([])) == "No changes. FCM matches the manifests.")
    }

    @Test func humanOutputRedactsTokens() {
        let token = "secretsecret:APA91bVERYSECRETTOKENVALUE12345"
        let p = plan(
            [PlannedOperation(kind: .unsubscribe, target: "alerts", tokens: [token])],
            topics: [
                TopicChange(
                    topic: "alerts", mode: .authoritative, subscribe: 0, unsubscribe: 1,
                    removedFromManifests: false, notes: [])
            ])
        let text = PlanRenderer().render(p)
        #expect(!text.contains(token))
        #expect(text.contains(Redaction.redact(token)))
        #expect(text.contains("Destructive changes:"))
        #expect(text.contains("1 unsubscription from 'alerts' (authoritative topic)"))
        #expect(PlanRenderer(showTokens: true).render(p).contains(token))
    }

    @Test func redactionKeepsTailAndHash() {
        let r = Redaction.redact("abcdefghijkl:APA91bXy3kQ")
        #expect(r.hasPrefix("…Xy3kQ#"))
        #expect(r.count == "…Xy3kQ#".count + 6)
        #expect(Redaction.redact("a:APA91bXy3kQ") != r)
    }

    @Test func planRoundTripsThroughJSON() throws {
        let p = plan([PlannedOperation(kind: .subscribe, target: "a", tokens: ["t1:APA91b"])])
        let data = try Plan.encoder().encode(p)
        let text = String(decoding: data, as: UTF8.self)
        #expect(text.contains("\"format_version\" : 1"))
        #expect(text.contains("\"manifests_digest\""))
        let back = try Plan.decoder().decode(Plan.self, from: data)
        #expect(back.operations == p.operations)
        #expect(back.operationsDigest == p.operationsDigest)
    }
}

@Suite struct ProjectSettingsTests {
    @Test func decodesAndReportsUnknownKeys() {
        let (settings, ok) = ProjectSettings.decode(
            "project: acme-prod\nbackend: embedded\nstate: s.db\n", file: "tidemark.yaml")
        #expect(ok.isEmpty)
        #expect(settings.project == "acme-prod" && settings.state == "s.db")
        let (_, bad) = ProjectSettings.decode("projcet: acme\nbackend: cloud\n", file: "tidemark.yaml")
        #expect(
            bad.map(\.description) == [
                "tidemark.yaml:1:1: error: unknown key 'projcet' in tidemark.yaml; did you mean 'project'?",
                "tidemark.yaml:2:10: error: unknown backend 'cloud'; use embedded, emulator or fcm.",
            ])
    }

    @Test func transportAndQPS() {
        let (settings, ok) = ProjectSettings.decode("transport: iid\nqps: 1500\n", file: "tidemark.yaml")
        #expect(ok.isEmpty)
        #expect(settings.transport == .iid && settings.qps == 1500)
        let (_, bad) = ProjectSettings.decode("transport: grpc\nqps: fast\n", file: "tidemark.yaml")
        #expect(
            bad.map(\.description) == [
                "tidemark.yaml:1:12: error: unknown transport 'grpc'; use v1 (the FCM topic subscription API) or iid.",
                "tidemark.yaml:2:6: error: 'qps' must be a number of subscription changes per second from above 0 to 1000000 (FCM allows 3000), not 'fast'.",
            ])
    }

    @Test func savedPlanRereadAfter() {
        #expect(ProjectSettings().savedPlanRereadAfter == 900, "15 minutes by default")
        for (text, seconds) in [("10m", Int64(600)), ("0s", 0), ("0", 0), ("2h", 7200)] {
            let (settings, ok) = ProjectSettings.decode("saved_plan_reread_after: \(text)\n", file: "tidemark.yaml")
            #expect(ok.isEmpty && settings.savedPlanRereadAfter == seconds, "\(text)")
        }
        let (_, bad) = ProjectSettings.decode("saved_plan_reread_after: soon\n", file: "tidemark.yaml")
        #expect(
            bad.map(\.description) == [
                "tidemark.yaml:1:26: error: 'saved_plan_reread_after' must be a duration such as 15m or 0s, not 'soon'."
            ])
    }

    @Test func endpointsCredentialsAndUnits() {
        let text = """
            qps_unit: requests
            credentials: keys/sa.json
            fcm_url: http://127.0.0.1:8080
            iid_url: https://proxy.example/iid
            sender_id: "123456789"
            """
        let (settings, ok) = ProjectSettings.decode(text, file: "tidemark.yaml")
        #expect(ok.isEmpty)
        #expect(settings.qpsUnit == .requests && settings.credentials == "keys/sa.json")
        #expect(settings.fcmURL == "http://127.0.0.1:8080" && settings.iidURL == "https://proxy.example/iid")
        #expect(settings.senderID == "123456789")
        let (_, bad) = ProjectSettings.decode("qps_unit: calls\nfcm_url: fcm.googleapis.com\n", file: "tidemark.yaml")
        #expect(
            bad.map(\.description) == [
                "tidemark.yaml:1:11: error: unknown qps_unit 'calls'; use tokens (membership changes) or requests (HTTP calls).",
                "tidemark.yaml:2:10: error: 'fcm_url' must be a base URL such as https://fcm.googleapis.com (http or https, no trailing slash), not 'fcm.googleapis.com'.",
            ])
    }

    @Test func unregisteredAnswersAndTheDeadGuardAreSettings() {
        let text =
            "unregistered:\n  v1: [UNREGISTERED]\n  iid: [NOT_FOUND, INVALID_ARGUMENT]\ndead_share: 5%\ndead_minimum: 10\n"
        let (settings, ok) = ProjectSettings.decode(text, file: "tidemark.yaml")
        #expect(ok.isEmpty, "\(ok)")
        #expect(
            settings.unregistered == UnregisteredAnswers(v1: ["UNREGISTERED"], iid: ["NOT_FOUND", "INVALID_ARGUMENT"]))
        #expect(settings.deadTokenGuard == DeadTokenGuard(share: 0.05, minimum: 10))
        #expect(ProjectSettings().unregistered == .default && ProjectSettings().deadTokenGuard == DeadTokenGuard())
        let (_, bad) = ProjectSettings.decode("dead_share: lots\nunregistered: {v2: []}\n", file: "tidemark.yaml")
        #expect(bad.count == 2, "\(bad)")
        #expect(bad.contains { $0.message.contains("'dead_share' must be a share") })
    }
}

/// The token and inventory indexes: every key found at its position, misses missed, duplicates
/// reported, across growth.
@Suite struct StringIndexTests {
    @Test func indexesFindWhatTheyHoldAcrossGrowth() {
        var table = TokenTable()
        let tokens = (0..<50_000).map { Fixtures.token($0) }
        for (i, token) in tokens.enumerated() { #expect(table.intern(token) == UInt32(i)) }
        for (i, token) in tokens.enumerated().shuffled().prefix(5_000) {
            #expect(table.id(token) == UInt32(i))
            #expect(table.intern(token) == UInt32(i), "interning again returns the same id")
        }
        #expect(table.count == 50_000)
        #expect(table.id(Fixtures.token(50_000)) == nil && table.id("") == nil)
        // Keys of every length around the 8-byte step, and non-ASCII ones.
        var index = StringIndex()
        var keys: [String] = []
        for n in 0..<40 {
            for key in [String(repeating: "a", count: n), String(repeating: "é", count: n) + "x"] {
                #expect(index.insert(key, at: keys.count, keys: keys) == nil, "'\(key)' is new")
                keys.append(key)
            }
        }
        for (i, key) in keys.enumerated() {
            #expect(index.find(key, in: keys) == i)
            #expect(index.insert(key, at: keys.count, keys: keys) == i)
        }
        #expect(index.count == keys.count)
        // Looked up by bytes, as raw readers do: the same positions, misses missed.
        for (i, key) in keys.enumerated() {
            let bytes = Array(key.utf8)
            bytes.withUnsafeBufferPointer { buffer in
                #expect(index.find(bytes: buffer, hash: StringIndex.hash(bytes: buffer), in: keys) == i)
            }
        }
        let missing = Array("zz".utf8)
        missing.withUnsafeBufferPointer { buffer in
            #expect(index.find(bytes: buffer, hash: StringIndex.hash(bytes: buffer), in: keys) == nil)
        }
    }

    /// Loading state adds every token at once: ids follow in order, and a repeated token (a damaged
    /// file) is found, with nothing from it on added.
    @Test func tokensAddedAtOnceAreFoundAndRepeatsCaught() {
        var table = TokenTable()
        table.intern(Fixtures.token(0))
        let more = (1..<30_000).map { Fixtures.token($0) }
        #expect(table.appendNew(more) == nil)
        #expect(table.count == 30_000)
        for i in stride(from: 0, to: 30_000, by: 7) { #expect(table.id(Fixtures.token(i)) == UInt32(i)) }
        var damaged = TokenTable()
        #expect(damaged.appendNew([Fixtures.token(1), Fixtures.token(2), Fixtures.token(1), Fixtures.token(3)]) == 2)
        #expect(damaged.count == 2)
        #expect(damaged.id(Fixtures.token(3)) == nil)
        #expect(damaged.intern(Fixtures.token(3)) == 2)
    }
}
