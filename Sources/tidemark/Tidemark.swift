import ArgumentParser
import Foundation
import TidemarkCore
import TidemarkRuntime

@main
struct Tidemark: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "tidemark",
        abstract: "Config-as-code for Firebase Cloud Messaging topics and device groups.",
        discussion: """
            Declare in YAML manifests which devices belong to which topics and device groups; \
            'tidemark plan' shows what must change in FCM and 'tidemark apply' makes it so, \
            within FCM's limits. Exit codes: 0 success or no changes, 1 error, 2 changes present \
            (only with --detailed-exitcode), 64 a command line tidemark does not understand (an unknown \
            flag, a missing argument), 130/143 when SIGINT/SIGTERM stopped a command (an apply resumes; a plan or drift changed nothing).
            """,
        version: versionReport.line,
        subcommands: [
            ValidateCommand.self, PlanCommand.self, ApplyCommand.self, DriftCommand.self, ShowCommand.self,
            DeviceCommand.self,
            ImportCommand.self, AudienceCommand.self, FmtCommand.self, StateCommand.self, WorkspaceCommand.self,
            EmulatorCommand.self,
            GroupsCommand.self, InitCommand.self, SchemaCommand.self, ServeCommand.self, StatusCommand.self,
            ReconcileCommand.self, SuspendCommand.self, ResumeCommand.self, NotifyCommand.self, InventoryCommand.self,
            VersionCommand.self,
        ]
    )

    /// As ArgumentParser's own entry point, except that 'tidemark help NAME' for a command that does not
    /// exist is an error (exit 64) instead of the top-level help with exit 0, and that its errors begin
    /// "error:" as tidemark's own do.
    static func main() async {
        let arguments = Array(CommandLine.arguments.dropFirst())
        if arguments.first == "help", let unknown = unknownHelpTopic(Array(arguments.dropFirst())) {
            FileHandle.standardError.write(
                Data("error: tidemark has no command '\(unknown)'; 'tidemark --help' lists the commands.\n".utf8))
            Foundation.exit(64)
        }
        do {
            var command = try parseAsRoot()
            if var asynchronous = command as? AsyncParsableCommand {
                try await asynchronous.run()
            } else {
                try command.run()
            }
        } catch {
            // As ArgumentParser's exit(withError:), with its "Error: " written as every other tidemark
            // error begins: "error: ".
            let code = exitCode(for: error)
            var message = fullMessage(for: error)
            if message.hasPrefix("Error: ") { message = "error: " + message.dropFirst("Error: ".count) }
            if !message.isEmpty {
                let stream = code == .success ? FileHandle.standardOutput : FileHandle.standardError
                stream.write(Data((message.hasSuffix("\n") ? message : message + "\n").utf8))
            }
            Foundation.exit(code.rawValue)
        }
    }

    /// The first name after 'help' that is not a subcommand of the one before it, if any.
    static func unknownHelpTopic(_ names: [String]) -> String? {
        var current: any ParsableCommand.Type = Tidemark.self
        for name in names where !name.hasPrefix("-") {
            guard
                let next = current.configuration.subcommands.first(where: {
                    $0.configuration.commandName == name || $0.configuration.aliases.contains(name)
                })
            else { return name }
            current = next
        }
        return nil
    }
}

/// Runs a command body, printing our errors as the runtime words them (`Failure`) and mapping them
/// to exit 1.
func runReportingErrors(_ body: () async throws -> Void) async throws {
    do {
        try await body()
    } catch let exit as ExitCode {
        throw exit
    } catch let error as CleanExit {
        throw error
    } catch let error as ValidationError {
        throw error
    } catch {
        for line in Failure(error).lines { Terminal.err(line) }
        throw ExitCode.failure
    }
}

/// Ends the process with `status` while `large` (a million devices' state, inventory and plan) is
/// still alive: it is never freed piece by piece (two million strings, a tenth of a second) on the way
/// out, and the process's exit returns the memory at once. For a command's last step only: what it
/// wrote to standard output is flushed first.
func endProcess(keeping large: some Any, with status: ExitStatus) -> Never {
    withExtendedLifetime(large) {
        fflush(nil)
        exit(status.rawValue)
    }
}

/// Ends the command with `status`: nothing for success, else that exit code.
func end(with status: ExitStatus) throws {
    if status != .success { throw ExitCode(status.rawValue) }
}

/// Prints diagnostics and stops with exit 1 when any is an error.
func reportDiagnostics(_ diagnostics: [Diagnostic]) throws {
    for diagnostic in diagnostics.condensed() { Terminal.err(diagnostic.description) }
    let errors = diagnostics.errorCount
    if errors > 0 {
        Terminal.err(WorkflowError.invalidManifests(errorCount: errors).description)
        throw ExitCode.failure
    }
}
