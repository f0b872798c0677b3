import Foundation
import Testing

/// An apply killed with SIGKILL part-way resumes with only the remaining work and converges;
/// a second apply while one runs fails at once naming the holder.
@Suite(.serialized) struct InterruptedApplyTests {
    /// 40 topics over 400 devices: 40 subscribe requests, slowed down so a kill lands in the middle.
    func makeProject() throws -> CLIRunner {
        let cli = try CLIRunner()
        var csv = "device_id,token,shard\n"
        for i in 0..<400 { csv += "d\(i),tok\(String(format: "%05d", i)):APA91bxxxxxxxxxxxxxxxx,s\(i % 4)\n" }
        try cli.write("manifests/devices.csv", csv)
        var yaml = "inventory:\n  files: [devices.csv]\ntopics:\n"
        for t in 0..<40 {
            yaml += "  - name: topic-\(t)\n    members: [{selector: {shard: [s\(t % 4), s\((t + 1) % 4)]}}]\n"
        }
        try cli.write("manifests/topics.yaml", yaml)
        return cli
    }

    /// Waits until the running apply has journaled `done` operations (or has ended). Polled through
    /// 'tidemark state list', a reader in another process, as a second runner would be.
    func waitForJournal(_ cli: CLIRunner, _ process: Process, done: Int) {
        struct Listing: Decodable {
            struct Apply: Decodable {
                var status: String
                var done: Int
            }
            var applies: [Apply]
        }
        let deadline = Date().addingTimeInterval(60)
        while Date() < deadline, process.isRunning {
            if let listing = try? cli.run(["state", "list", "--format", "json"]), listing.status == 0,
                let parsed = try? JSONDecoder().decode(Listing.self, from: Data(listing.stdout.utf8)),
                let latest = parsed.applies.first, latest.status == "running", latest.done >= done
            {
                return
            }
            Thread.sleep(forTimeInterval: 0.05)
        }
    }

    @Test func killedApplyResumesAndConverges() throws {
        let cli = try makeProject()
        defer { cli.remove() }
        let slow = ["TIDEMARK_EMBEDDED_LATENCY_MS": "100"]
        let (process, _, _) = try cli.start(["apply", "--auto-approve", "--parallelism", "1"], environment: slow)
        // Wait until the journal shows a few finished batches, then kill without warning.
        waitForJournal(cli, process, done: 3)
        #expect(process.isRunning, "the apply finished before it could be killed")
        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
        #expect(process.terminationReason == .uncaughtSignal)

        // What a CI job uploads after a cancelled apply: state.db alone, without its -wal file. It loads,
        // and holds the journal to resume from.
        let alone = cli.project.appendingPathComponent("alone.db").path
        try FileManager.default.copyItem(
            atPath: cli.project.appendingPathComponent(".tidemark/state.db").path, toPath: alone)
        let list = try cli.run(["state", "list", "--state", "alone.db"])
        #expect(list.status == 0, "\(list.stderr)")
        #expect(list.stdout.contains("interrupted"), "the copy holds the unfinished apply: \(list.stdout)")

        let resumed = try cli.run(["apply", "--auto-approve"], environment: slow)
        #expect(resumed.status == 0, "\(resumed.stderr)")
        let message = try #require(resumed.stderr.split(separator: "\n").first { $0.contains("Resuming the apply") })
        // "… N of 40 operations were done; running the M remaining."
        let numbers = message.split(whereSeparator: { !$0.isNumber }).compactMap { Int($0) }
        let done = try #require(numbers.dropLast(2).last)
        let remaining = try #require(numbers.last)
        #expect(done > 0 && done < 40, "\(message)")
        #expect(done + remaining == 40)
        // The finished apply is said when it finishes, before the plan of what is left.
        #expect(resumed.stderr.contains("Finished the interrupted apply: +"), "\(resumed.stderr)")
        #expect(!resumed.stdout.contains("Apply complete"), "nothing was left to apply: \(resumed.stdout)")
        let plan = try cli.run(["plan", "--detailed-exitcode"])
        #expect(plan.status == 0, "\(plan.stdout)")
    }

