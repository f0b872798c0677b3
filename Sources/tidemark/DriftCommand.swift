import ArgumentParser
import Foundation
import TidemarkCore
import TidemarkRuntime

struct DriftCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "drift",
        abstract: "Find what moved in FCM since the last apply, without changing anything.",
        discussion: """
            Reads the backend (by default the registrations a plan would change and the sweep's slice of \
            the rest; --refresh all reads every one) and classifies what nobody planned: \
            devices that subscribed themselves to authoritative topics, devices that dropped declared \
            topics, dead tokens, vanished device groups. Neither FCM nor the state file is \
            changed; 'tidemark apply' corrects the drift. For scheduled jobs: --detailed-exitcode exits 2 \
            when there is drift; --json writes one event per line for log pipelines. A sample says what \
            share of the fleet it read and estimates, with bounds, the drift among the rest.
            """
    )

    @OptionGroup var global: GlobalOptions
    @OptionGroup var refreshing: RefreshOptions
    @OptionGroup var reading: RefreshModeOptions
    @OptionGroup var render: RenderOptions

    @Flag(help: "Exit 2 when drift was found, 0 when none, 1 on error.")
    var detailedExitcode = false

    @Flag(
        name: .customLong("json"),
        help:
            "Write an NDJSON event stream (one 'drift' event per finding, then a 'summary'); tokens redacted unless --show-tokens."
    )
    var ndjson = false

    func validate() throws {
        if reading.noRefresh || reading.refresh == RefreshMode.none {
            throw ValidationError(
                "drift compares what FCM holds with state, so it must read something: use --refresh touched, sample or all."
            )
        }
        if ndjson, render.format != .text {
            throw ValidationError(
                "--json writes the event stream; it cannot be combined with --format \(render.format.rawValue).")
        }
    }

    func run() async throws {
        try await Interruption.endingAtOnce("drift reads FCM and state and changes neither, so nothing was changed.") {
            try await report()
        }
    }

    private func report() async throws {
        try await runReportingErrors {
            let runtime = try Runtime(global, readQPS: refreshing.readQps)
            let policy = runtime.refreshPolicy(try reading.flags())
            let report = try await TerminalOutput.during {
                try await runtime.drift(policy, output: $0, acceptDead: refreshing.acceptDead)
            }
            let renderer = DriftRenderer(showTokens: global.showTokens)
            if ndjson {
                try Terminal.write(renderer.ndjson(report))
            } else {
                switch render.format {
                case .text: try Terminal.write(renderer.text(report))
                case .markdown: try runtime.writeMarkdown(renderer.markdown(report), partsDir: render.partsDir)
                case .json:
                    try Terminal.writeJSON(report)
                }
            }
            try end(with: report.exitStatus(detailedExitcode: detailedExitcode))
        }
    }
}
