import ArgumentParser
import Foundation
import TidemarkCore
import TidemarkRuntime

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
    @OptionGroup var refreshing: RefreshOptions
    @OptionGroup var output: DataFormatOption

    @OptionGroup var selection: TargetOptions

    @Flag(help: "Show what would be adopted, without writing state.")
    var dryRun = false

    func run() async throws {
        try await runReportingErrors {
            let targets = try selection.targets()
            let runtime = try Runtime(global, readQPS: refreshing.readQps)
            let outcome = try await TerminalOutput.during {
                try await runtime.importMemberships(
                    targets: targets, dryRun: dryRun, output: $0, acceptDead: refreshing.acceptDead)
            }
            let total = outcome.adoptedTotal
            let groups = outcome.groupsFound
            if output.json {
                struct Report: Encodable {
                    var dryRun: Bool
                    var adopted: [String: Int]
                    var adoptedTotal: Int
                    var registrationsRead: Int
                    var dead: Int
                    var groupsFound: [String]
                    var serial: Int?
                    var state: String
                }
                try Terminal.writeJSON(
                    Report(
                        dryRun: dryRun, adopted: outcome.adopted, adoptedTotal: total,
                        registrationsRead: outcome.registrationsRead, dead: outcome.dead, groupsFound: groups,
                        serial: outcome.serial, state: runtime.stateDisplay))
                return
            }
            var lines: [String] = []
            let verb = dryRun ? "Would adopt" : "Adopted"
            lines.append(
                "\(verb) \(PlanRenderer.formatCount(total)) existing membership\(total == 1 ? "" : "s") in \(outcome.adopted.count) topic\(outcome.adopted.count == 1 ? "" : "s"); \(PlanRenderer.formatCount(outcome.registrationsRead)) registrations read, \(outcome.dead) dead; \(groups.count) declared device group\(groups.count == 1 ? "" : "s") found in FCM."
            )
            for (topic, count) in outcome.adopted.sorted(by: { $0.key < $1.key }) {
                lines.append("  \(topic): \(PlanRenderer.formatCount(count))")
            }
            if !groups.isEmpty {
                lines.append(
                    "FCM cannot list a group's members, so the next apply adds the declared members to \(groups.count == 1 ? "it" : "them") (no change for members already in)."
                )
            }
            if let serial = outcome.serial {
                lines.append(
                    "State \(runtime.stateDisplay) is now at serial \(serial). 'tidemark plan' shows what is left to change."
                )
            } else {
                lines.append("Dry run: state was not written.")
            }
            try Terminal.write(lines.joined(separator: "\n") + "\n")
        }
    }
}
