import Foundation
import Testing
import TidemarkCore
import TidemarkTesting

/// A broken source is not planned as devices leaving: an inventory that read far fewer devices than
/// the last apply recorded, or whose `exclude_if` left out most of it, stops plan and apply before
/// FCM is read; `--allow-shrink` (or `max_shrink`) accepts it, and the apply records the new counts.
@Suite struct ShrinkGuardTests {
    static func inventory(_ count: Int, lastSeen: ((Int) -> String)? = nil) -> String {
        (lastSeen == nil ? "device_id,token,team\n" : "device_id,token,team,last_seen\n")
            + (0..<count).map { i in
                "d\(i),\(Fixtures.token(i)),t\(i % 2)" + (lastSeen.map { ",\($0(i))" } ?? "")
            }.joined(separator: "\n") + "\n"
    }

    static let topics = """
        topics:
          - name: everyone
            mode: authoritative
            members: [{selector: {team: [t0, t1]}}]
        """

    @Test func theGuardComparesEachSourceWithTheLastApply() {
        var shrink = ShrinkGuard()
        let snapshots = [
            "a.csv": InventorySnapshot(identity: "", rows: 30),
            "b.csv": InventorySnapshot(identity: "", rows: 95),
            "c.csv": InventorySnapshot(identity: "", rows: 3),
            "inline devices": InventorySnapshot(identity: ""),
        ]
        let recorded = ["a.csv": 3000, "b.csv": 100, "c.csv": 8]
        let found = shrink.check(snapshots, against: recorded)
        #expect(found.map(\.source) == ["a.csv"], "5% and a handful of devices are within the limits")
        #expect(found.first?.description.contains("read 30 devices, 99% fewer than the 3,000") == true)
        shrink.perSource["a.csv"] = 1
        #expect(shrink.check(snapshots, against: recorded).isEmpty)
        // With no count recorded, only exclude_if leaving out most of a source stops the run.
        let excluded = ["e.csv": InventorySnapshot(identity: "", rows: 0, excluded: 3000)]
        #expect(
            ShrinkGuard().check(excluded, against: [:]).first?.description.contains("left out 3,000 of its 3,000")
                == true)
        #expect(Quantities.share("25%") == 0.25 && Quantities.share("0.5") == 0.5)
        #expect(Quantities.share("150%") == nil && Quantities.share("nan") == nil)
    }

    @Test func anExportThatLostMostOfItsDevicesStopsThePlanUntilAccepted() async throws {
        var project = try WorkflowTests.Project(files: [
            "inv.yaml": "inventory:\n  files: [inventory.csv]\n", "inventory.csv": Self.inventory(300),
            "topics.yaml": Self.topics,
        ])
        _ = try await project.apply()
        #expect(try await project.store.load()?.inventoryRows == ["inventory.csv": 300])
        // The export printed 3 of its 300 devices and exited 0.
        project.files["inventory.csv"] = Self.inventory(3)
        let calls = project.backend.calls.count
        await #expect {
            _ = try await project.plan()
        } throws: { error in
            guard let shrinks = (error as? WorkflowError)?.shrinks, !shrinks.isEmpty else { return false }
            let text = (error as! WorkflowError).description
            return shrinks.map(\.source) == ["inventory.csv"] && text.contains("read 3 devices, 99% fewer than the 300")
                && text.contains("--allow-shrink") && text.contains("nothing was read from FCM")
        }
        await #expect(throws: WorkflowError.self) { _ = try await project.apply() }
        #expect(project.backend.calls.count == calls, "nothing was read from or sent to FCM")
        // Accepted: the plan unsubscribes the 297, and the apply records the new count.
        var allowed = PlanRequest()
        allowed.allowShrink = true
        let plan = try await project.plan(allowed)
        #expect(plan.plan.operations.reduce(0) { $0 + ($1.kind == .unsubscribe ? $1.tokens.count : 0) } == 297)
        _ = try await project.apply(ApplyRequest(planning: allowed))
        #expect(try await project.store.load()?.inventoryRows == ["inventory.csv": 3])
        #expect(try await project.plan().plan.hasChanges == false)
    }

    @Test func maxShrinkOnTheSourceOrAtTheTopLevelAcceptsIt() async throws {
        var project = try WorkflowTests.Project(files: [
            "inv.yaml": "inventory:\n  files: [inventory.csv]\n", "inventory.csv": Self.inventory(300),
            "topics.yaml": Self.topics,
        ])
        _ = try await project.apply()
        project.files["inventory.csv"] = Self.inventory(200)
        var parts = project.parts
        var shrink = ShrinkGuard()
        shrink.share = 0.5
        parts.shrinkGuard = shrink
        #expect(try await PlanWorkflow(parts).run(PlanRequest()).plan.hasChanges)
        shrink.share = 0.1
        shrink.perSource["inventory.csv"] = 0.4
        parts.shrinkGuard = shrink
        #expect(try await PlanWorkflow(parts).run(PlanRequest()).plan.hasChanges)
        shrink.perSource = [:]
        parts.shrinkGuard = shrink
        await #expect(throws: WorkflowError.self) { _ = try await PlanWorkflow(parts).run(PlanRequest()) }
        let (settings, diagnostics) = ProjectSettings.decode("max_shrink: 30%\n", file: "tidemark.yaml")
        #expect(diagnostics.isEmpty && settings.shrinkGuard.share == 0.3)
        let (_, bad) = ProjectSettings.decode("max_shrink: lots\n", file: "tidemark.yaml")
        #expect(bad.first?.message.contains("'max_shrink' must be the share") == true)
    }

    /// `last_seen` in milliseconds is read as milliseconds; a time before FCM existed, or years ahead,
    /// is an error at its row rather than a reason to leave the device out.
    @Test func timestampsAreReadInTheirUnitAndImplausibleOnesRefused() async throws {
        let now: Int64 = 1_790_000_000  // 2026-09
        let rule = ExclusionRule(maxAge: 270 * 86_400, text: "270d")
        let recent = now - 86_400
        for text in [
            "\(recent)", "\(recent * 1000)", "\(recent * 1_000_000)", "\(recent * 1_000_000_000)", "\(recent).5",
        ] {
            #expect(rule.verdict(text, now: now) == .keep, "\(text)")
        }
        #expect(rule.verdict("\((now - 400 * 86_400) * 1000)", now: now) == .exclude)
        #expect(rule.verdict("1970-01-01", now: now) == .implausible(0))
        #expect(rule.verdict("\(recent / 1000)", now: now) == .implausible(recent / 1000))
        #expect(rule.verdict("\(now + 86_400 * 365)", now: now) == .implausible(now + 86_400 * 365))
        #expect(rule.verdict("yesterday", now: now) == .unreadable)
        var builder = InventoryBuilder()
        FileInventorySource.loadCSV(
            Data("device_id,token,last_seen\nd1,\(Fixtures.token(1)),1970-01-01\n".utf8), file: "devices.csv",
            into: &builder, exclusion: ExclusionFilter(rule, now: now))
        #expect(builder.diagnostics.first?.message.contains("reads as 1970-01-01T00:00:00Z") == true)
        #expect(builder.diagnostics.first?.location?.line == 2)
    }
}
