import Foundation
import Testing
import TidemarkTesting

/// `tidemark state prune` and `prune_after`: state forgets devices that left, never what it still manages.
@Suite struct StatePruneCLITests {
    static func inventory(_ devices: Range<Int>) -> String {
        "device_id,token,platform\n" + devices.map { "d\($0),\(Fixtures.token($0, prefix: "pr")),ios\n" }.joined()
    }

    /// A project of `devices` iOS devices in one topic, applied once.
    static func converged(devices: Int, settings: String? = nil) throws -> CLIRunner {
        let cli = try CLIRunner()
        if let settings { try cli.write("tidemark.yaml", settings) }
        try cli.write("manifests/inventory/devices.csv", inventory(0..<devices))
        try cli.write(
            "manifests/topics.yaml",
            "inventory:\n  files: [inventory/devices.csv]\ntopics:\n  - name: ios\n    members: [{selector: {platform: ios}}]\n"
        )
        #expect(try cli.run(["apply", "--auto-approve"]).status == 0)
        return cli
    }

    @Test func forgetsDevicesThatLeftOnceTheirMembershipsAreGone() throws {
        let cli = try Self.converged(devices: 6)
        defer { cli.remove() }
        // Two devices leave; before the apply that unsubscribes them, prune keeps them: tidemark manages their memberships.
        try cli.write("manifests/inventory/devices.csv", Self.inventory(0..<4))
        let early = try cli.run(["state", "prune", "--older-than", "1s"])
        #expect(early.status == 0, "\(early.stderr)")
        Thread.sleep(forTimeInterval: 1.2)
        let kept = try cli.run(["state", "prune", "--older-than", "1s", "--dry-run"])
        #expect(kept.stdout.contains("Nothing to prune"), "\(kept.stdout)")
        let apply = try cli.run(["apply", "--auto-approve"])
        #expect(apply.status == 0, "\(apply.stdout)\(apply.stderr)")
        #expect(apply.stdout.contains("−2"), "\(apply.stdout)")
        Thread.sleep(forTimeInterval: 1.2)
        let dry = try cli.run(["state", "prune", "--older-than", "1s", "--dry-run"])
        #expect(
            dry.stdout.contains(
                "Would prune 2 of 6 tokens (0 dead, 2 no longer in the inventory), gone for 1s or more"),
            "\(dry.stdout)")
        let prune = try cli.run(["state", "prune", "--older-than", "1s"])
        #expect(prune.status == 0, "\(prune.stderr)")
        #expect(prune.stdout.contains("Pruned 2 of 6 tokens"), "\(prune.stdout)")
        let again = try cli.run(["state", "prune", "--older-than", "1s"])
        #expect(again.stdout.contains("Nothing to prune"), "\(again.stdout)")
        let plan = try cli.run(["plan", "--detailed-exitcode"])
        #expect(plan.status == 0, "pruning changed nothing that matters: \(plan.stdout)\(plan.stderr)")
        // An inventory that cannot be read would make every token look undeclared: refused.
        try cli.write("manifests/inventory/devices.csv", "")
        let broken = try cli.run(["state", "prune", "--older-than", "1s"])
        #expect(broken.status == 1 && broken.stderr.contains("inventory file is empty"), "\(broken.stderr)")
        #expect(try cli.run(["state", "prune", "--older-than", "soon"]).status == 64)
    }

    /// With `prune_after`, an apply that changed something prunes on its own once enough can go.
    @Test func applyPrunesOnItsOwnWithPruneAfter() throws {
        // A retention of 5 s, not 1: the apply that unsubscribes 1,100 devices reads them first, and on
        // a runner loaded by the whole suite more than a second can pass between that read and its
        // pruning step, which then found them gone long enough.
        let cli = try Self.converged(devices: 1_200, settings: "prune_after: 5s\n")
        defer { cli.remove() }
        try cli.write("manifests/inventory/devices.csv", Self.inventory(0..<100))
        // 1,100 of 1,200 devices leave on purpose: past the shrink guard, so it is told.
        let leave = try cli.run(["apply", "--auto-approve", "--allow-shrink"])
        #expect(leave.status == 0 && !leave.stdout.contains("Pruned"), "just unsubscribed: seen now, kept")
        Thread.sleep(forTimeInterval: 5.2)
        try cli.write("manifests/inventory/devices.csv", Self.inventory(0..<101))
        let join = try cli.run(["apply", "--auto-approve"])
        #expect(join.status == 0, "\(join.stderr)")
        #expect(join.stdout.contains("Pruned 1,099 of 1,200 tokens"), "\(join.stdout)")
        let plan = try cli.run(["plan", "--detailed-exitcode"])
        #expect(plan.status == 0, "\(plan.stdout)\(plan.stderr)")
    }
}
