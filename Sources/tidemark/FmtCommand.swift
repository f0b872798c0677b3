import ArgumentParser
import Foundation
import TidemarkCore
import TidemarkRuntime

struct FmtCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "fmt",
        abstract: "Rewrite the manifests in canonical form: stable key order, sorted member lists.",
        discussion: """
            Every *.yaml / *.yml file in the manifests directory is rewritten in place (atomically) \
            when it is not canonical. Comments, blank lines, quoting and short [flow] lists are kept; \
            the result is checked to mean exactly what the file meant. With --check nothing is written: \
            the files that need formatting are listed and the exit code is 1, for CI. With --diff each \
            change is shown as a unified diff (with --check, instead of being written).
            """
    )

    @OptionGroup var project: ProjectOptions

    @Flag(help: "Write nothing; list files that are not canonical and exit 1 if there are any.")
    var check = false

    @Flag(help: "Show each change as a unified diff (written too, unless --check).")
    var diff = false

    func run() async throws {
        try await runReportingErrors {
            let outcome = try Runtime(project).format(check: check)
            let changed = outcome.changed.map(\.file)
            if diff {
                for change in outcome.changed {
                    try Terminal.write(
                        UnifiedDiff.render(
                            change.original, change.formatted, oldName: change.file,
                            newName: "\(change.file) (formatted)"))
                }
            }
            for diagnostic in outcome.problems.condensed() { Terminal.err(diagnostic.description) }
            if check {
                if !diff { for file in changed { try Terminal.write("\(file)\n") } }
                if !changed.isEmpty {
                    Terminal.err(
                        "\(changed.count) file\(changed.count == 1 ? " is" : "s are") not formatted; run 'tidemark fmt' and commit the result."
                    )
                    throw ExitCode.failure
                }
            } else if diff {
                if !changed.isEmpty { Terminal.err("Formatted \(PlanRenderer.counted(changed.count, "file")).\n") }
            } else {
                for file in changed { try Terminal.write("formatted \(file)\n") }
            }
            if !outcome.problems.isEmpty { throw ExitCode.failure }
        }
    }
}
