import Foundation
import PackagePlugin

/// Writes the commit the package was built from and the build date into the target it is applied to
/// (`BuildInfo+Generated.swift`), before every build. `scripts/lib/build-info.sh` does the work and
/// rewrites the file only when what it says changed, so an unchanged checkout recompiles nothing.
@main
struct BuildInfoPlugin: BuildToolPlugin {
    func createBuildCommands(context: PluginContext, target: Target) throws -> [Command] {
        let output = context.pluginWorkDirectoryURL.appending(path: "Generated")
        let package = context.package.directoryURL
        let script = package.appending(path: "scripts/lib/build-info.sh")
        return [
            .prebuildCommand(
                displayName: "Recording the commit and the build date",
                executable: URL(fileURLWithPath: "/bin/sh"),
                arguments: [script.path, package.path, output.path],
                outputFilesDirectory: output)
        ]
    }
}
