import Foundation

/// The formats an inventory file can have.
public enum InventoryFormat: String, Sendable, CaseIterable, Codable {
    /// A header row naming `device_id` (or `id`) and `token`; every other column is a label.
    case csv
    /// One JSON object a line: `{"id": …, "token": …, "labels": {…}}`.
    case jsonl

    /// The format a file's name implies, when it implies one (`.gz` after it means gzip).
    public init?(suffixOf path: String) {
        let path = path.hasSuffix(".gz") ? String(path.dropLast(3)) : path
        if path.hasSuffix(".csv") {
            self = .csv
        } else if path.hasSuffix(".jsonl") || path.hasSuffix(".ndjson") {
            self = .jsonl
        } else {
            return nil
        }
    }
}
