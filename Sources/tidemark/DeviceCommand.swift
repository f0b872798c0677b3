import ArgumentParser
import Foundation
import TidemarkCore
import TidemarkRuntime

struct DeviceCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "device",
        abstract: "Show one device: every topic and group it is in, desired and last observed, and why.",
        discussion: """
            Looks the device up by its inventory id or by a registration token (a device the inventory no \
            longer lists is found by the id state remembers). For each topic and group it prints whether \
            the manifests declare the device there and which entry does (selector, device list or token \
            file, at file:line), whether tidemark last saw it there, and what the next apply does about \
            it. Reads state and the manifests only: nothing is read from FCM or written.
            """
    )

    @OptionGroup var global: GlobalOptions

    @Argument(help: ArgumentHelp("A device id from the inventory, or a registration token.", valueName: "ID|TOKEN"))
    var query: String

    @OptionGroup var output: DataFormatOption

    func validate() throws {
        if query.trimmingCharacters(in: .whitespacesAndNewlines).isEmpty {
            throw ValidationError("ID|TOKEN is empty; name a device id from the inventory or a registration token.")
        }
    }

    func run() async throws {
        try await runReportingErrors {
            let runtime = try Runtime(global)
            let view = try await TerminalOutput.during { try await runtime.device(query, output: $0) }
            if output.json {
                try Terminal.writeJSON(view)
            } else {
                try Terminal.write(DeviceRenderer(showTokens: global.showTokens).text(view))
            }
        }
    }
}
