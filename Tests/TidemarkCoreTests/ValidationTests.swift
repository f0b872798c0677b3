import Foundation
import Testing

@testable import TidemarkCore

private typealias Loc = TidemarkCore.SourceLocation

/// Every kind of bad manifest gives an error at the right file, line and column, with the value and what to do.
@Suite struct ValidationTests {
    static let tokenA = "aaaaaaaaaaa:APA91bAAAA"
    static let tokenB = "bbbbbbbbbbb:APA91bBBBB"

    static let inventory = """
        device_id,token,platform,region
        d1,\(tokenA),android,north
        d2,\(tokenB),ios,south
        d3,ccccccccccc:APA91bCCCC,android,south
        """

    func diagnostics(_ files: [String: String]) async -> [Diagnostic] {
        var all = files
        if all["inventory.csv"] == nil { all["inventory.csv"] = Self.inventory }
        if all["inv.yaml"] == nil { all["inv.yaml"] = "inventory:\n  files: [inventory.csv]\n" }
        var table = TokenTable()
        return await ManifestLoader(files: InMemoryFileSource(all)).load(into: &table).diagnostics
    }

    func expectError(
        _ yaml: String, line: Int, column: Int? = nil, containing parts: [String],
        file: String = "topics.yaml", extra: [String: String] = [:]
    ) async {
        var files = extra
        files[file] = yaml
        let found = await diagnostics(files).filter { $0.severity == .error }
        let match = found.first { d in
            d.location?.file == file && d.location?.line == line && (column == nil || d.location?.column == column)
                && parts.allSatisfy { d.message.contains($0) }
        }
        #expect(
            match != nil,
            "expected an error at \(file):\(line) containing \(parts); got:\n\(found.map(\.description).joined(separator: "\n"))"
        )
    }

    @Test func validManifestsHaveNoErrors() async {
        let found = await diagnostics([
            "topics.yaml": """
            topics:
              - name: weather-north
                mode: authoritative
                members:
                  - selector: {region: north}
                  - devices: [d2]
              - name: all-but-web
                members: [{selector: {platform: {not: web}}}]
              - name: in-set
                members: [{selector: {region: [north, south]}}]
            groups:
              - notification_key_name: pair
                members: [{devices: [d1, d2]}]
            """
        ])
        #expect(!found.hasErrors, "\(found)")
    }

    @Test func yamlSyntaxErrorNamesFileAndLine() async {
        await expectError(
            "topics:\n  - name: a\n    members: [\n  - name: b\n", line: 4, containing: ["YAML syntax error"])
    }

    @Test func unknownKeySuggestsTheNearOne() async {
        await expectError(
            "topics:\n  - name: a\n    mebmers: []\n", line: 3, column: 5,
            containing: ["unknown key 'mebmers'", "did you mean 'members'"])
        await expectError(
            "topcs: []\n", line: 1, column: 1, containing: ["unknown key 'topcs'", "did you mean 'topics'"])
    }

    @Test func wrongTypes() async {
        await expectError(
            "topics:\n  - name: a\n    protect: maybe\n    members: [{devices: [d1]}]\n", line: 3, column: 14,
            containing: ["'protect' must be true or false", "'maybe'"])
        await expectError("topics:\n  name: a\n", line: 2, column: 3, containing: ["'topics' must be a list"])
        await expectError(
            "topics:\n  - name: a\n    mode: exclusive\n    members: [{devices: [d1]}]\n", line: 3, column: 11,
            containing: ["unknown mode 'exclusive'", "additive"])
    }

    @Test func invalidTopicName() async {
        await expectError(
            "topics:\n  - name: news/today\n    members: [{devices: [d1]}]\n", line: 2, column: 11,
            containing: ["invalid topic name 'news/today'", "'/' is not allowed"])
        await expectError(
            "topics:\n  - name: /topics/news\n    members: [{devices: [d1]}]\n", line: 2,
            containing: ["without the '/topics/' prefix"])
    }

    @Test func groupOverTwentyMembers() async {
        let devices = (1...21).map { "g\($0),gggggggggg\($0):APA91b,android,north" }.joined(separator: "\n")
        await expectError(
            "groups:\n  - notification_key_name: big\n    members: [{selector: {platform: android}}]\n",
            line: 2, containing: ["'big' has 2", "at most 20"],
            extra: ["inventory.csv": Self.inventory + "\n" + devices])
    }

    @Test func deviceOverTwoThousandTopics() async {
        let topics = (0...2000).map { "  - name: t\($0)\n    members: [{devices: [d1]}]" }.joined(separator: "\n")
        let found = await diagnostics(["topics.yaml": "topics:\n" + topics])
        let error = found.first { $0.message.contains("would be subscribed to 2001 topics") }
        #expect(error?.location == Loc(file: "inventory.csv", line: 2, column: 1))
        #expect(error?.message.contains("device 'd1'") == true)
    }

    @Test func sameTopicTwiceNamesBothPlaces() async {
        let found = await diagnostics([
            "a.yaml": "topics:\n  - name: news\n    members: [{devices: [d1]}]\n",
            "b.yaml": "\ntopics:\n  - name: news\n    members: [{devices: [d2]}]\n",
        ])
        let error = found.first { $0.message.contains("defined twice") }
        #expect(error?.location == Loc(file: "b.yaml", line: 3, column: 11))
        #expect(error?.message.contains("a.yaml:2:11") == true)
    }

    @Test func sameGroupTwice() async {
        await expectError(
            "groups:\n  - notification_key_name: g\n    members: [{devices: [d1]}]\n  - notification_key_name: g\n    members: [{devices: [d2]}]\n",
            line: 4, containing: ["device group 'g' is defined twice", "topics.yaml:2:28"])
    }

    @Test func unknownDeviceSuggests() async {
        await expectError(
            "topics:\n  - name: a\n    members: [{devices: [d1, d9]}]\n", line: 3,
            containing: ["unknown device 'd9'", "did you mean"])
    }

    @Test func unknownLabelSuggests() async {
        await expectError(
            "topics:\n  - name: a\n    members:\n      - selector: {regoin: north}\n", line: 4, column: 20,
            containing: ["unknown label 'regoin'", "did you mean 'region'"])
    }

    @Test func selectorMatchingNothing() async {
        await expectError(
            "topics:\n  - name: a\n    members:\n      - selector: {region: nroth}\n", line: 4, column: 19,
            containing: ["matches no device", "no value 'nroth'", "did you mean 'north'"])
        await expectError(
            "topics:\n  - name: a\n    members:\n      - selector: {region: north, platform: ios}\n", line: 4,
            containing: ["matches no device"])
    }

    /// A topic or group whose members could not be read (a misspelt key, a file that is refused, a
    /// selector that matches nothing) gets that one error, never the advice to set allow_empty, which
    /// would unsubscribe everyone tidemark manages.
    @Test func membersThatCouldNotBeReadAreNotCalledEmpty() async {
        let cases: [(String, String)] = [
            ("topics:\n  - name: a\n    memebrs: [{selector: {region: north}}]\n", "did you mean 'members'"),
            ("topics:\n  - name: a\n    members: [{file: missing.txt}]\n", "cannot read token file 'missing.txt'"),
            ("topics:\n  - name: a\n    members: [{selector: {region: nroth}}]\n", "matches no device"),
            ("topics:\n  - name: a\n    members: [{slector: {region: north}}]\n", "did you mean 'selector'"),
            (
                "groups:\n  - notification_key_name: g\n    memebrs: [{selector: {region: north}}]\n",
                "did you mean 'members'"
            ),
            ("audiences:\n  - name: au\n    memebrs: [{selector: {region: north}}]\n", "did you mean 'members'"),
        ]
        for (yaml, cause) in cases {
            let errors = await diagnostics(["topics.yaml": yaml]).filter { $0.severity == .error }
            #expect(errors.count == 1 && errors[0].message.contains(cause), "\(yaml): \(errors.map(\.description))")
            #expect(!errors.contains { $0.message.contains("allow_empty") || $0.message.contains("no members") })
        }
    }

    @Test func emptyTopicNeedsAllowEmpty() async {
        await expectError(
            "topics:\n  - name: a\n    members: []\n", line: 2, containing: ["'a' has no members", "allow_empty: true"])
        let allowed = await diagnostics([
            "topics.yaml": "topics:\n  - name: a\n    allow_empty: true\n    members: []\n"
        ])
        #expect(!allowed.hasErrors)
    }

    @Test func memberEntryWithTwoKinds() async {
        await expectError(
            "topics:\n  - name: a\n    members:\n      - {devices: [d1], token: x}\n", line: 4,
            containing: ["names 2 kinds"])
    }

    @Test func badTokensInFilesAndInline() async {
        await expectError(
            "topics:\n  - name: a\n    members: [{file: beta.txt}]\n", line: 3,
            containing: ["not a registration token"],
            file: "beta.txt", extra: ["topics.yaml": "topics:\n  - name: a\n    members: [{file: beta.txt}]\n"])
        var files = ["topics.yaml": "topics:\n  - name: a\n    members: [{file: beta.txt}]\n"]
        files["beta.txt"] = "# testers\nokokokok:APA91b\nnot a token\n"
        let found = await diagnostics(files)
        #expect(
            found.contains { $0.location == Loc(file: "beta.txt", line: 3, column: 1) && $0.message.contains("' '") })
        await expectError(
            "topics:\n  - name: a\n    members: [{token: \"has space\"}]\n", line: 3, containing: ["not a valid token"])
    }

    @Test func inventoryProblems() async {
        let csv =
            "device_id,token,platform\nd1,\(Self.tokenA),android\nd1,zzzzzzzzzzz:APA91b,ios\nd2,\(Self.tokenA),ios\nd3,x y,ios\nd4,only-two\n"
        let found = await diagnostics(["inventory.csv": csv, "topics.yaml": "topics: []\n"])
        #expect(
            found.contains {
                $0.location?.line == 3 && $0.message.contains("'d1' is declared twice")
                    && $0.message.contains("inventory.csv:2")
            })
        #expect(found.contains { $0.location?.line == 4 && $0.message.contains("same token as device 'd1'") })
        #expect(found.contains { $0.location?.line == 5 && $0.message.contains("not valid") })
        #expect(found.contains { $0.location?.line == 6 && $0.message.contains("2 fields but the header has 3") })
        let missing = await diagnostics([
            "inv.yaml": "inventory:\n  files: [nope.csv]\n", "topics.yaml": "topics: []\n",
        ])
        #expect(
            missing.contains {
                $0.location == Loc(file: "inv.yaml", line: 2, column: 11)
                    && $0.message.contains("cannot read inventory file 'nope.csv'")
            })
    }

    @Test func jsonLinesInventory() async {
        let jsonl =
            "{\"id\":\"j1\",\"token\":\"\(Self.tokenA)\",\"labels\":{\"region\":\"north\"}}\n\n{\"id\":\"j2\",\"tokn\":\"x\"}\nnot json\n"
        var table = TokenTable()
        let loaded = await ManifestLoader(
            files: InMemoryFileSource([
                "inv.yaml": "inventory:\n  files: [devices.jsonl]\n",
                "devices.jsonl": jsonl,
                "topics.yaml": "topics:\n  - name: a\n    members: [{selector: {region: north}}]\n",
            ])
        ).load(into: &table)
        #expect(loaded.inventory.count == 1)
        #expect(loaded.diagnostics.contains { $0.location?.line == 3 && $0.message.contains("unknown key 'tokn'") })
        #expect(loaded.diagnostics.contains { $0.location?.line == 4 && $0.message.contains("not a JSON object") })
        #expect(loaded.desired.topics.first?.members.count == 1)
    }

    @Test func selectorsCombineAndNegate() async {
        var table = TokenTable()
        let loaded = await ManifestLoader(
            files: InMemoryFileSource([
                "inv.yaml": "inventory:\n  files: [inventory.csv]\n",
                "inventory.csv": Self.inventory,
                "topics.yaml": """
                topics:
                  - name: south-android
                    members: [{selector: {region: south, platform: android}}]
                  - name: not-north
                    members: [{selector: {region: {not: north}}}]
                  - name: not-in
                    members: [{selector: {platform: {not: [ios, web]}}}]
                """,
            ])
        ).load(into: &table)
        #expect(!loaded.diagnostics.hasErrors, "\(loaded.diagnostics)")
        func members(_ name: String) -> Set<String> {
            Set(loaded.desired.topics.first { $0.name == name }!.members.map { table[$0] })
        }
        #expect(members("south-android") == ["ccccccccccc:APA91bCCCC"])
        #expect(members("not-north") == [Self.tokenB, "ccccccccccc:APA91bCCCC"])
        #expect(members("not-in") == [Self.tokenA, "ccccccccccc:APA91bCCCC"])
    }

    @Test func digestChangesWithAnyInput() async {
        func digest(_ extra: String) async -> String {
            var table = TokenTable()
            return await ManifestLoader(
                files: InMemoryFileSource([
                    "inv.yaml": "inventory:\n  files: [inventory.csv]\n",
                    "inventory.csv": Self.inventory + extra,
                    "topics.yaml": "topics:\n  - name: a\n    members: [{devices: [d1]}]\n",
                ])
            ).load(into: &table).digest
        }
        let plain = await digest("")
        #expect(await digest("") == plain)
        #expect(await digest("\nd4,ddddddddddd:APA91b,ios,north") != plain)
    }
}
