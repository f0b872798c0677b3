import Foundation
import TidemarkCore

extension Workspace {
    /// Renders `plan` in `format` on standard output; a failed write is an error, never a silent success.
    /// `planFile` is named in markdown as where the full plan is.
    func output(
        _ plan: Plan, format: OutputFormat, inventory: Inventory?, partsDir: String? = nil,
        planFile: String? = nil
    ) throws {
        switch format {
        case .text:
            let text = renderer(inventory).render(plan)
            try Terminal.write(Terminal.colour ? Terminal.coloured(text) : text)
        case .markdown:
            var markdown = MarkdownPlanRenderer(
                showTokens: options.showTokens,
                fullPlanHint: planFile.map { "`\($0)` (`tidemark show \($0) --format json`)" },
                deviceName: deviceNamer(inventory))
            markdown.planFile = planFile
            try writeMarkdown(markdown.render(plan), partsDir: partsDir)
        case .json:
            try Terminal.writeJSON(plan)
        }
    }

    /// Prints markdown parts separated by a marker line, and writes each to `partsDir` when given.
    func writeMarkdown(_ parts: [String], partsDir: String?) throws {
        if let partsDir {
            try FileManager.default.createDirectory(atPath: partsDir, withIntermediateDirectories: true)
            let stale = (try? FileManager.default.contentsOfDirectory(atPath: partsDir)) ?? []
            for name in stale where name.hasPrefix("part-") && name.hasSuffix(".md") {
                try FileManager.default.removeItem(atPath: (partsDir as NSString).appendingPathComponent(name))
            }
            for (index, part) in parts.enumerated() {
                try writeAtomically(
                    Data(part.utf8), to: (partsDir as NSString).appendingPathComponent("part-\(index + 1).md"))
            }
        }
        var text = ""
        for (index, part) in parts.enumerated() {
            if index > 0 { text += "\n<!-- tidemark: part \(index + 1) of \(parts.count) -->\n\n" }
            text += part
        }
        try Terminal.write(text)
    }
}
