import ArgumentParser
import TidemarkBuildInfo
import TidemarkRuntime

/// This tidemark's version report, with what its build recorded.
let versionReport = VersionReport(commit: BuildInfo.commit, built: BuildInfo.date, swift: BuildInfo.swiftVersion)

/// `tidemark version`: the release, the commit and date it was built from, the Swift version, and the
/// state and plan formats it reads and writes.
struct VersionCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "version",
        abstract: "Print the version, the commit it was built from, and the formats it reads and writes.",
        discussion:
            "The commit is taken from git when tidemark is built ('-dirty' when the checkout had uncommitted changes; 'unknown' when it was not built from a git checkout). 'tidemark --version' prints the same in one line, the version first."
    )

    @OptionGroup var output: DataFormatOption

    func run() async throws {
        if output.json {
            try Terminal.writeJSON(versionReport)
        } else {
            try Terminal.write(versionReport.text)
        }
    }
}
