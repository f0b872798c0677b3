import Foundation
import TidemarkCore

/// What `tidemark fmt` found: the manifest files not in canonical form (rewritten unless checking)
/// and the files that could not be read or formatted.
public struct FormatOutcome: Sendable {
    /// A manifest file whose canonical form differs from its text.
    public struct Change: Sendable {
        /// The file as the user names it (under the manifests directory as given).
        public var file: String
        /// Its text before.
        public var original: String
        /// Its canonical form (what it holds now, unless checking).
        public var formatted: String
    }

    /// The files not in canonical form, in the order of their names.
    public var changed: [Change] = []
    /// Files that could not be read, or whose text does not parse; they are left as they were.
    public var problems: [Diagnostic] = []
}

extension Runtime {
    /// Puts every `*.yaml` and `*.yml` file of the manifests directory (subdirectories included, as
    /// plan reads them) in canonical form, each rewritten atomically with its mode kept, unless
    /// `check` (then nothing is written). A file that cannot be read or parsed is a problem of the
    /// outcome and left alone; the others are still formatted.
    public func format(check: Bool) throws -> FormatOutcome {
        guard let names = try? DiskFileSource(root: manifestsPath, displayRoot: manifestsPath).listFiles(".") else {
            throw RuntimeError(
                "the manifests directory \(manifestsPath) does not exist; pass --manifests DIR or -C DIR.")
        }
        var outcome = FormatOutcome()
        for name in names.filter({ $0.hasSuffix(".yaml") || $0.hasSuffix(".yml") }).sorted() {
            let path = (manifestsPath as NSString).appendingPathComponent(name)
            let display = (manifestsDisplay as NSString).appendingPathComponent(name)
            let data: Data
            do {
                data = try InputFile.read(
                    path, atMost: settings.limits.manifestBytes, setting: "manifest_bytes", within: confinement)
            } catch {
                outcome.problems.append(
                    .error(
                        "cannot read: \(ErrorText.describe(error)).",
                        at: SourceLocation(file: display, line: 1, column: 1)))
                continue
            }
            let text = String(decoding: data, as: UTF8.self)
            switch ManifestFormatter().format(text, file: display) {
            case .failed(let diagnostics):
                outcome.problems += diagnostics
            case .formatted(let formatted) where formatted != text:
                outcome.changed.append(.init(file: display, original: text, formatted: formatted))
                if !check {
                    let mode =
                        ((try? FileManager.default.attributesOfItem(atPath: path))?[.posixPermissions] as? Int) ?? 0o644
                    try AtomicFile.write(Data(formatted.utf8), to: path, mode: mode)
                }
            case .formatted:
                break
            }
        }
        return outcome
    }
}
