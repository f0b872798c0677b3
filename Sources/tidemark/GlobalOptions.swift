import ArgumentParser
import TidemarkCore

/// Options every command takes.
struct GlobalOptions: ParsableArguments {
    @Option(name: .customShort("C"), help: ArgumentHelp("Project directory.", valueName: "DIR"))
    var directory: String = "."

    @Option(help: ArgumentHelp("Manifests directory (default: DIR/manifests, or 'manifests' in tidemark.yaml).",
        valueName: "DIR"))
    var manifests: String?

    @Option(help: ArgumentHelp("Backend: embedded (in-process emulator, the default), emulator or fcm.",
        valueName: "KIND"))
    var backend: String?

    @Flag(help: "Show registration tokens in full in human output (they are redacted by default).")
    var showTokens = false

    func validate() throws {
        if let backend, !ProjectSettings.backends.contains(backend) {
            throw ValidationError("unknown backend '\(backend)'; use embedded, emulator or fcm.")
        }
    }
}

enum OutputFormat: String, ExpressibleByArgument, CaseIterable {
    case text, json
}
