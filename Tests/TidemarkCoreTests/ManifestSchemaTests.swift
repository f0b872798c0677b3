import Foundation
import Testing

@testable import TidemarkCore

/// The manifest's shape is described once (`ManifestSchema`); the decoder, the formatter and the JSON
/// Schema editors use must agree with it. This fails when one of them drifts.
@Suite struct ManifestSchemaTests {
    static let schemaURL = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("schema/tidemark-manifest.schema.json")

    /// The JSON Schema object that describes `node`.
    static func object(_ node: ManifestSchema.Node, in schema: [String: Any]) throws -> [String: Any] {
        let definitions = try #require(schema["definitions"] as? [String: Any])
        let properties = try #require(schema["properties"] as? [String: Any])
        switch node {
        case .root: return schema
        case .inventory: return try #require(properties["inventory"] as? [String: Any])
        case .inventoryFile:
            let choices = try #require((definitions["inventoryFile"] as? [String: Any])?["oneOf"] as? [[String: Any]])
            return try #require(choices.first { $0["type"] as? String == "object" })
        case .device, .topic, .group, .audience, .member, .removed:
            return try #require(definitions[node.rawValue] as? [String: Any])
        }
    }

    @Test(arguments: ManifestSchema.Node.allCases)
    func jsonSchemaNamesTheSameKeys(_ node: ManifestSchema.Node) throws {
        let schema = try #require(
            try JSONSerialization.jsonObject(with: Data(contentsOf: Self.schemaURL)) as? [String: Any])
        let described = try Self.object(node, in: schema)
        let keys = try #require(described["properties"] as? [String: Any]).keys
        #expect(Set(keys) == Set(ManifestSchema.keys(node)), "schema/tidemark-manifest.schema.json, \(node)")
        #expect(
            Set(described["required"] as? [String] ?? []) == Set(ManifestSchema.required(node)),
            "required keys of \(node)")
        #expect(described["additionalProperties"] as? Bool == false, "\(node) refuses unknown keys in the schema too")
    }

    /// The decoder refuses any key the schema does not name, and accepts every key it does.
    @Test func decoderAllowsExactlyTheSchemaKeys() {
        #expect(ManifestDecoder.topLevelKeys == ManifestSchema.keys(.root))
        #expect(ManifestDecoder.inventoryKeys == ManifestSchema.keys(.inventory))
        #expect(ManifestDecoder.inventoryFileKeys == ManifestSchema.keys(.inventoryFile))
        #expect(ManifestDecoder.deviceKeys == ManifestSchema.keys(.device))
        #expect(ManifestDecoder.topicKeys == ManifestSchema.keys(.topic))
        #expect(ManifestDecoder.groupKeys == ManifestSchema.keys(.group))
        #expect(ManifestDecoder.audienceKeys == ManifestSchema.keys(.audience))
        #expect(ManifestDecoder.memberKeys == ManifestSchema.keys(.member))
    }

    /// The formatter writes every node's keys in the schema's order.
    @Test func formatterOrdersKeysAsTheSchema() throws {
        let text = """
            removed:
              - unsubscribe: false
                topic: old
            audiences:
              - members: [{devices: [d1]}]
                retire_group_key: true
                name: everyone
            groups:
              - members: [{devices: [d1]}]
                protect: true
                description: family
                notification_key_name: g
            topics:
              - members: [{devices: [d1]}]
                allow_empty: false
                protect: false
                mode: additive
                description: news
                name: a
            inventory:
              devices:
                - labels: {region: north}
                  token: "abc:APA91b"
                  id: d1
              files:
                - {format: csv, path: export.txt}
            """
        guard case .formatted(let output) = ManifestFormatter().format(text, file: "m.yaml") else {
            Issue.record("the formatter refused a valid manifest")
            return
        }
        func order(_ keys: [String]) -> [String] {
            keys.sorted { output.range(of: "\($0):")!.lowerBound < output.range(of: "\($1):")!.lowerBound }
        }
        #expect(order(ManifestSchema.keys(.root)) == ManifestSchema.keys(.root), "\(output)")
        #expect(
            order(["name", "description", "mode", "protect", "allow_empty"]) == [
                "name", "description", "mode", "protect", "allow_empty",
            ])
        let audiencePart = String(output[output.range(of: "audiences:")!.lowerBound...])
        #expect(
            ["name", "retire_group_key", "members"].sorted {
                audiencePart.range(of: "\($0):")!.lowerBound < audiencePart.range(of: "\($1):")!.lowerBound
            } == ["name", "retire_group_key", "members"], "\(output)")
        let groupPart = String(output[output.range(of: "groups:")!.lowerBound...])
        let groupKeys = ["notification_key_name", "description", "protect", "members"]
        #expect(
            groupKeys.sorted { groupPart.range(of: "\($0):")!.lowerBound < groupPart.range(of: "\($1):")!.lowerBound }
                == ManifestSchema.keys(.group))
        #expect(order(["id", "token", "labels"]) == ManifestSchema.keys(.device))
        let removedPart = String(output[output.range(of: "removed:")!.lowerBound...])
        #expect(removedPart.range(of: "topic:")!.lowerBound < removedPart.range(of: "unsubscribe:")!.lowerBound)
        #expect(order(["path", "format"]) == ManifestSchema.keys(.inventoryFile))
    }
}