    @Test func secondApplyFailsAtOnceNamingTheLockHolder() throws {
        let cli = try makeProject()
        defer { cli.remove() }
        let (process, _, _) = try cli.start(
            ["apply", "--auto-approve", "--parallelism", "1"],
            environment: ["TIDEMARK_EMBEDDED_LATENCY_MS": "50"])
        defer {
            if process.isRunning { kill(process.processIdentifier, SIGKILL) }
            process.waitUntilExit()
        }
        let lockPath = cli.project.appendingPathComponent(".tidemark/state.db.lock").path
        let deadline = Date().addingTimeInterval(60)
        while Date() < deadline, (try? String(contentsOfFile: lockPath, encoding: .utf8))?.isEmpty ?? true {
            Thread.sleep(forTimeInterval: 0.05)
        }
        let started = Date()
        let second = try cli.run(["apply", "--auto-approve"])
        #expect(Date().timeIntervalSince(started) < 5)
        #expect(second.status == 1)
        #expect(
            second.stderr.contains("is locked by tidemark apply (pid \(process.processIdentifier)"), "\(second.stderr)")
        #expect(second.stderr.contains(" since 20"))
    }

    /// SIGTERM (and Ctrl-C) stop an apply between operations: the journal is written, the exit code says
    /// which signal, `state list` calls the run interrupted, `plan` says a resume is pending, and the
    /// next apply finishes it.
    @Test func sigtermStopsCleanlyAndSaysHowToResume() throws {
        let cli = try makeProject()
        defer { cli.remove() }
        let slow = ["TIDEMARK_EMBEDDED_LATENCY_MS": "100"]
        let (process, _, err) = try cli.start(["apply", "--auto-approve", "--parallelism", "1"], environment: slow)
        waitForJournal(cli, process, done: 2)
        #expect(process.isRunning, "the apply finished before it could be stopped")
        kill(process.processIdentifier, SIGTERM)
        process.waitUntilExit()
        let stderr = String(decoding: err.fileHandleForReading.readAll(), as: UTF8.self)
        #expect(process.terminationStatus == 143, "\(stderr)")
        #expect(stderr.contains("Interrupted by SIGTERM"), "\(stderr)")
        #expect(stderr.contains("Run 'tidemark apply' to finish the rest"))
        let listing = try cli.run(["state", "list"])
        #expect(listing.stdout.contains("interrupted"), "\(listing.stdout)")
        let plan = try cli.run(["plan"])
        #expect(
            plan.stdout.contains("was interrupted with") || plan.stderr.contains("was interrupted with"),
            "\(plan.stdout)")
        let resumed = try cli.run(["apply", "--auto-approve"])
        #expect(resumed.status == 0, "\(resumed.stderr)")
        #expect(resumed.stderr.contains("Resuming the apply"))
        #expect(try cli.run(["plan", "--detailed-exitcode"]).status == 0)
    }

    /// Ctrl-C during a plan ends it at once with 130 and a line saying nothing was changed, instead of
    /// a silent exit.
    @Test func ctrlCDuringAPlanSaysNothingWasChanged() throws {
        let cli = try makeProject()
        defer { cli.remove() }
        let slow = ["TIDEMARK_EMBEDDED_LATENCY_MS": "3000"]
        let (process, _, err) = try cli.start(["plan"], environment: slow)
        // Signalled once the plan handles SIGINT (its handler is in place): bit 1 of /proc's SigIgn or SigCgt.
        let deadline = Date().addingTimeInterval(120)
        while process.isRunning, Date() < deadline {
            // Read through a file handle: /proc files report a size of 0.
            let data = FileHandle(forReadingAtPath: "/proc/\(process.processIdentifier)/status")?.readAll()
            let status = String(decoding: data ?? Data(), as: UTF8.self)
            func mask(_ name: String) -> UInt64 {
                status.split(separator: "\n").first { $0.hasPrefix(name) }
                    .flatMap { UInt64($0.dropFirst(name.count).trimmingCharacters(in: .whitespaces), radix: 16) } ?? 0
            }
            // Ignored, or caught by the dispatch source that replaces the ignore.
            let handled = mask("SigIgn:") | mask("SigCgt:")
            if handled & (1 << (UInt64(SIGINT) - 1)) != 0 { break }
            Thread.sleep(forTimeInterval: 0.05)
        }
        #expect(process.isRunning, "the plan finished before it could be stopped")
        kill(process.processIdentifier, SIGINT)
        process.waitUntilExit()
        let stderr = String(decoding: err.fileHandleForReading.readAll(), as: UTF8.self)
        #expect(process.terminationStatus == 130, "\(stderr)")
        #expect(stderr.contains("Interrupted by SIGINT: plan sends nothing to FCM and writes no state"), "\(stderr)")
    }
}
