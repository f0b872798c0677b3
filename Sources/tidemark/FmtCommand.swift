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
            let runtime = try Runtime(project)
            let files = try manifestFiles(runtime.manifestsPath)
            var changed: [String] = []
            var problems: [Diagnostic] = []
            for name in files {
                let path = (runtime.manifestsPath as NSString).appendingPathComponent(name)
                let display = (runtime.manifestsDisplay as NSString).appendingPathComponent(name)
                let data: Data
                do {
                    data = try InputFile.read(
                        path, atMost: runtime.settings.limits.manifestBytes, setting: "manifest_bytes",
                        within: runtime.confinement)
                } catch {
                    problems.append(
                        .error(
                            "cannot read: \(ErrorText.describe(error)).",
                            at: SourceLocation(file: display, line: 1, column: 1)))
                    continue
                }
                let text = String(decoding: data, as: UTF8.self)
                switch ManifestFormatter().format(text, file: display) {
                case .failed(let diagnostics):
                    problems += diagnostics
                case .formatted(let formatted) where formatted != text:
                    changed.append(display)
                    if diff {
                        try Terminal.write(
                            UnifiedDiff.render(text, formatted, oldName: display, newName: "\(display) (formatted)"))
                    }
                    if !check {
                        let mode =
                            ((try? FileManager.default.attributesOfItem(atPath: path))?[.posixPermissions] as? Int)
                            ?? 0o644
                        try writeAtomically(Data(formatted.utf8), to: path, mode: mode)
                    }
                case .formatted:
                    break
                }
            }
            for diagnostic in problems.condensed() { Terminal.err(diagnostic.description) }
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
            if !problems.isEmpty { throw ExitCode.failure }
        }
    }

    /// The manifest files, sorted, relative to the directory, subdirectories included (as plan reads them).
    private func manifestFiles(_ directory: String) throws -> [String] {
        guard let names = try? DiskFileSource(root: directory, displayRoot: directory).listFiles(".") else {
            throw CLIError("the manifests directory \(directory) does not exist; pass --manifests DIR or -C DIR.")
        }
        return names.filter { $0.hasSuffix(".yaml") || $0.hasSuffix(".yml") }.sorted()
    }
}
