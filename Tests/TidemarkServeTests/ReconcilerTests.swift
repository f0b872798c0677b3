import Foundation
import Testing
import TidemarkCore
import TidemarkRuntime
import TidemarkServe
import TidemarkTesting

/// A project on disk with the embedded backend: tidemark.yaml, and one manifest whose inline
/// inventory the tests edit between reconciles, as the app's database changes between cycles.
struct ServeProject {
    let root: URL
    var extraSettings = ""

    init(extraSettings: String = "") throws {
        root = FileManager.default.temporaryDirectory.appendingPathComponent("tm-serve-\(UUID().uuidString)")
        self.extraSettings = extraSettings
        try FileManager.default.createDirectory(
            at: root.appendingPathComponent("manifests"), withIntermediateDirectories: true)
        try writeSettings()
    }

    func writeSettings(_ text: String? = nil) throws {
        try (text ?? "project: tidemark-serve-test\nrefresh: all\n\(extraSettings)").write(
            to: root.appendingPathComponent("tidemark.yaml"), atomically: true, encoding: .utf8)
    }

    /// Devices `d0`…: those in `phones` have kind=phone, the rest kind=tablet; the topic takes phones.
    func writeDevices(_ ids: [Int], phones: Set<Int>? = nil, topics: String = Self.phones) throws {
        let devices = ids.map { id in
            "    - {id: d\(id), token: \"\(Fixtures.token(id))\", labels: {kind: \((phones ?? Set(ids)).contains(id) ? "phone" : "tablet")}}"
        }
        try """
        inventory:
          devices:
        \(devices.joined(separator: "\n"))
        \(topics)
        """.write(to: root.appendingPathComponent("manifests/topics.yaml"), atomically: true, encoding: .utf8)
    }

    /// One additive topic of every phone.
    static let phones = """
        topics:
          - name: phones
            members:
              - selector: {kind: phone}
        """

    var flags: RuntimeFlags {
        var flags = RuntimeFlags()
        flags.directory = root.path
        return flags
    }

    func runtime() throws -> Runtime { try Runtime.load(flags, environment: [:]) }

    /// A reconciler of the project as it is now (its tidemark.yaml read, and read again when it changes).
    func reconciler(_ change: (inout ServeSettings) -> Void = { _ in }) throws -> Reconciler {
        var settings = ServeSettings()
        change(&settings)
        let flags = self.flags
        return Reconciler(
            runtime: try runtime(), settings: settings,
            reload: { [settings] in (try Runtime.load(flags, environment: [:]), settings) })
    }

    /// What the embedded backend holds for `topic`, read as a drift check would.
    func subscribers(_ topic: String, of ids: [Int]) async throws -> Int {
        let runtime = try runtime()
        let tokens = ids.map { Fixtures.token($0) }
        return try await runtime.withBackend(output: SilentOutput()) { backend in
            try await backend.refresh(tokens).filter { status in
                if case .active(let topics) = status { topics.contains(topic) } else { false }
            }.count
        }
    }

    func remove() { try? FileManager.default.removeItem(at: root) }
}

