import Foundation
import TidemarkCore

/// The bytes of the files a runtime's settings were read from (tidemark.yaml, and the inventory file
/// it names), as they were read: a runtime kept for long (`serve`'s) compares them with the files
/// now to know it must be loaded again.
public struct SettingsFiles: Sendable, Equatable {
    /// Each file's absolute path and its bytes when read (nil: it did not exist).
    var files: [Entry]

    struct Entry: Sendable, Equatable {
        var path: String
        var bytes: Data?
    }

    /// Whether a file differs from what was read (edited, created, removed).
    public func changed() -> Bool {
        files.contains { FileManager.default.contents(atPath: $0.path) != $0.bytes }
    }
}

/// Reads a project's `tidemark.yaml` (absent: the defaults) and the inventory file it names.
enum ProjectFile {
    /// tidemark.yaml of the project at `root` (`directory` as the user named it), with `inventory:
    /// FILE` read in; `registries` say the kinds of source its `inventory:` may declare and the
    /// transports `transport` may name. Throws the file's diagnostics, or a `RuntimeError` naming what
    /// cannot be read.
    static func read(
        root: String, directory: String, registries: Registries = .standard
    ) throws -> ProjectSettings {
        var files = SettingsFiles(files: [])
        return try read(root: root, directory: directory, registries: registries, files: &files)
    }

    /// `read`, keeping in `files` the bytes of each file as it was read.
    static func read(
        root: String, directory: String, registries: Registries = .standard, files: inout SettingsFiles
    ) throws -> ProjectSettings {
        let sourceKinds = registries.sources.kinds
        let settingsFile = (root as NSString).appendingPathComponent("tidemark.yaml")
        let settingsDisplay = ResolvedSettings.display(directory, "tidemark.yaml")
        var settings: ProjectSettings
        // Recorded as absent until read: a tidemark.yaml created later is a change.
        let entry = files.files.count
        files.files.append(SettingsFiles.Entry(path: settingsFile, bytes: nil))
        do {
            let data = try InputFile.read(settingsFile, atMost: 16 << 20)
            files.files[entry].bytes = data
            guard let text = String(data: data, encoding: .utf8) else {
                throw RuntimeError("\(settingsDisplay) is not UTF-8 text; save it as UTF-8.")
            }
            let (decoded, diagnostics) = ProjectSettings.decode(
                text, file: settingsDisplay, sourceKinds: sourceKinds, transports: registries.transports.transports)
            if diagnostics.hasErrors { throw DiagnosticsError(diagnostics) }
            settings = decoded
        } catch let error as InputFileError where error.kind == .notFound {
            settings = ProjectSettings()
        } catch let error as InputFileError {
            throw RuntimeError("cannot read \(settingsDisplay): \(error).")
        }
        if let file = settings.inventoryFile {
            settings.inventory = try readInventoryFile(
                file, root: root, directory: directory, at: settings.inventoryFileLocation, sourceKinds: sourceKinds,
                files: &files)
        }
        return settings
    }

    /// The sources of a file tidemark.yaml names; like tidemark.yaml it must be protected in review, so
    /// it may not live in the manifests directory (where every pull request edits files).
    static func readInventoryFile(
        _ file: String, root: String, directory: String, at location: SourceLocation?, sourceKinds: [SourceKind],
        files: inout SettingsFiles
    ) throws -> [ConfiguredSource] {
        let path = ResolvedSettings.absolute(file, in: root)
        let display = ResolvedSettings.display(directory, file)
        let data: Data
        do {
            data = try InputFile.read(path, atMost: 16 << 20)
            files.files.append(SettingsFiles.Entry(path: path, bytes: data))
        } catch {
            throw RuntimeError(
                "\(location.map { "\($0): " } ?? "")cannot read the inventory file \(display) that tidemark.yaml names: \(ErrorText.describe(error))."
            )
        }
        guard let text = String(data: data, encoding: .utf8) else {
            throw RuntimeError("\(display) is not UTF-8 text; save it as UTF-8.")
        }
        let (sources, diagnostics) = ProjectSettings.decodeInventoryFile(text, file: display, sourceKinds: sourceKinds)
        if diagnostics.hasErrors { throw DiagnosticsError(diagnostics) }
        return sources
    }
}
