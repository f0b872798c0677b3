import ArgumentParser
import Foundation
import TidemarkCore
import TidemarkStore

struct ImportCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "import",
        abstract: "Adopt memberships that already exist in FCM into state, without changing FCM.",
        discussion: """
            Reads every known device (inventory and manifests) from the backend and records what it \
            holds. Memberships of declared members in declared topics become tidemark's own, so a later \
            removal from the manifests unsubscribes them; group keys found are recorded. Use it when \
            taking over a project whose devices were subscribed by other means. Nothing is sent to FCM \
            but reads; nothing tidemark managed before is forgotten.
            """
    )

    @OptionGroup var global: GlobalOptions

    @OptionGroup var selection: TargetOptions

    @Flag(help: "Show what would be adopted, without writing state.")
    var dryRun = false

    func run() async throws {
        try await runReportingErrors {
            let targets = try selection.targets()
            let workspace = try Workspace(global)
            let lock = dryRun ? nil : try workspace.lockState(for: "tidemark import")
            defer { withExtendedLifetime(lock) {} }
            let existing = try workspace.openStore(create: false)
            if let existing, try existing.unfinishedApply() != nil {
                throw CLIError("an apply was interrupted; finish it with 'tidemark apply' before importing.")
            }
            var (state, loaded) = try await workspace.loadStateAndManifests(existing)
            try reportDiagnostics(loaded.diagnostics.filter { $0.severity == .error })
            let refresh = try await workspace.withBackend { backend in
                try await workspace.refresh(state: state, loaded: loaded, backend: backend)
            }
            let before = state
            state.absorb(refresh)
            let adopted = state.adopt(loaded.desired, targets: targets)
            let total = adopted.values.reduce(0, +)
            let groups = loaded.desired.groups.filter { targets.coversGroup($0.name) && state.groups[$0.name]?.key != nil }
            var lines: [String] = []
            let verb = dryRun ? "Would adopt" : "Adopted"
            lines.append("\(verb) \(PlanRenderer.formatCount(total)) existing membership\(total == 1 ? "" : "s") in \(adopted.count) topic\(adopted.count == 1 ? "" : "s"); \(PlanRenderer.formatCount(refresh.refreshed.count)) registrations read, \(refresh.dead.count) dead; \(groups.count) declared device group\(groups.count == 1 ? "" : "s") found in FCM.")
            for (topic, count) in adopted.sorted(by: { $0.key < $1.key }) {
                lines.append("  \(topic): \(PlanRenderer.formatCount(count))")
            }
            if !groups.isEmpty {
                lines.append("FCM cannot list a group's members, so the next apply adds the declared members to \(groups.count == 1 ? "it" : "them") (no change for members already in).")
            }
            if dryRun {
                lines.append("Dry run: state was not written.")
            } else {
                let store = try workspace.storeForWriting(existing, state: &state)
                var write = SQLiteStateStore.Write()
                write.includeTopicsAndGroups(before: before, after: state)
                write.allTokens = true
                let serial = try store.save(&state, write)
                lines.append("State \(workspace.stateDisplay) is now at serial \(serial). 'tidemark plan' shows what is left to change.")
            }
            try Terminal.write(lines.joined(separator: "\n") + "\n")
        }
    }
}