@Suite struct ReconcilerTests {
    @Test func aNewDeviceJoinsItsTopicAtTheNextReconcileAndNothingIsDoneTwice() async throws {
        let project = try ServeProject()
        defer { project.remove() }
        try project.writeDevices([0, 1, 2])
        let reconciler = try project.reconciler()

        let first = await reconciler.reconcile()
        #expect(first.outcome == .success, "\(first)")
        #expect(first.subscribed == 3)
        #expect(first.summary.hasPrefix("applied 3 subscriptions, 0 unsubscriptions"))

        try project.writeDevices([0, 1, 2, 3])
        let second = await reconciler.reconcile()
        #expect(second.outcome == .success && second.subscribed == 1 && second.unsubscribed == 0, "\(second)")
        #expect(try await project.subscribers("phones", of: [0, 1, 2, 3]) == 4)

        let third = await reconciler.reconcile()
        #expect(third.outcome == .success && third.subscribed == 0 && third.writeRequests == 0, "\(third)")
        #expect(second.managedMemberships == 4 && third.managedMemberships == 4)
        let metrics = ServeMetrics()
        metrics.leader(workspace: "default", true, replica: "vm/1")
        metrics.record(workspace: "default", third)
        #expect(
            String(decoding: metrics.exposition(), as: UTF8.self).contains(
                #"tidemark_managed_memberships{workspace="default"} 4"#))
        #expect(third.summary == "no changes")
    }

    @Test func theApplyHistoryIsTrimmedToHistoryKeep() async throws {
        let project = try ServeProject()
        defer { project.remove() }
        let reconciler = try project.reconciler { $0.historyKeep = 2 }
        for count in 1...4 {
            try project.writeDevices(Array(0..<count))
            let result = await reconciler.reconcile()
            #expect(result.outcome == .success && result.subscribed == 1, "\(result)")
        }
        let history = try await project.runtime().stateStore().applies(limit: 10)
        #expect(history.count == 2 && history.allSatisfy { $0.status == .finished }, "\(history)")
    }

    @Test func aPlanPastTheRailIsBlockedNamesTheRailAndChangesNothing() async throws {
        let project = try ServeProject()
        defer { project.remove() }
        try project.writeDevices(Array(0..<10))
        #expect(try await project.reconciler().reconcile().outcome == .success)

        // Six phones become tablets: six unsubscriptions, past a rail of 2.
        try project.writeDevices(Array(0..<10), phones: [0, 1, 2, 3])
        let reconciler = try project.reconciler { $0.maxUnsubscribes = try! UnsubscribeLimit(parsing: "2") }
        let blocked = await reconciler.reconcile()
        #expect(blocked.outcome == .blocked, "\(blocked)")
        #expect(blocked.reason == "rail.max_unsubscribes")
        #expect(blocked.message?.contains("unsubscribe 6") == true, "\(blocked.message ?? "")")
        #expect(blocked.unsubscribed == 0 && blocked.writeRequests == 0)
        #expect(try await project.subscribers("phones", of: Array(0..<10)) == 10)

        // It stays blocked: the next reconcile finds the same plan and refuses it again.
        #expect(await reconciler.reconcile().outcome == .blocked)
        // A person raises the rail: the next reconcile applies.
        let raised = try await project.reconciler { $0.maxUnsubscribes = try! UnsubscribeLimit(parsing: "10") }
            .reconcile()
        #expect(raised.outcome == .success && raised.unsubscribed == 6, "\(raised)")
    }

    /// `protect` refuses one topic: that topic is held, and the rest (a new topic) is applied.
    @Test func aProtectedTopicTakenOutOfTheManifestsIsHeldByProtect() async throws {
        let project = try ServeProject()
        defer { project.remove() }
        try project.writeDevices([0, 1], topics: ServeProject.phones + "\n    protect: true")
        #expect(try await project.reconciler().reconcile().outcome == .success)
        try project.writeDevices(
            [0, 1], topics: ServeProject.phones.replacingOccurrences(of: "phones", with: "handsets"))
        let result = try await project.reconciler().reconcile()
        #expect(result.outcome == .success, "\(result)")
        let held = try #require(result.held?.first)
        #expect(held.subject == Targets.Subject(.topic, "phones") && held.rail == "rail.protect", "\(held)")
        #expect(held.message.contains("topic 'phones' is protected"), "\(held.message)")
        #expect(result.summary.contains("held by a rail: topic:phones (rail.protect)"), "\(result.summary)")
        #expect(try await project.subscribers("phones", of: [0, 1]) == 2)
        #expect(try await project.subscribers("handsets", of: [0, 1]) == 2, "the rest is applied")
    }

    @Test func onChangePlanReportsWhatWaitsAndAppliesNothing() async throws {
        let project = try ServeProject()
        defer { project.remove() }
        try project.writeDevices([0, 1, 2])
        #expect(try await project.reconciler().reconcile().subscribed == 3)
        try project.writeDevices([0, 1, 2, 3, 4])
        let planned = try await project.reconciler { $0.onChange = .plan }.reconcile()
        #expect(planned.outcome == .success, "\(planned)")
        #expect(planned.changesWaiting == 1 && planned.subscribed == 0, "\(planned)")
        #expect(planned.summary.contains("1 change waiting (on_change: plan)"))
        #expect(try await project.subscribers("phones", of: [0, 1, 2, 3, 4]) == 3)
    }

    @Test func driftIsHealedUnderHealOnlyReportedUnderWarnAndAnOptOutIsNeverUndone() async throws {
        let project = try ServeProject()
        defer { project.remove() }
        try project.writeDevices(
            [0, 1, 2],
            topics: """
                topics:
                  - name: phones
                    mode: authoritative
                    members:
                      - selector: {kind: phone}
                  - name: news
                    members:
                      - selector: {kind: phone}
                """)
        #expect(try await project.reconciler().reconcile().subscribed == 6)
        // Someone removes d1 from the authoritative topic behind tidemark's back; d2's user turns news off.
        _ = try await project.runtime().withBackend(output: SilentOutput()) { backend in
            _ = try await backend.unsubscribe(topic: "phones", tokens: [Fixtures.token(1)])
            return try await backend.unsubscribe(topic: "news", tokens: [Fixtures.token(2)])
        }

        let warned = try await project.reconciler { $0.drift = .warn }.reconcile()
        #expect(warned.outcome == .success, "\(warned)")
        #expect(warned.drift?["dropped"] == 1 && warned.drift?["opted_out"] == 1, "\(warned)")
        #expect(!warned.driftHealed && warned.subscribed == 0, "\(warned)")
        #expect(warned.summary.contains("1 drifted membership reported (drift: warn)"), "\(warned.summary)")
        #expect(try await project.subscribers("phones", of: [0, 1, 2]) == 2)

        let healed = try await project.reconciler().reconcile()
        #expect(healed.drift?["dropped"] == 1 && healed.driftHealed && healed.subscribed == 1, "\(healed)")
        #expect(try await project.subscribers("phones", of: [0, 1, 2]) == 3)
        #expect(try await project.subscribers("news", of: [0, 1, 2]) == 2)
    }

    /// The runtime a reconciler keeps is loaded again when tidemark.yaml changed since: a file broken
    /// since fails the reconcile, naming its file and line; the next reconcile after it is fixed loads
    /// it and goes through.
    @Test func aBrokenSettingsFileIsAFailureNamingTheFileAndLine() async throws {
        let project = try ServeProject()
        defer { project.remove() }
        try project.writeDevices([0])
        let reconciler = try project.reconciler()
        try project.writeSettings("project: tidemark-serve-test\nrefresh: sometimes\n")
        let failed = await reconciler.reconcile()
        #expect(failed.outcome == .failure)
        #expect(failed.reason == "invalid_input")
        #expect(failed.message?.contains("tidemark.yaml:2") == true, "\(failed.message ?? "")")
        #expect(failed.message?.contains("'refresh' must be touched, sample, all or none") == true)
        try project.writeSettings("project: tidemark-serve-test\nmax_unsubscribes: 0\n")
        try project.writeDevices([0, 1])
        let fixed = await reconciler.reconcile()
        #expect(fixed.outcome == .success && fixed.subscribed == 2, "\(fixed)")
        // The rail the edit set holds at once: a manifest edit that unsubscribes is refused.
        try project.writeDevices([0])
        let blocked = await reconciler.reconcile()
        #expect(blocked.outcome == .blocked && blocked.reason == "rail.max_unsubscribes", "\(blocked)")
    }

    /// Each way an inventory source fails is a reason of its own (what webhooks dedupe, `/status` shows
    /// and alerts route on), not the manifests' `invalid_input`.
    @Test func anInventorySourceThatFailsHasAReasonOfItsOwn() async throws {
        let project = try ServeProject()
        defer { project.remove() }
        try project.writeDevices([0])
        for (command, extra, reason, says) in [
            ("true", "", "inventory_empty", "printed no devices"),
            ("sleep 30", "      timeout: 1s\n", "inventory_timeout", "did not finish within"),
            ("exit 3", "", "inventory_failed", "exit"),
        ] {
            try project.writeSettings(
                "project: tidemark-serve-test\nrefresh: all\ninventory:\n  - name: app\n    exec:\n      command: [sh, -c, \"\(command)\"]\n      format: csv\n\(extra)"
            )
            let failed = try await project.reconciler().reconcile()
            #expect(failed.outcome == .failure, "\(command): \(failed)")
            #expect(failed.reason == reason, "\(command): \(failed)")
            #expect(failed.message?.contains(says) == true, "\(command): \(failed.message ?? "")")
        }
    }

    @Test func theWaitDoublesAfterEachFailureUpToTheInterval() {
        var settings = ServeSettings()
        settings.interval = .seconds(300)
        settings.retryInterval = .seconds(30)
        #expect(settings.wait(afterFailures: 0) == .seconds(300))
        #expect(settings.wait(afterFailures: 1) == .seconds(30))
        #expect(settings.wait(afterFailures: 2) == .seconds(60))
        #expect(settings.wait(afterFailures: 4) == .seconds(240))
        #expect(settings.wait(afterFailures: 5) == .seconds(300))
        #expect(settings.wait(afterFailures: 60) == .seconds(300))
        #expect(ServeSettings.duration("5m") == .seconds(300) && ServeSettings.duration("soon") == nil)
        #expect(ServeSettings.describe(.seconds(5400)) == "1h30m")
    }
}
