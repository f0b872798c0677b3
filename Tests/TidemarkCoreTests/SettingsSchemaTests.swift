import Foundation
import Testing

@testable import TidemarkCore

/// `schema/tidemark.schema.json` (and the reference page generated from it) names exactly the keys the
/// parser of tidemark.yaml accepts, at every level: a key added to one and not the other fails here.
@Suite struct SettingsSchemaTests {
    static let schemaURL = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("schema/tidemark.schema.json")

    /// The object at `path`: each key steps into a property, `[]` into a list's items (the list
    /// choice of a `oneOf`, for `inventory`).
    static func object(_ path: [String], in schema: [String: Any]) throws -> [String: Any] {
        var node = schema
        for step in path {
            if step == "[]" {
                if let choices = node["oneOf"] as? [[String: Any]] {
                    node = try #require(choices.first { $0["type"] as? String == "array" })
                }
                node = try #require(node["items"] as? [String: Any], "\(path)")
            } else {
                node = try #require((node["properties"] as? [String: Any])?[step] as? [String: Any], "\(path)")
            }
        }
        return node
    }

    static func keys(_ path: [String], in schema: [String: Any]) throws -> Set<String> {
        Set(try #require(try object(path, in: schema)["properties"] as? [String: Any], "\(path)").keys)
    }

    @Test func theSchemaNamesTheKeysTheParserAccepts() throws {
        let schema = try #require(
            try JSONSerialization.jsonObject(with: Data(contentsOf: Self.schemaURL)) as? [String: Any])
        let expected: [([String], [String])] = [
            ([], ProjectSettings.keys),
            (["limits"], InputLimits.keys),
            (["unregistered"], ["v1", "iid"]),
            (["group_export"], ["query", "field"]),
            (["acknowledge"], DeadlineCheck.acknowledgeable),
            (["inventory", "[]"], ConfiguredSource.keys + SourceKind.builtIn.map(\.key)),
            (["inventory", "[]", "postgres"], PostgresSourceSettings.keys),
            (["inventory", "[]", "postgres", "changes"], ["query", "cursor"]),
            (["inventory", "[]", "exec"], ExecSourceSettings.keys),
            (["inventory", "[]", "exclude_if"], ["last_seen_older_than", "column"]),
            (["serve"], ["workspaces", "notify", "source"] + ServeSection.scheduleKeys),
            (["serve", "source"], ServeSection.GitSource.keys),
            (["serve", "windows", "[]"], ServeWindow.keys),
            (["serve", "notify", "[]"], NotifyTarget.keys),
            (["serve", "workspaces", "[]"], ServeSection.workspaceKeys),
            (["serve", "workspaces", "[]", "source"], ServeSection.GitSource.keys),
            (["serve", "workspaces", "[]", "windows", "[]"], ServeWindow.keys),
        ]
        for (path, keys) in expected {
            #expect(try Self.keys(path, in: schema) == Set(keys), "tidemark.yaml at \(path)")
        }
        // Every object of the schema refuses keys it does not name, as the parser does.
        func closed(_ node: [String: Any], _ path: String) {
            if node["properties"] != nil {
                #expect(node["additionalProperties"] as? Bool == false, "\(path) takes any key")
            }
            for (key, child) in node["properties"] as? [String: Any] ?? [:] {
                if let child = child as? [String: Any] { closed(child, path + "." + key) }
            }
            if let items = node["items"] as? [String: Any] { closed(items, path + "[]") }
            for choice in node["oneOf"] as? [[String: Any]] ?? [] { closed(choice, path) }
        }
        closed(schema, "tidemark.yaml")
    }
}
