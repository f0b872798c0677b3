import Foundation
import Testing
import TidemarkCore
import Yams

/// The pull-request and schedule features end to end: partial plans, safety rails, markdown,
/// drift seeded through the emulator's admin API, import, audience, fmt and the CI recipes.
@Suite(.serialized) struct PullRequestWorkflowTests {
    /// The demo inventory's rows by device id: (token, region).
    /// The emulator serving the demo's project, registering every token it is sent, without a rate
    /// limit; `extra` sets the dates its deadline rules see (`--as-of`, `--created`).
    static func demoEmulator(_ cli: CLIRunner, _ extra: [String] = []) throws -> EmulatorServeTests.Server {
        try EmulatorServeTests.Server.start(
            cli, data: nil, extra: ["--auto-register", "--rate-limit", "0", "--project", "tidemark-demo"] + extra)
    }

    static func demoDevices() throws -> [String: (token: String, region: String)] {
        let csv = try String(
            contentsOf: CLIRunner.repositoryRoot.appendingPathComponent("manifests/inventory/devices.csv"),
            encoding: .utf8)
        var result: [String: (String, String)] = [:]
        for line in csv.split(separator: "\n").dropFirst() {
            let fields = line.split(separator: ",", omittingEmptySubsequences: false).map(String.init)
            result[fields[0]] = (fields[1], fields[3])
        }
        return result
    }

