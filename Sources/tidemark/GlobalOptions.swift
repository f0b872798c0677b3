import ArgumentParser
import TidemarkCore

/// Options every command takes.
struct GlobalOptions: ParsableArguments {
    /// `-C` and `--manifests`, as `fmt` takes them alone.
    @OptionGroup var project: ProjectOptions

    /// The project directory (`-C`).
    var directory: String { project.directory }
    /// The manifests directory (`--manifests`), when given.
    var manifests: String? { project.manifests }

    @Option(
        help: ArgumentHelp(
            "Backend: embedded (in-process emulator, the default), emulator or fcm.",
            valueName: "KIND"))
    var backend: BackendKind?

    @Option(
        help: ArgumentHelp(
            "Topic API for the emulator and fcm backends: v1 (default) or iid (deprecated by Google).",
            valueName: "API"))
    var transport: TopicTransport?

    @Option(
        help: ArgumentHelp(
            "Where state lives: a SQLite file path, or a postgres:// URL (wins over TIDEMARK_STATE_URL and 'state' in tidemark.yaml).",
            valueName: "PATH|URL"))
    var state: String?

    @Option(
        help: ArgumentHelp(
            "The state workspace (default: 'workspace' in tidemark.yaml, or 'default'): one per project and environment.",
            valueName: "NAME"))
    var workspace: String?

    @Flag(help: "Show registration tokens in full in human output (they are redacted by default).")
    var showTokens = false
}

enum OutputFormat: String, ExpressibleByArgument, CaseIterable {
    case text, markdown, json
}

extension BackendKind: ExpressibleByArgument {}
extension TopicTransport: ExpressibleByArgument {}
extension QuotaUnit: ExpressibleByArgument {}

/// `--format text|json` for commands that print data but not plans (plans and drift reports also
/// have markdown, so only their commands offer it: `--help` lists exactly what is accepted).
struct DataFormatOption: ParsableArguments {
    enum DataFormat: String, ExpressibleByArgument, CaseIterable {
        case text, json
    }

    @Option(help: "Output format: text, or json (one document on stdout, full tokens, for scripts).")
    var format: DataFormat = .text

    var json: Bool { format == .json }
}

/// The options of commands that read only the project's files (`fmt`): where the project and its
/// manifests are, nothing about state or FCM.
struct ProjectOptions: ParsableArguments {
    @Option(name: .customShort("C"), help: ArgumentHelp("Project directory.", valueName: "DIR"))
    var directory: String = "."

    @Option(
        help: ArgumentHelp(
            "Manifests directory (default: DIR/manifests, or 'manifests' in tidemark.yaml).",
            valueName: "DIR"))
    var manifests: String?
}
