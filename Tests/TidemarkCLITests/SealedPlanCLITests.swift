import Foundation
import Testing

/// `TIDEMARK_PLAN_KEY`: a saved plan of a 3,000-device project holds none of its tokens in the clear,
/// `show` renders it without the key, and `apply` opens it only with the key and an untouched file.
struct SealedPlanCLITests {
    static func token(_ index: Int) -> String { "sealed\(index):APA91b" + String(repeating: "K", count: 140) }

    @Test func aSavedPlanIsSealedAndAppliedOnlyWithItsKey() throws {
        let cli = try CLIRunner()
        defer { cli.remove() }
        let devices = 3000
        try cli.write("tidemark.yaml", "project: sealed-plans\n")
        try cli.write(
            "manifests/devices.csv",
            "device_id,token,kind\n" + (0..<devices).map { "d\($0),\(Self.token($0)),phone\n" }.joined())
        try cli.write(
            "manifests/topics.yaml",
            """
            inventory:
              files: [devices.csv]
            topics:
              - name: phones
                members: [{selector: {kind: phone}}]
            """)
        let key = Data((0..<32).map { UInt8($0 * 7 % 256) }).base64EncodedString()
        let sealing = ["TIDEMARK_PLAN_KEY": key]
        let plan = try cli.run(["plan", "--out", "plan.json"], environment: sealing)
        #expect(plan.status == 0 && !plan.stderr.contains("in the clear"), "\(plan.stderr)")
        let file = cli.project.appendingPathComponent("plan.json")
        let text = try String(contentsOf: file, encoding: .utf8)
        let clear = (0..<devices).filter { text.contains("sealed\($0):APA91b") }
        #expect(clear.isEmpty, "\(clear.count) tokens in the clear")
        let permissions = try FileManager.default.attributesOfItem(atPath: file.path)[.posixPermissions] as? Int
        #expect(permissions == 0o600)

        let shown = try cli.run(["show", "plan.json"], environment: ["TIDEMARK_PLAN_KEY": ""])
        #expect(shown.status == 0 && shown.stdout.contains("+3,000"), "\(shown.stdout)\(shown.stderr)")
        #expect(shown.stderr.contains("without its registration tokens"), "\(shown.stderr)")
        let withKey = try cli.run(["show", "plan.json"], environment: sealing)
        #expect(withKey.status == 0 && withKey.stdout == shown.stdout && withKey.stderr.isEmpty, "\(withKey.stderr)")

        let other = Data(repeating: 9, count: 32).base64EncodedString()
        let wrong = try cli.run(["apply", "plan.json", "--auto-approve"], environment: ["TIDEMARK_PLAN_KEY": other])
        #expect(wrong.status != 0 && wrong.stderr.contains("sealed with another key"), "\(wrong.stderr)")
        let none = try cli.run(["apply", "plan.json", "--auto-approve"], environment: ["TIDEMARK_PLAN_KEY": ""])
        #expect(none.status != 0 && none.stderr.contains("TIDEMARK_PLAN_KEY is not set"), "\(none.stderr)")
        // One character of the seal changed.
        var object = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: file)) as? [String: Any])
        var sealed = try #require(object["sealed"] as? String)
        let at = sealed.index(sealed.startIndex, offsetBy: 100)
        sealed.replaceSubrange(at...at, with: sealed[at] == "A" ? "B" : "A")
        object["sealed"] = sealed
        try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]).write(
            to: cli.project.appendingPathComponent("tampered.json"))
        let tampered = try cli.run(["apply", "tampered.json", "--auto-approve"], environment: sealing)
        #expect(tampered.status != 0 && tampered.stderr.contains("seal does not verify"), "\(tampered.stderr)")
        let state = try cli.run(["state", "show"])
        #expect(!state.stdout.contains("phones"), "nothing was applied: \(state.stdout)")

        let applied = try cli.run(["apply", "plan.json", "--auto-approve"], environment: sealing)
        #expect(
            applied.status == 0 && applied.stdout.contains("+3,000 subscribed"), "\(applied.stdout)\(applied.stderr)")

        // Without a key the plan is saved as before, with a warning.
        try cli.write(
            "manifests/devices.csv",
            "device_id,token,kind\n" + (0...devices).map { "d\($0),\(Self.token($0)),phone\n" }.joined())
        let plain = try cli.run(["plan", "--out", "plain.json"], environment: ["TIDEMARK_PLAN_KEY": ""])
        #expect(
            plain.status == 0 && plain.stderr.contains("plain.json holds registration tokens in the clear"),
            "\(plain.stderr)")
    }
}