    @Test func partialPlansStayPartial() throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        let plan = try cli.run([
            "plan", "--target", "topic:weather-*", "--exclude", "weather-daily-*", "--out", "weather.json",
            "--detailed-exitcode",
        ])
        #expect(plan.status == 2, "\(plan.stderr)")
        #expect(plan.stdout.contains("Partial plan (only topic:weather-*; excluding weather-daily-*)"))
        let saved =
            try JSONSerialization.jsonObject(with: Data(contentsOf: cli.project.appendingPathComponent("weather.json")))
            as! [String: Any]
        let targets = Set(((saved["operations"] as? [[String: Any]]) ?? []).compactMap { $0["target"] as? String })
        #expect(
            !targets.isEmpty && targets.allSatisfy { $0.hasPrefix("weather-") && !$0.hasPrefix("weather-daily-") },
            "\(targets)")
        #expect(saved["targets"] as? [String] == ["topic:weather-*"])
        #expect(saved["excludes"] as? [String] == ["weather-daily-*"])

        // The saved plan cannot be widened or changed by flags.
        let widened = try cli.run(["apply", "weather.json", "--target", "*"])
        #expect(widened.status == 1)
        #expect(widened.stderr.contains("cannot change what a saved plan covers"))
        #expect(try cli.run(["apply", "weather.json"]).status == 0)
        // The weather topics are done; everything else is still to do.
        #expect(
            try cli.run(["plan", "--target", "topic:weather-*", "--exclude", "weather-daily-*", "--detailed-exitcode"])
                .status == 0)
        let rest = try cli.run(["plan", "--out", "rest.json", "--format", "json"])
        let restPlan = try JSONSerialization.jsonObject(with: Data(rest.stdout.utf8)) as! [String: Any]
        let restTargets = Set(
            ((restPlan["operations"] as? [[String: Any]]) ?? []).compactMap { $0["target"] as? String })
        #expect(restTargets.contains("weather-daily-en") && restTargets.contains("ops-canary"))
        #expect(!restTargets.contains("weather-severe-north-sea"))
        let bad = try cli.run(["plan", "--target", "topics:x"])
        #expect(bad.status != 0 && bad.stderr.contains("must be 'topic' or 'group'"))
    }

    @Test func safetyRailsStopPlansThatCrossThem() throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        #expect(try cli.run(["apply", "--auto-approve"]).status == 0)
        // weather.yaml holds two protected authoritative topics; dropping the file would remove them.
        let weather = cli.project.appendingPathComponent("manifests/weather.yaml")
        let original = try String(contentsOf: weather, encoding: .utf8)
        try FileManager.default.removeItem(at: weather)
        let plan = try cli.run(["plan", "--out", "plan.json"])
        #expect(plan.status == 1)
        #expect(plan.stdout.hasPrefix("Error: this plan cannot be applied"))
        #expect(plan.stdout.contains("topic 'weather-severe-north-sea' is protected (protect: true when last applied)"))
        #expect(plan.stderr.contains("it cannot be applied and was not saved"))
        #expect(!FileManager.default.fileExists(atPath: cli.project.appendingPathComponent("plan.json").path))
        let apply = try cli.run(["apply", "--auto-approve"])
        #expect(apply.status == 1 && apply.stderr.contains("the plan has errors"))
        // Excluding the protected topics, the rest of the removal goes ahead.
        #expect(try cli.run(["plan", "--exclude", "topic:weather-severe-*"]).status == 0)
        try original.write(to: weather, atomically: true, encoding: .utf8)

        // The blast radius: removing scores.yaml unsubscribes hundreds of memberships.
        try FileManager.default.removeItem(at: cli.project.appendingPathComponent("manifests/scores.yaml"))
        let capped = try cli.run(["plan", "--max-unsubscribes", "10"])
        #expect(capped.status == 1)
        #expect(capped.stdout.contains("more than --max-unsubscribes 10 allows (10)"))
        #expect(try cli.run(["plan", "--max-unsubscribes", "100%"]).status == 0)
        #expect(try cli.run(["plan", "--out", "removal.json"]).status == 0)
        let refused = try cli.run(["apply", "removal.json", "--max-unsubscribes", "1%"])
        #expect(refused.status == 1 && refused.stderr.contains("removal.json is refused: the plan would unsubscribe"))
        #expect(try cli.run(["apply", "removal.json", "--max-unsubscribes", "100%"]).status == 0)
    }

    @Test func markdownPlanForPullRequests() throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        let plan = try cli.run(["plan", "--format", "markdown", "--parts-dir", "comment", "--out", "plan.json"])
        #expect(plan.status == 0, "\(plan.stderr)")
        #expect(plan.stdout.hasPrefix("### 📝 tidemark: Plan: "))
        #expect(
            plan.stdout.contains("| Topic / group | Kind | Mode | Subscribers before → after | Adds | Removes | Why |"))
        #expect(plan.stdout.contains("FCM project `tidemark-demo` (embedded) · **changes, none destructive**"))
        // The plan creates device groups: the deadline is said, in one line.
        #expect(plan.stdout.contains("FCM ends device groups on 29 September 2027"))
        #expect(plan.stdout.contains("<details><summary><code>weather-daily-en</code>"))
        #expect(
            plan.stdout.contains("+1,053 selector {locale: [en-GB, en-IE]} at `manifests/weather.yaml:15:19`"),
            "\(plan.stdout.prefix(4000))")
        #expect(
            plan.stdout.contains(
                "**Next:** review the changes above; merging applies exactly this plan (`tidemark apply plan.json`)"))
        let part = try String(contentsOf: cli.project.appendingPathComponent("comment/part-1.md"), encoding: .utf8)
        #expect(plan.stdout.hasPrefix(part))
        #expect(part.contains("Full plan: `plan.json`"))
        for (id, device) in try Self.demoDevices() where id.hasSuffix("7") {
            #expect(!plan.stdout.contains(device.token), "the token of \(id) appears in full")
        }
        let show = try cli.run(["show", "plan.json", "--format", "markdown"])
        #expect(show.status == 0 && show.stdout.hasPrefix("### 📝 tidemark: Plan: "))
        let misuse = try cli.run(["plan", "--parts-dir", "x"])
        #expect(misuse.status != 0 && misuse.stderr.contains("--parts-dir needs --format markdown"))
    }

    /// A plan says why: devices moved between selectors are counted under the selector and its
    /// file:line; devices that left, rotated or stopped matching say so; a mode change is shown; on a
    /// terminal the text fits its width and has colour, unless NO_COLOR.
    @Test func plansExplainThemselves() throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        #expect(try cli.run(["apply", "--auto-approve"]).status == 0)
        let weather = cli.project.appendingPathComponent("manifests/weather.yaml")
        let text = try String(contentsOf: weather, encoding: .utf8)
        // en-IE devices move from the selector to nobody, and one device is listed by id instead.
        try text.replacingOccurrences(
            of: "      - selector: {locale: [en-GB, en-IE]}",
            with: "      - selector: {locale: en-GB}\n      - devices: [dev-00002]"
        ).write(to: weather, atomically: true, encoding: .utf8)
        let ops = cli.project.appendingPathComponent("manifests/ops.yaml")
        let opsText = try String(contentsOf: ops, encoding: .utf8)
        try opsText.replacingOccurrences(of: "name: ops-canary\n", with: "name: ops-canary\n    mode: authoritative\n")
            .write(to: ops, atomically: true, encoding: .utf8)
        let csvPath = cli.project.appendingPathComponent("manifests/inventory/devices.csv")
        var rows = try String(contentsOf: csvPath, encoding: .utf8).split(separator: "\n").map(String.init)
        rows.removeAll { $0.hasPrefix("dev-00011,") }
        try (rows.joined(separator: "\n") + "\n").write(to: csvPath, atomically: true, encoding: .utf8)

        let plan = try cli.run(["plan", "--out", "plan.json"])
        #expect(plan.status == 0, "\(plan.stderr)")
        let out = plan.stdout
        #expect(out.contains("+ 1  listed by device id (manifests/weather.yaml:16:19)"), "\(out)")
        #expect(
            out.contains(
                "no longer matched by selector {locale: en-GB} (locale does not match) (manifests/weather.yaml:15:19)"))
        #expect(out.contains("device left the inventory"))
        #expect(out.contains("mode: additive → authoritative"))
        let markdown = try cli.run(["show", "plan.json", "--format", "markdown"])
        #expect(markdown.stdout.contains("| `ops-canary` | topic | **additive → authoritative** |"))
        #expect(markdown.stdout.contains("+1 listed by device id at `manifests/weather.yaml:16:19`"))
        #expect(!markdown.stdout.contains("<summary>`"))

        // On a terminal (a pty, through script(1)): wrapped to its width, in colour unless NO_COLOR.
        guard FileManager.default.isExecutableFile(atPath: "/usr/bin/script") else { return }
        func onTerminal(_ environment: [String: String]) throws -> String {
            try cli.run(
                ["-qec", "\(CLIRunner.binary.path) plan --target 'topic:weather-*'", "/dev/null"],
                environment: environment, executable: "/usr/bin/script"
            ).stdout
        }
        // An empty NO_COLOR counts as unset (no-color.org); the test runner sets it for its children.
        let coloured = try onTerminal(["COLUMNS": "80", "TERM": "xterm", "NO_COLOR": ""])
        #expect(coloured.contains("\u{1B}[1mPlan: "), "\(coloured.prefix(300))")
        let plain = coloured.replacing(/\u{1B}\[[0-9;]*m/, with: "")
        for line in plain.split(whereSeparator: \.isNewline) {
            #expect(line.count <= 80, "wider than the terminal: \(line)")
        }
        let noColour = try onTerminal(["COLUMNS": "80", "TERM": "xterm", "NO_COLOR": "1"])
        #expect(!noColour.contains("\u{1B}["), "\(noColour.prefix(300))")
    }

    /// FCM's 2027 deadlines: the demo manages device groups, so validate, plan and drift say so once,
    /// also as structured JSON; with the embedded backend a deadline is enforced only at a date given
    /// (TIDEMARK_AS_OF), and then the run stops with the migration path before anything is sent.
    @Test func deadlinesAreSaidOnceAndEnforcedWhenDue() throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        let validate = try cli.run(["validate"])
        #expect(validate.status == 0)
        #expect(validate.stderr.components(separatedBy: "FCM is ending device groups").count == 2, "\(validate.stderr)")
        let json = try cli.run(["validate", "--format", "json"])
        let object = try #require(try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [String: Any])
        let diagnostics = try #require(object["diagnostics"] as? [[String: Any]])
        #expect(
            diagnostics.contains {
                $0["code"] as? String == "deadline.device_groups" && $0["deadline"] as? String == "2027-09-29"
            })
        let plan = try cli.run(["plan"])
        #expect(plan.status == 0)
        // In a plan: one short line, once per run; the full paragraph is validate's.
        #expect(
            plan.stdout.components(separatedBy: "FCM ends device groups on 29 September 2027").count == 2,
            "once per run")
        #expect(!plan.stdout.contains("FCM is ending device groups") && !plan.stderr.contains("FCM ends device groups"))
        try cli.write("tidemark.yaml", "acknowledge: {device_groups: 2027-06-30}\n")
        let quiet = try cli.run(["plan"])
        #expect(quiet.status == 0 && !(quiet.stdout + quiet.stderr).contains("device groups"), "\(quiet.stdout)")
        let acknowledged = try cli.run(["validate"])
        #expect(
            acknowledged.stderr.contains("Acknowledged in tidemark.yaml until 30 June 2027"), "\(acknowledged.stderr)")
        try FileManager.default.removeItem(at: cli.project.appendingPathComponent("tidemark.yaml"))
        #expect(try cli.run(["apply", "--auto-approve"]).status == 0)
        let drift = try cli.run(["drift", "--refresh", "all", "--format", "json"])
        #expect(drift.stdout.contains("deadline.device_groups"))

        let late = try cli.run(["plan"], environment: ["TIDEMARK_AS_OF": "2027-10-01"])
        #expect(late.status == 1)
        #expect(late.stderr.contains("FCM turned device groups down on 29 September 2027"), "\(late.stderr)")
        #expect(late.stderr.contains("docs/migrating.md"))
        #expect(try cli.run(["apply", "--auto-approve"], environment: ["TIDEMARK_AS_OF": "2027-10-01"]).status == 1)
        #expect(try cli.run(["plan"], environment: ["TIDEMARK_AS_OF": "2027-09-28"]).status == 0)
        let bad = try cli.run(["plan"], environment: ["TIDEMARK_AS_OF": "next year"])
        #expect(bad.status == 1 && bad.stderr.contains("TIDEMARK_AS_OF must be a date such as 2027-10-01"))

        try cli.write("tidemark.yaml", "project: tidemark-demo\ntransport: iid\n")
        let iid = try cli.run(["validate"])
        #expect(iid.stderr.contains("this project uses the iid transport"), "\(iid.stderr)")
        let iidLate = try cli.run(["validate"], environment: ["TIDEMARK_AS_OF": "2027-10-01"])
        #expect(iidLate.status == 1 && iidLate.stderr.contains("FCM turned the Instance ID API down"))
    }

    /// `groups export` against the emulator: every managed group's tokens exactly, to NDJSON and CSV; after the emulator's date passes the turn-down
    /// the call is gone and the export fails loudly, never as empty groups; a project created after
    /// 1 December 2026 cannot create groups.
    @Test func groupsExportWhileTheCallExists() async throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        let server = try Self.demoEmulator(cli, ["--as-of", "2027-03-01"])
        defer { _ = server.stop() }
        let environment = server.environment
        let backend = ["--backend", "emulator"]
        #expect(try cli.run(["apply", "--auto-approve"] + backend, environment: environment).status == 0)
        let (_, listed) = try await server.call("GET", "/emulator/v1/projects/tidemark-demo/groups")
        let groups = try #require(listed["groups"] as? [[String: Any]])
        #expect(groups.count == 4)

        let export = try cli.run(["groups", "export", "--out", "groups.ndjson"] + backend, environment: environment)
        #expect(export.status == 0, "\(export.stderr)")
        #expect(export.stdout.contains("oncall-phones: 2 tokens"), "\(export.stdout)")
        let lines = try String(contentsOf: cli.project.appendingPathComponent("groups.ndjson"), encoding: .utf8)
            .split(separator: "\n").map { try! JSONSerialization.jsonObject(with: Data($0.utf8)) as! [String: Any] }
        var exported: [String: Set<String>] = [:]
        for line in lines { exported[line["group"] as! String, default: []].insert(line["token"] as! String) }
        for group in groups {
            let name = group["name"] as! String
            #expect(exported[name] == Set(group["members"] as! [String]), "\(name)")
        }
        #expect(lines.contains { $0["device_id"] as? String == "oncall-pixel-8" })
        for group in groups { #expect(!export.stdout.contains(group["members"].map { "\($0)" } ?? "-")) }
        let attributes = try FileManager.default.attributesOfItem(
            atPath: cli.project.appendingPathComponent("groups.ndjson").path)
        #expect((attributes[.posixPermissions] as? Int) == 0o600)
        let csv = try cli.run(["groups", "export", "--out", "groups.csv"] + backend, environment: environment)
        #expect(csv.status == 0)
        let csvText = try String(contentsOf: cli.project.appendingPathComponent("groups.csv"), encoding: .utf8)
        #expect(csvText.hasPrefix("group,notification_key,device_id,token\n"))
        #expect(csvText.split(separator: "\n").count == lines.count + 1)
        let refused = try cli.run(
            ["groups", "export", "--out", "manifests/ops.yaml"] + backend, environment: environment)
        #expect(refused.status == 1 && refused.stderr.contains("is not an earlier export"))

        // The emulator past the turn-down (the client not told): the call is gone, and says so loudly.
        let late = try Self.demoEmulator(cli, ["--as-of", "2027-10-01"])
        defer { _ = late.stop() }
        let gone = try cli.run(
            ["groups", "export", "--out", "late.ndjson", "--state", "late.db"] + backend, environment: late.environment)
        #expect(gone.status == 1, "\(gone.stdout)")
        #expect(gone.stderr.contains("HTTP 404"), "\(gone.stderr)")
        // Told the date, tidemark stops before calling.
        var told = late.environment
        told["TIDEMARK_AS_OF"] = "2027-10-01"
        let before = try cli.run(["groups", "export", "--out", "late.ndjson"] + backend, environment: told)
        #expect(before.status == 1 && before.stderr.contains("FCM turned device groups down on 29 September 2027"))

        // A project created after 1 December 2026 cannot create groups.
        let fresh = try Self.demoEmulator(cli, ["--created", "2026-12-05"])
        defer { _ = fresh.stop() }
        let create = try cli.run(
            ["apply", "--auto-approve", "--state", "fresh.db"] + backend, environment: fresh.environment)
        #expect(create.status == 1, "\(create.stdout)")
        #expect(
            create.stderr.contains("not available to projects created on or after 1 December 2026"), "\(create.stderr)")
    }

    /// Device groups become audiences against the emulator: the export is kept in state; converting
    /// keeps every member and sends nothing destructive (the FCM groups stay, with their members)
    /// until `retire_group_key: true` is reviewed; after the turn-down the rest are converted with no
    /// call to FCM at all; the app's per-token list comes from `audience --name`.
    @Test func groupsBecomeAudiences() async throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        let server = try Self.demoEmulator(cli, ["--as-of", "2027-03-01"])
        defer { _ = server.stop() }
        let environment = server.environment
        let backend = ["--backend", "emulator"]
        #expect(try cli.run(["apply", "--auto-approve"] + backend, environment: environment).status == 0)
        func fcmGroups() async throws -> [String: Set<String>] {
            let (_, listed) = try await server.call("GET", "/emulator/v1/projects/tidemark-demo/groups")
            var result: [String: Set<String>] = [:]
            for group in listed["groups"] as? [[String: Any]] ?? [] {
                result[group["name"] as! String] = Set(group["members"] as! [String])
            }
            return result
        }
        let before = try await fcmGroups()
        #expect(before.count == 4)

        // The export is recorded in state, members the app added included.
        let export = try cli.run(["groups", "export", "--format", "json"] + backend, environment: environment)
        #expect(export.status == 0, "\(export.stderr)")
        let shown = try cli.run(["state", "show", "group:oncall-phones", "--format", "json"])
        let shownObject = try #require(
            try JSONSerialization.jsonObject(with: Data(shown.stdout.utf8)) as? [String: Any])
        let exported = try #require(shownObject["exported"] as? [[String: Any]])
        #expect(Set(exported.map { $0["token"] as! String }) == before["oncall-phones"])

        // Convert one group: a single step, nothing sent to FCM.
        let ops = cli.project.appendingPathComponent("manifests/ops.yaml")
        let text = try String(contentsOf: ops, encoding: .utf8)
        let audience = """

            audiences:
              - name: oncall-phones
                members:
                  - devices: [oncall-iphone-15, oncall-pixel-8]
            """
        try text.replacingOccurrences(
            of:
                "  - notification_key_name: oncall-phones\n    members:\n      - devices: [oncall-iphone-15, oncall-pixel-8]\n",
            with: audience + "\n"
        ).write(to: ops, atomically: true, encoding: .utf8)
        let plan = try cli.run(["plan", "--out", "convert.json"] + backend, environment: environment)
        #expect(plan.status == 0, "\(plan.stderr)")
        #expect(plan.stdout.contains("~ oncall-phones  convert  +0  −0"), "\(plan.stdout)")
        #expect(plan.stdout.contains("nothing is deleted in FCM"))
        #expect(!plan.stdout.contains("Destructive"))
        let apply = try cli.run(["apply", "convert.json", "--auto-approve"] + backend, environment: environment)
        #expect(apply.status == 0, "\(apply.stderr)")
        #expect(apply.stdout.contains("0 group calls, 1 audience written in state; 0 requests"), "\(apply.stdout)")
        #expect(try await fcmGroups() == before, "the FCM groups are untouched")
        let list = try cli.run(["audience", "--name", "oncall-phones", "--from", "observed", "--format", "json"])
        let listed = try #require(try JSONSerialization.jsonObject(with: Data(list.stdout.utf8)) as? [String: Any])
        #expect(listed["kind"] as? String == "audience" && listed["count"] as? Int == 2)
        let converged = try cli.run(["plan", "--detailed-exitcode"] + backend, environment: environment)
        #expect(converged.status == 0, "\(converged.stdout)")

        // Retiring the key is what deletes the FCM group, and the plan says so to the reviewer.
        try String(contentsOf: ops, encoding: .utf8).replacingOccurrences(
            of: "  - name: oncall-phones\n", with: "  - name: oncall-phones\n    retire_group_key: true\n"
        ).write(to: ops, atomically: true, encoding: .utf8)
        let retire = try cli.run(["plan"] + backend, environment: environment)
        #expect(retire.stdout.contains("the FCM device group behind audience 'oncall-phones' will be deleted"))
        #expect(try cli.run(["apply", "--auto-approve"] + backend, environment: environment).status == 0)
        var after = before
        after["oncall-phones"] = nil
        #expect(try await fcmGroups() == after)
        let kept = try cli.run(["audience", "--name", "oncall-phones", "--from", "observed", "--format", "json"])
        #expect(kept.stdout.contains("\"count\" : 2"), "every member stays: \(kept.stdout)")

        // After the turn-down (emulator and tidemark told the date): the other groups are converted
        // with no call to FCM, whose group API is gone.
        let late = try Self.demoEmulator(cli, ["--as-of", "2027-10-01"])
        defer { _ = late.stop() }
        var told = late.environment
        told["TIDEMARK_AS_OF"] = "2027-10-01"
        try String(contentsOf: ops, encoding: .utf8)
            .replacingOccurrences(of: "groups:\n", with: "")
            .replacingOccurrences(of: "  - notification_key_name: user-", with: "  - name: user-")
            .replacingOccurrences(of: "audiences:\n", with: "")
            .replacingOccurrences(of: "# Device groups:", with: "audiences:\n# Device groups:")
            .write(to: ops, atomically: true, encoding: .utf8)
        let lateApply = try cli.run(["apply", "--auto-approve"] + backend, environment: told)
        #expect(lateApply.status == 0, "\(lateApply.stdout)\(lateApply.stderr)")
        #expect(lateApply.stdout.contains("no longer exists and is forgotten; nothing is sent to FCM"))
        #expect(lateApply.stdout.contains("0 group calls, 3 audiences written in state"), "\(lateApply.stdout)")
        let stateList = try cli.run(["state", "list", "--format", "json"])
        let listObject = try #require(
            try JSONSerialization.jsonObject(with: Data(stateList.stdout.utf8)) as? [String: Any])
        let rows = try #require(listObject["groups"] as? [[String: Any]])
        #expect(
            rows.count == 4 && rows.allSatisfy { $0["kind"] as? String == "audience" && $0["exists"] as? Bool == false }
        )
        for row in rows where row["name"] as? String != "oncall-phones" {
            let name = row["name"] as! String
            #expect(row["members"] as? Int == before[name]?.count, "\(name) keeps every member")
        }
    }

    /// From the iid transport to v1 with evidence: after an apply over iid, a plan read through v1 over
    /// the whole fleet finds no difference; the differences seeded through the emulator's admin API are
    /// each reported (redacted) and re-asserted.
    @Test func shadowVerifyBeforeSwitchingTransports() async throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        let server = try Self.demoEmulator(cli)
        defer { _ = server.stop() }
        let environment = server.environment
        let backend = ["--backend", "emulator"]
        try cli.write("tidemark.yaml", "project: tidemark-demo\ntransport: iid\n")
        #expect(try cli.run(["apply", "--auto-approve"] + backend, environment: environment).status == 0)
        let clean = try cli.run(
            ["plan", "--transport", "v1", "--refresh", "all", "--detailed-exitcode"] + backend,
            environment: environment)
        #expect(clean.status == 0, "\(clean.stdout)\(clean.stderr)")
        #expect(
            clean.stdout.contains(
                "Shadow verify: the v1 API reads exactly what state holds from applies over iid, across all 3,003 registrations; switching transports changes nothing."
            ), "\(clean.stdout)")
        // Without --transport, the configured API is read and no shadow verify is made.
        let plain = try cli.run(["plan", "--refresh", "all"] + backend, environment: environment)
        #expect(!plain.stdout.contains("Shadow verify"))

        let devices = try Self.demoDevices()
        let outsider = devices.first { $0.value.region == "irish-sea" }!
        let members = devices.filter { $0.value.region == "north-sea" }.keys.sorted()
        let dropped = devices[members[0]]!
        let project = "/emulator/v1/projects/tidemark-demo"
        let topic = "\(project)/topics/weather-severe-north-sea/subscribers"
        #expect(try await server.call("DELETE", topic, body: server.json(["tokens": [dropped.token]])).0 == 200)
        #expect(try await server.call("POST", topic, body: server.json(["tokens": [outsider.value.token]])).0 == 200)
        let found = try cli.run(
            ["plan", "--transport", "v1", "--refresh", "all", "--detailed-exitcode"] + backend,
            environment: environment)
        #expect(found.status == 2, "\(found.stdout)")
        #expect(found.stdout.contains("Shadow verify: the v1 API reads 2 differences"), "\(found.stdout)")
        #expect(
            found.stdout.contains(
                "weather-severe-north-sea: \(Redaction.redact(dropped.token)) (device \(members[0])) subscribed per state, not per v1"
            ))
        #expect(
            found.stdout.contains(
                "weather-severe-north-sea: \(Redaction.redact(outsider.value.token)) (device \(outsider.key)) subscribed per v1, not per state"
            ))
        #expect(!found.stdout.contains(dropped.token))
        let json = try cli.run(
            ["plan", "--transport", "v1", "--refresh", "all", "--format", "json"] + backend, environment: environment)
        let object = try #require(try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [String: Any])
        let shadow = try #require(object["shadow_verify"] as? [String: Any])
        #expect(shadow["difference_count"] as? Int == 2 && shadow["complete"] as? Bool == true)
        // A sample is no evidence, and says so.
        let sample = try cli.run(
            ["plan", "--transport", "v1", "--refresh", "touched"] + backend, environment: environment)
        #expect(sample.stdout.contains("not the whole fleet: use --refresh all for evidence"), "\(sample.stdout)")
    }

    /// Thousands of changed tokens across 200 topics: still a readable set of comments.
    @Test func largeMarkdownPlanFitsInComments() throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        let regions = ["north-sea", "baltic", "atlantic", "channel", "irish-sea"]
        let topics = (0..<200).map { i in
            "  - name: big-\(String(format: "%03d", i))\n    members: [{selector: {region: \(regions[i % regions.count])}}]"
        }
        try cli.write("manifests/big.yaml", "topics:\n" + topics.joined(separator: "\n") + "\n")
        let plan = try cli.run(["plan", "--format", "markdown", "--parts-dir", "parts", "--out", "big.json"])
        #expect(plan.status == 0, "\(plan.stderr)")
        let names = try FileManager.default.contentsOfDirectory(
            atPath: cli.project.appendingPathComponent("parts").path)
        #expect(names.count >= 2)
        let devices = try Self.demoDevices()
        for name in names {
            let part = try String(contentsOf: cli.project.appendingPathComponent("parts/\(name)"), encoding: .utf8)
            #expect(part.utf8.count < 65_536, "\(name): \(part.utf8.count) bytes")
            #expect(
                name == "part-1.md"
                    ? part.hasPrefix("### 📝 tidemark: Plan: 223 topics and 4 groups change: ")
                    : part.hasPrefix("### tidemark plan (continued, part "), "\(name)")
            for device in devices.values.prefix(300) { #expect(!part.contains(device.token)) }
        }
        #expect(plan.stdout.contains("<details><summary><code>big-000</code>: +"))
        #expect(plan.stdout.contains("more (all are in the JSON plan)"))
    }

    /// Off a terminal, long work prints plain progress lines (done / total, rate, ETA).
    @Test func longApplyReportsProgress() throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        let apply = try cli.run(["apply", "--auto-approve"])
        #expect(apply.status == 0)
        #expect(apply.stderr.contains(/Applying: ([0-9,]+)\/\1 tokens \(100%\), [0-9,]+\/s, ETA 0s/), "\(apply.stderr)")
        #expect(!apply.stderr.contains("\u{1B}["), "no terminal escapes when stderr is not a terminal")
    }

    @Test func aPlanThatCannotBeWrittenNeverExitsZero() throws {
        guard FileManager.default.fileExists(atPath: "/dev/full") else { return }
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        for format in ["text", "markdown", "json"] {
            let process = Process()
            process.executableURL = CLIRunner.binary
            process.arguments = ["plan", "--format", format, "--detailed-exitcode"]
            process.currentDirectoryURL = cli.project
            process.standardOutput = FileHandle(forWritingAtPath: "/dev/full")
            process.standardError = FileHandle.nullDevice
            try process.run()
            process.waitUntilExit()
            #expect(process.terminationStatus == 1, "\(format): exit \(process.terminationStatus)")
        }
    }

    @Test func driftSeededThroughTheAdminAPIIsFoundAndCorrected() async throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        let server = try EmulatorServeTests.Server.startForDemo(cli)
        defer { _ = server.stop() }
        let environment = server.environment
        // Drift on devices no plan touches: only a full read is sure to find it (a sample finds it as
        // the sweep reaches those devices; RefreshModeTests).
        let backend = ["--backend", "emulator", "--refresh", "all"]
        #expect(
            try cli.run(["apply", "--auto-approve", "--backend", "emulator"], environment: environment).status == 0)
        let none = try cli.run(["drift", "--detailed-exitcode"] + backend, environment: environment)
        #expect(none.status == 0, "\(none.stdout)\(none.stderr)")
        #expect(none.stdout.hasPrefix("No drift"))

        let devices = try Self.demoDevices()
        let outsider = devices.first { $0.value.region == "irish-sea" }!
        let members = devices.filter { $0.value.region == "north-sea" }.keys.sorted()
        let (dropper, corpse) = (devices[members[0]]!, devices[members[1]]!)
        let project = "/emulator/v1/projects/tidemark-demo"
        let topic = "\(project)/topics/weather-severe-north-sea/subscribers"
        #expect(try await server.call("POST", topic, body: server.json(["tokens": [outsider.value.token]])).0 == 200)
        #expect(try await server.call("DELETE", topic, body: server.json(["tokens": [dropper.token]])).0 == 200)
        #expect(try await server.call("DELETE", "\(project)/registrations/\(corpse.token)").0 == 200)
        #expect(try await server.call("DELETE", "\(project)/groups/oncall-phones").0 == 200)

        let drift = try cli.run(["drift", "--detailed-exitcode"] + backend, environment: environment)
        #expect(drift.status == 2, "\(drift.stdout)\(drift.stderr)")
        #expect(
            drift.stdout.hasPrefix(
                "Drift: 1 self-subscription to authoritative topics, 1 declared membership dropped, 1 dead token, 1 vanished group."
            ), "\(drift.stdout)")
        #expect(drift.stdout.contains("(device \(outsider.key))"))
        #expect(!drift.stdout.contains(outsider.value.token))
        let events = try cli.run(["drift", "--json"] + backend, environment: environment)
        #expect(events.status == 0)
        let lines = events.stdout.split(separator: "\n").map {
            try! JSONSerialization.jsonObject(with: Data($0.utf8)) as! [String: Any]
        }
        #expect(
            Set(lines.compactMap { $0["kind"] as? String }) == [
                "self_subscribed", "dropped", "dead_token", "vanished_group",
            ])
        #expect(lines.last?["event"] as? String == "summary" && lines.last?["drift"] as? Bool == true)
        let markdown = try cli.run(["drift", "--format", "markdown"] + backend, environment: environment)
        #expect(markdown.stdout.hasPrefix("### 🌊 tidemark drift: Drift: "))
        let json = try cli.run(["drift", "--format", "json"] + backend, environment: environment)
        #expect(json.stdout.contains(outsider.value.token), "JSON carries full data")

        // One apply removes it all; the dead token is recorded and no longer drift.
        let apply = try cli.run(["apply", "--auto-approve"] + backend, environment: environment)
        #expect(apply.status == 0, "\(apply.stderr)")
        let after = try cli.run(["drift", "--detailed-exitcode"] + backend, environment: environment)
        #expect(after.status == 0, "\(after.stdout)")
        #expect(try cli.run(["plan", "--detailed-exitcode"] + backend, environment: environment).status == 0)
        let (_, subscribers) = try await server.call("GET", "\(project)/topics/weather-severe-north-sea/subscribers")
        let now = Set((subscribers["subscribers"] as? [String]) ?? [])
        #expect(!now.contains(outsider.value.token) && now.contains(dropper.token))
        let (status, _) = try await server.call("GET", "\(project)/groups/oncall-phones")
        #expect(status == 200)
    }

    /// The scheduled job's correction: `apply --drift-only` undoes drift seeded through the admin API and
    /// leaves a manifest edit and inventory churn waiting on `main` alone; past `--max-unsubscribes` it
    /// corrects nothing and exits 1.
    @Test func scheduledCorrectionUndoesDriftWithinItsRails() async throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        let server = try EmulatorServeTests.Server.startForDemo(cli)
        defer { _ = server.stop() }
        let environment = server.environment
        let backend = ["--backend", "emulator", "--refresh", "all"]
        #expect(try cli.run(["apply", "--auto-approve"] + backend, environment: environment).status == 0)
        let refusedBeforeState = try CLIRunner(demo: true)
        defer { refusedBeforeState.remove() }
        let early = try refusedBeforeState.run(["plan", "--drift-only"])
        #expect(early.status == 1 && early.stderr.contains("there is no state"), "\(early.stderr)")

        let devices = try Self.demoDevices()
        let outsider = devices.first { $0.value.region == "irish-sea" }!
        let members = devices.filter { $0.value.region == "north-sea" }.keys.sorted()
        let dropper = devices[members[0]]!
        let project = "/emulator/v1/projects/tidemark-demo"
        let topic = "\(project)/topics/weather-severe-north-sea/subscribers"
        #expect(try await server.call("POST", topic, body: server.json(["tokens": [outsider.value.token]])).0 == 200)
        #expect(try await server.call("DELETE", topic, body: server.json(["tokens": [dropper.token]])).0 == 200)
        #expect(try await server.call("DELETE", "\(project)/groups/oncall-phones").0 == 200)

        // Waiting on main: a new topic, and a north-sea device that left the inventory.
        try cli.write(
            "manifests/new.yaml", "topics:\n  - name: lifeboat-news\n    members: [{selector: {region: baltic}}]\n")
        let leaver = members[1]
        let csv = cli.project.appendingPathComponent("manifests/inventory/devices.csv")
        let rows = try String(contentsOf: csv, encoding: .utf8).split(separator: "\n")
        try (rows.filter { !$0.hasPrefix(leaver + ",") }.joined(separator: "\n") + "\n").write(
            to: csv, atomically: true, encoding: .utf8)

        // Past the rail: nothing is corrected.
        let capped = try cli.run(
            ["apply", "--auto-approve", "--drift-only", "--max-unsubscribes", "0"] + backend, environment: environment)
        #expect(capped.status == 1, "\(capped.stdout)\(capped.stderr)")
        #expect(capped.stdout.contains("more than --max-unsubscribes 0 allows"), "\(capped.stdout)")
        #expect(capped.stderr.contains("the plan has errors"))
        func subscribers(_ name: String) async throws -> Set<String> {
            let (_, body) = try await server.call("GET", "\(project)/topics/\(name)/subscribers")
            return Set((body["subscribers"] as? [String]) ?? [])
        }
        #expect(try await subscribers("weather-severe-north-sea").contains(outsider.value.token))

        // Within the rail: the drift is undone, and only the drift.
        let preview = try cli.run(["plan", "--drift-only", "--detailed-exitcode"] + backend, environment: environment)
        #expect(preview.status == 2, "\(preview.stdout)\(preview.stderr)")
        #expect(
            preview.stdout.contains("Drift only: this plan re-asserts what the last apply established"),
            "\(preview.stdout)")
        #expect(preview.stdout.contains("for a normal 'tidemark apply'"))
        let fixed = try cli.run(
            ["apply", "--auto-approve", "--drift-only", "--max-unsubscribes", "5"] + backend, environment: environment)
        #expect(fixed.status == 0, "\(fixed.stdout)\(fixed.stderr)")
        #expect(
            fixed.stdout.contains("Apply complete: +1 subscribed, −1 unsubscribed, 1 group call;"), "\(fixed.stdout)")
        let north = try await subscribers("weather-severe-north-sea")
        #expect(!north.contains(outsider.value.token) && north.contains(dropper.token))
        #expect(north.contains(devices[leaver]!.token), "a device that left the inventory is a normal apply's business")
        #expect(try await subscribers("lifeboat-news").isEmpty, "a manifest edit waits for a normal apply")
        #expect(try await server.call("GET", "\(project)/groups/oncall-phones").0 == 200)
        let again = try cli.run(["plan", "--drift-only", "--detailed-exitcode"] + backend, environment: environment)
        #expect(again.status == 0, "\(again.stdout)")
        #expect(again.stdout.hasPrefix("No changes. FCM matches what the last apply established"), "\(again.stdout)")
        let misuse = try cli.run(["apply", "--drift-only", "--no-refresh"])
        #expect(misuse.status != 0 && misuse.stderr.contains("--drift-only finds drift by reading FCM"))
        #expect(try cli.run(["plan", "--drift-only", "--out", "x.json"]).status != 0)

        // The scheduled job without --drift-only takes in what was waiting.
        let full = try cli.run(
            ["apply", "--auto-approve", "--max-unsubscribes", "5%"] + backend, environment: environment)
        #expect(full.status == 0, "\(full.stdout)\(full.stderr)")
        #expect(try await !subscribers("lifeboat-news").isEmpty)
        #expect(try await !subscribers("weather-severe-north-sea").contains(devices[leaver]!.token))
    }

    /// `tidemark init` starts a project that validates and plans at once, writes the schema beside the
    /// manifests and the chosen recipe, and never writes over anything; `tidemark schema` prints the
    /// repository's schema (the binary's copies are generated by scripts/embed-files.py).
    @Test func initStartsAProjectAndOverwritesNothing() throws {
        let cli = try CLIRunner()
        defer { cli.remove() }
        try FileManager.default.removeItem(at: cli.project.appendingPathComponent("manifests"))
        let root = CLIRunner.repositoryRoot
        func read(_ url: URL) throws -> String { try String(contentsOf: url, encoding: .utf8) }
        let schema = try cli.run(["schema"])
        #expect(schema.status == 0)
        #expect(
            schema.stdout == (try read(root.appendingPathComponent("schema/tidemark-manifest.schema.json"))),
            "the binary's schema differs from schema/: run python3 scripts/embed-files.py")

        let started = try cli.run(["init", "--project", "acme-news", "--ci", "github"])
        #expect(started.status == 0, "\(started.stderr)")
        #expect(started.stdout.contains("tidemark plan"))
        for (written, example) in [
            (".github/workflows/tidemark.yml", "examples/github/tidemark.yml"),
            (".github/actions/install-tidemark/action.yml", "examples/github/actions/install-tidemark/action.yml"),
            ("manifests/tidemark-manifest.schema.json", "schema/tidemark-manifest.schema.json"),
        ] {
            #expect(
                try read(cli.project.appendingPathComponent(written)) == read(root.appendingPathComponent(example)),
                "\(written) differs from \(example): run python3 scripts/embed-files.py")
        }
        let manifest = try read(cli.project.appendingPathComponent("manifests/topics.yaml"))
        #expect(manifest.hasPrefix("# yaml-language-server: $schema=tidemark-manifest.schema.json\n"))
        #expect(try read(cli.project.appendingPathComponent("tidemark.yaml")).contains("project: acme-news"))
        #expect(try read(cli.project.appendingPathComponent(".gitignore")) == ".tidemark/\n.emulator/\n")
        let validate = try cli.run(["validate"])
        #expect(validate.status == 0, "\(validate.stdout)\(validate.stderr)")
        let plan = try cli.run(["plan", "--detailed-exitcode"])
        #expect(plan.status == 2 && plan.stdout.hasPrefix("Plan: 2 topics change: +5 subscriptions"), "\(plan.stdout)")
        #expect(try cli.run(["apply", "--auto-approve"]).status == 0)

        // Again, in the project: --ci adds only the pipeline, and touches nothing else.
        try "project: mine-edited\n".write(
            to: cli.project.appendingPathComponent("tidemark.yaml"), atomically: true, encoding: .utf8)
        let again = try cli.run(["init", "--ci", "gitlab"])
        #expect(again.status == 0 && again.stdout.contains("Added the GitLab CI pipeline"), "\(again.stderr)")
        #expect(
            try read(cli.project.appendingPathComponent(".gitlab-ci.yml"))
                == read(root.appendingPathComponent("examples/gitlab/.gitlab-ci.yml")))
        #expect(try read(cli.project.appendingPathComponent("tidemark.yaml")) == "project: mine-edited\n")
        // A pipeline that exists is never overwritten; nor is a project started twice.
        let twice = try cli.run(["init", "--ci", "github"])
        #expect(twice.status == 1 && twice.stderr.contains("never overwrites a file"), "\(twice.stderr)")
        #expect(twice.stderr.contains(".github/workflows/tidemark.yml"))
        let bare = try cli.run(["init"])
        #expect(bare.status == 1 && bare.stderr.contains("is a tidemark project already"), "\(bare.stderr)")
        #expect(try read(cli.project.appendingPathComponent("tidemark.yaml")) == "project: mine-edited\n")

        let gitlab = cli.project.appendingPathComponent("other")
        let other = try cli.run(["init", "-C", gitlab.path, "--ci", "gitlab"])
        #expect(other.status == 0, "\(other.stderr)")
        #expect(
            try read(gitlab.appendingPathComponent(".gitlab-ci.yml"))
                == read(root.appendingPathComponent("examples/gitlab/.gitlab-ci.yml")))
        let bad = try cli.run(["init", "-C", gitlab.path, "--project", "Acme_News"])
        #expect(bad.status == 64 && bad.stderr.contains("--project 'Acme_News' must start with a lowercase letter"))
    }

    @Test func importAdoptsExistingMembershipsWithoutChangingFCM() throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        #expect(try cli.run(["apply", "--auto-approve"]).status == 0)
        // Lose state: the memberships exist in FCM (the embedded engine), but tidemark no longer knows it made them.
        try FileManager.default.removeItem(at: cli.project.appendingPathComponent(".tidemark/state.db"))
        let dry = try cli.run(["import", "--dry-run"])
        #expect(
            dry.status == 0 && dry.stdout.contains("Would adopt")
                && dry.stdout.contains("Dry run: state was not written."))
        #expect(!FileManager.default.fileExists(atPath: cli.project.appendingPathComponent(".tidemark/state.db").path))
        let imported = try cli.run(["import"])
        #expect(imported.status == 0, "\(imported.stderr)")
        #expect(imported.stdout.contains("weather-daily-en: "))
        #expect(imported.stdout.contains("4 declared device groups found in FCM"))
        // Every topic membership is in place; only the groups' members, which FCM cannot list, are added again.
        #expect(try cli.run(["plan", "--target", "topic:*", "--detailed-exitcode"]).status == 0)
        let groups = try cli.run(["plan", "--format", "json"])
        let operations =
            (try JSONSerialization.jsonObject(with: Data(groups.stdout.utf8)) as! [String: Any])["operations"]
            as! [[String: Any]]
        #expect(operations.allSatisfy { $0["kind"] as? String == "group_add" }, "\(operations.map { $0["kind"]! })")
        // Because the memberships are tidemark's again, dropping a topic unsubscribes them.
        try FileManager.default.removeItem(at: cli.project.appendingPathComponent("manifests/scores.yaml"))
        let plan = try cli.run(["plan", "--detailed-exitcode"])
        #expect(plan.status == 2 && plan.stdout.contains("(topic removed from the manifests)"))
    }

    @Test func audienceCountsWhoAConditionReaches() throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        let northSea = try Self.demoDevices().values.filter { $0.region == "north-sea" }.count
        let desired = try cli.run(["audience", "'weather-severe-north-sea' in topics"])
        #expect(desired.status == 0, "\(desired.stderr)")
        #expect(desired.stdout.hasPrefix("The condition reaches \(northSea) devices as the manifests declare them."))
        #expect(desired.stdout.contains("By platform: "))
        // Before any apply nothing is observed; after it, the same devices.
        let before = try cli.run(["audience", "'weather-severe-north-sea' in topics", "--from", "observed"])
        #expect(before.stdout.hasPrefix("The condition reaches 0 devices"))
        #expect(try cli.run(["apply", "--auto-approve"]).status == 0)
        let after = try cli.run([
            "audience", "'weather-severe-north-sea' in topics", "--from", "observed", "--refresh", "--format", "json",
        ])
        let json = try JSONSerialization.jsonObject(with: Data(after.stdout.utf8)) as! [String: Any]
        #expect(json["count"] as? Int == northSea)
        let negated = try cli.run([
            "audience", "!('weather-severe-north-sea' in topics) && !('nope' in topics)", "--format", "json",
        ])
        let all = try JSONSerialization.jsonObject(with: Data(negated.stdout.utf8)) as! [String: Any]
        #expect((all["count"] as? Int ?? 0) > 2000)
        #expect(all["unknown_topics"] as? [String] == ["nope"])
        let invalid = try cli.run(["audience", "'a' in topics &&"])
        #expect(invalid.status == 1 && invalid.stderr.contains("column"))
    }

    @Test func fmtMakesManifestsCanonicalAndKeepsComments() throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        // The demo manifests are canonical.
        let demo = try cli.run(["fmt", "--check"])
        #expect(demo.status == 0, "\(demo.stdout)\(demo.stderr)")
        try cli.write(
            "manifests/messy.yaml",
            """
            # Header comment.
            groups:
              - members:
                  - devices: [dev-00003, dev-00001]   # two phones
                notification_key_name: messy-group
            topics:

              # The canary.
              - members: [{tokens: ["zz:APA91bZZ", "aa:APA91bAA"]}]
                protect: true
                name: messy-topic
                mode: authoritative
                description: 'It''s messy'

            """)
        let check = try cli.run(["fmt", "--check"])
        #expect(check.status == 1)
        #expect(check.stdout == "manifests/messy.yaml\n")
        // --diff with --check: the change as a unified diff, nothing written.
        let diff = try cli.run(["fmt", "--check", "--diff"])
        #expect(diff.status == 1, "\(diff.stderr)")
        #expect(
            diff.stdout.hasPrefix("--- manifests/messy.yaml\n+++ manifests/messy.yaml (formatted)\n@@ -1,"),
            "\(diff.stdout)")
        #expect(diff.stdout.contains("\n-groups:\n") && diff.stdout.contains("\n+groups:\n"), "\(diff.stdout)")
        #expect(diff.stdout.contains("\n+  - name: messy-topic\n"), "\(diff.stdout)")
        #expect(try cli.run(["fmt", "--check"]).stdout == "manifests/messy.yaml\n")
        #expect(try cli.run(["fmt"]).stdout == "formatted manifests/messy.yaml\n")
        let formatted = try String(
            contentsOf: cli.project.appendingPathComponent("manifests/messy.yaml"), encoding: .utf8)
        #expect(
            formatted == """
                # Header comment.
                topics:

                  # The canary.
                  - name: messy-topic
                    description: 'It''s messy'
                    mode: authoritative
                    protect: true
                    members: [{tokens: ["aa:APA91bAA", "zz:APA91bZZ"]}]
                groups:
                  - notification_key_name: messy-group
                    members:
                      - devices: [dev-00001, dev-00003] # two phones

                """)
        #expect(try cli.run(["fmt", "--check"]).status == 0)
        #expect(try cli.run(["validate"]).status == 0)
        try cli.write("manifests/broken.yaml", "topics: [\n")
        let broken = try cli.run(["fmt"])
        #expect(broken.status == 1 && broken.stderr.contains("manifests/broken.yaml:"))
    }

    @Test func stateCommandsShowWhatTidemarkRemembers() throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        let none = try cli.run(["state", "list"])
        #expect(none.status == 1 && none.stderr.contains("there is no state at .tidemark/state.db yet"))
        #expect(try cli.run(["apply", "--auto-approve"]).status == 0)
        let list = try cli.run(["state", "list"])
        #expect(list.status == 0)
        #expect(list.stdout.contains("ops-canary") && list.stdout.contains("protected"))
        #expect(list.stdout.contains("Latest applies:") && list.stdout.contains("finished"))
        let json =
            try JSONSerialization.jsonObject(
                with: Data(try cli.run(["state", "list", "--format", "json"]).stdout.utf8)) as! [String: Any]
        #expect((json["topics"] as? [[String: Any]])?.count == 23)
        let show = try cli.run(["state", "show", "group:oncall-phones"])
        #expect(show.status == 0 && show.stdout.contains("(device oncall-pixel-8)"))
        for device in try Self.demoDevices().values.prefix(50) { #expect(!show.stdout.contains(device.token)) }
        #expect(try cli.run(["state", "show", "topic:nope"]).status == 1)
        #expect(try cli.run(["state", "lock"]).stdout.contains("is not locked"))

        // While an apply runs, the lock names it.
        try FileManager.default.removeItem(at: cli.project.appendingPathComponent("manifests/scores.yaml"))
        let (apply, _, _) = try cli.start(
            ["apply", "--auto-approve", "--parallelism", "1"],
            environment: ["TIDEMARK_EMBEDDED_LATENCY_MS": "200"])
        defer {
            if apply.isRunning { apply.terminate() }
            apply.waitUntilExit()
        }
        var held: CLIRunner.Result?
        for _ in 0..<100 where held == nil {
            let lock = try cli.run(["state", "lock"])
            if lock.status == 2 { held = lock } else { Thread.sleep(forTimeInterval: 0.1) }
        }
        #expect(
            held?.stdout.contains("is locked: tidemark apply (pid \(apply.processIdentifier)") == true,
            "\(held?.stdout ?? "never locked")")
    }

    /// `tidemark device` shows one device's memberships, desired and observed, and the manifest entries
    /// behind them; a rotated token's old memberships say why they go.
    @Test func aDevicesViewSaysWhy() throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        #expect(try cli.run(["apply", "--auto-approve"]).status == 0)
        let view = try cli.run(["device", "dev-00001"])
        #expect(view.status == 0, "\(view.stderr)")
        // The start of one device's id names it; the start of several lists them.
        let prefix = try cli.run(["device", "dev-0300"])
        #expect(prefix.status == 0 && prefix.stdout.contains("dev-03000"), "\(prefix.stdout)\(prefix.stderr)")
        let several = try cli.run(["device", "dev-0299"])
        #expect(
            several.status != 0 && several.stderr.contains("'dev-0299' begins 10 device ids: dev-02990, dev-02991")
                && several.stderr.contains("dev-02999; give more of the id"), "\(several.stderr)")
        let many = try cli.run(["device", "dev-029"])
        #expect(many.status != 0 && many.stderr.contains("begins more than 10 device ids"), "\(many.stderr)")
        #expect(view.stdout.contains("scores-dublin-harps (additive): desired: yes, observed: yes"), "\(view.stdout)")
        #expect(view.stdout.contains("selector {team: dublin-harps} at manifests/scores.yaml:"))
        let csvPath = cli.project.appendingPathComponent("manifests/inventory/devices.csv")
        let csv = try String(contentsOf: csvPath, encoding: .utf8)
        let old = String(csv.split(separator: "\n")[1].split(separator: ",")[1])
        #expect(!view.stdout.contains(old), "the token is redacted")
        let json = try cli.run(["device", old, "--format", "json"])
        let object = try #require(try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [String: Any])
        #expect(object["device"] as? String == "dev-00001" && object["token"] as? String == old)
        #expect((object["topics"] as? [[String: Any]])?.count == 4)
        // The device gets a new token: its old one shows why it leaves, and what apply does.
        let new = "rotated00001:APA91b" + String(repeating: "r", count: 140)
        try csv.replacingOccurrences(of: old, with: new).write(to: csvPath, atomically: true, encoding: .utf8)
        let rotated = try cli.run(["device", old])
        #expect(rotated.status == 0, "\(rotated.stderr)")
        #expect(rotated.stdout.contains("token rotated: the device now has"), "\(rotated.stdout)")
        #expect(rotated.stdout.contains("desired: no, observed: yes; apply unsubscribes it"), "\(rotated.stdout)")
        let unknown = try cli.run(["device", "dev-99999"])
        #expect(unknown.status == 1 && unknown.stderr.contains("neither the inventory nor state knows"))
    }

    /// Every command that prints data takes --format json and prints one JSON document on stdout; the
    /// rest of the output (a plan shown before an apply) goes to stderr.
    @Test func everyDataCommandSpeaksJSON() throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        func json(_ arguments: [String], status: Int32 = 0) throws -> [String: Any] {
            let result = try cli.run(arguments + ["--format", "json"])
            #expect(result.status == status, "\(arguments): \(result.stderr)")
            let object = try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any]
            return try #require(object, "\(arguments) printed no JSON object: \(result.stdout.prefix(300))")
        }
        #expect(try json(["validate"])["valid"] as? Bool == true)
        #expect(try json(["plan"])["operations"] != nil)
        let applied = try json(["apply", "--auto-approve"])
        #expect(applied["result"] as? String == "applied")
        #expect(((applied["applied"] as? [String: Any])?["subscribed"] as? Int ?? 0) > 10_000)
        #expect(try json(["apply", "--auto-approve"])["result"] as? String == "nothing_to_do")
        #expect(try json(["apply", "--refresh-only"])["result"] as? String == "refreshed")
        #expect(try json(["state", "list"])["serial"] != nil)
        let shown = try json(["state", "show", "topic:weather-daily-en"])
        let managed = try #require(shown["managed"] as? [[String: Any]])
        #expect(managed.first?["device"] as? String == "dev-00001", "\(managed.prefix(1))")
        #expect(try json(["state", "lock"])["locked"] as? Bool == false)
        #expect(try json(["state", "prune", "--dry-run"])["pruned"] as? Int == 0)
        #expect(try json(["import", "--dry-run"])["dry_run"] as? Bool == true)
        #expect(try json(["drift", "--refresh", "all"])["items"] != nil)
        #expect(try json(["device", "dev-00001"])["device"] as? String == "dev-00001")
        #expect(try json(["audience", "'weather-daily-en' in topics"]).isEmpty == false)
        let plan = try cli.run(["plan", "--out", "p.json"])
        #expect(plan.status == 0)
        #expect(try json(["show", "p.json"])["operations"] != nil)

        // Invalid manifests: still one JSON document, with every diagnostic, and exit 1.
        try cli.write("manifests/bad.yaml", "topics:\n  - name: no spaces allowed\n")
        let invalid = try json(["validate"], status: 1)
        #expect(invalid["valid"] as? Bool == false)
        let diagnostics = try #require(invalid["diagnostics"] as? [[String: Any]])
        #expect(
            diagnostics.contains { ($0["message"] as? String ?? "").contains("no spaces allowed") }, "\(diagnostics)")
        let markdown = try cli.run(["state", "lock", "--format", "markdown"])
        // --format lists only what a data command prints: markdown is refused as a value it does not take.
        #expect(
            markdown.status == 64 && markdown.stderr.hasPrefix("error: The value 'markdown' is invalid")
                && markdown.stderr.contains("'text' and 'json'"), "\(markdown.stderr)")
    }

    /// A pull-request job plans from state with no credential: --no-refresh loads no key, and anything
    /// that reads FCM still asks for one.
    @Test func aPlanFromStateNeedsNoCredential() throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        let environment = ["GOOGLE_APPLICATION_CREDENTIALS": ""]
        let plan = try cli.run(
            ["plan", "--backend", "fcm", "--no-refresh", "--detailed-exitcode"], environment: environment)
        #expect(plan.status == 2, "\(plan.stdout)\(plan.stderr)")
        #expect(plan.stdout.contains("from state only"), "\(plan.stdout)")
        let read = try cli.run(["plan", "--backend", "fcm", "--refresh", "touched"], environment: environment)
        #expect(read.status == 1 && read.stderr.contains("GOOGLE_APPLICATION_CREDENTIALS is not set"), "\(read.stderr)")
        let apply = try cli.run(["apply", "--backend", "fcm", "--auto-approve"], environment: environment)
        #expect(apply.status == 1 && apply.stderr.contains("GOOGLE_APPLICATION_CREDENTIALS is not set"))
    }

    /// The CI recipes are valid YAML, and every tidemark command in them exists with the flags they use.
    @Test func ciRecipesAreValid() throws {
        let cli = try CLIRunner()
        defer { cli.remove() }
        let root = CLIRunner.repositoryRoot.appendingPathComponent("examples")
        let files = ["github/tidemark.yml", "github/actions/install-tidemark/action.yml", "gitlab/.gitlab-ci.yml"]
        var commands: [String] = []
        for file in files {
            let text = try String(contentsOf: root.appendingPathComponent(file), encoding: .utf8)
            // Composed, not loaded: YAML 1.1 reads GitHub's `on:` key as a boolean.
            let node = try #require(try Yams.compose(yaml: text), "\(file) is empty")
            let mapping = try #require(node.mapping, "\(file) is not a YAML mapping")
            let keys = Set(mapping.map { $0.key.string ?? "" })
            if file == "github/tidemark.yml" {
                #expect(keys.isSuperset(of: ["name", "on", "jobs", "permissions"]))
                let jobs = Set((node["jobs"]?.mapping ?? [:]).map { $0.key.string ?? "" })
                #expect(jobs == ["plan", "apply", "drift"])
                let triggers = Set((node["on"]?.mapping ?? [:]).map { $0.key.string ?? "" })
                #expect(triggers.isSuperset(of: ["pull_request", "push", "schedule"]))
                // Pull-request jobs hold no key and plan from state; the apply is never in a concurrency
                // group (GitHub cancels pending runs in one) and waits on tidemark's lease instead.
                let jobsText = { (job: String) in try! Yams.serialize(node: node["jobs"]![job]!) }
                #expect(!jobsText("plan").contains("google-github-actions/auth"), "the plan job gets no key")
                #expect(!jobsText("plan").contains("FCM_SERVICE_ACCOUNT"))
                #expect(jobsText("plan").contains("--no-refresh"))
                #expect(jobsText("plan").contains("tidemark-plan workspace="), "one comment, found by its marker")
                #expect(jobsText("plan").contains("exitcode == '0'"), "a plan without changes is saved too")
                #expect(node["jobs"]?["apply"]?["concurrency"] == nil, "the apply is never cancelled by a group")
                #expect(jobsText("apply").contains("--lock-timeout"))
                #expect(jobsText("drift").contains("gh issue list --label tidemark-drift"), "one drift issue")
                #expect(jobsText("drift").contains("\"$REFRESH\" = \"all\""), "closed only by a full read")
                #expect(
                    jobsText("drift").contains("apply --drift-only --auto-approve --max-unsubscribes")
                        && jobsText("drift").contains("apply --auto-approve --max-unsubscribes"),
                    "the scheduled job corrects within a rail")
            }
            if file == "gitlab/.gitlab-ci.yml" {
                #expect(keys.isSuperset(of: ["stages", "plan", "apply", "drift"]))
                let jobText = { (job: String) in try! Yams.serialize(node: node[job]!) }
                #expect(node["variables"]?["GOOGLE_APPLICATION_CREDENTIALS"] == nil, "no key for every job")
                #expect(!jobText("plan").contains("FCM_SERVICE_ACCOUNT") && jobText("plan").contains("--no-refresh"))
                #expect(jobText("plan").contains("tidemark-plan workspace="), "one note, found by its marker")
                #expect(jobText("apply").contains("--lock-timeout"))
                #expect(
                    jobText("drift").contains("state_event=close")
                        && jobText("drift").contains("\"$refresh\" = \"all\""))
                #expect(jobText("drift").contains("apply --drift-only --auto-approve --max-unsubscribes"))
                // Every script line is a string: an unquoted `- auth="PRIVATE-TOKEN: …"` is a mapping.
                for job in ["check", "plan", "apply", "drift", "default"] {
                    for key in ["script", "before_script"] {
                        for line in node[job]?[key]?.sequence ?? [] {
                            #expect(line.scalar != nil, "\(file): a line of \(job).\(key) is not a string: \(line)")
                        }
                    }
                }
            }
            for match in text.matches(
                of: /tidemark (validate|plan|apply|drift|show|fmt|import|audience)[^\n]*(\\\n[^\n]*)*/)
            {
                commands.append(String(match.output.0).replacingOccurrences(of: "\\\n", with: " "))
            }
        }
        #expect(commands.count >= 8)
        var helpCache: [String: String] = [:]
        for command in commands {
            let words = command.split(separator: " ").map(String.init)
            let sub = words[1]
            let help = try helpCache[sub] ?? cli.run([sub, "--help"]).stdout
            helpCache[sub] = help
            for flag in words.dropFirst(2) where flag.hasPrefix("--") {
                #expect(help.contains(flag), "`\(command)`: \(flag) is not an option of tidemark \(sub)")
            }
        }
    }
}
