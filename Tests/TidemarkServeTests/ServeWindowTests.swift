import Foundation
import Testing
import TidemarkCore
import TidemarkRuntime
import TidemarkServe
import TidemarkTesting

@Suite struct ServeWindowTests {
    /// `2026-11-23T08:00:00Z` (a Monday; 09:00 in Berlin) plus `hours`.
    static func monday(_ hours: Double = 0) -> Date {
        Date(timeIntervalSince1970: 1_795_420_800 + hours * 3600)
    }

    static func window(
        _ kind: ServeWindow.Kind, _ cron: String, _ duration: Duration, _ zone: String = "UTC"
    ) throws
        -> ServeWindow
    {
        ServeWindow(
            kind: kind, schedule: try CronSchedule(parsing: cron), duration: duration,
            timeZone: TimeZone(identifier: zone)!, location: SourceLocation(file: "tidemark.yaml", line: 1, column: 1))
    }

    @Test func cronReadsAsCronDoes() throws {
        var utc = Calendar(identifier: .gregorian)
        utc.timeZone = TimeZone(identifier: "UTC")!
        let weekdays = try CronSchedule(parsing: "0 8 * * MON-FRI")
        #expect(weekdays.matches(Self.monday(), calendar: utc))
        #expect(!weekdays.matches(Self.monday(0.5), calendar: utc))
        #expect(!weekdays.matches(Self.monday(24 * 6), calendar: utc), "Sunday")
        let quarters = try CronSchedule(parsing: "*/15 * * * *")
        #expect(
            quarters.matches(Self.monday(0.25), calendar: utc) && !quarters.matches(Self.monday(0.2), calendar: utc))
        // Both day fields restricted: either one matches (the 23rd, or any Sunday).
        let either = try CronSchedule(parsing: "0 8 23 * 0")
        #expect(either.matches(Self.monday(), calendar: utc) && either.matches(Self.monday(24 * 6), calendar: utc))
        #expect(!either.matches(Self.monday(24), calendar: utc))
        #expect(try CronSchedule(parsing: "0 8 * * 7").matches(Self.monday(24 * 6), calendar: utc), "7 is Sunday")
        for (bad, says) in [
            ("61 * * * *", "'61' as its minute"), ("* * * *", "five fields"), ("0 9 * * 5-1", "runs backwards"),
            ("*/0 * * * *", "step"), ("0 9 * FOO *", "month"),
        ] {
            #expect(throws: CronSchedule.ParseError.self) { try CronSchedule(parsing: bad) }
            #expect(((try? CronSchedule(parsing: bad)) == nil))
            do {
                _ = try CronSchedule(parsing: bad)
            } catch {
                #expect("\(error)".contains(says), "\(bad): \(error)")
            }
        }
    }

    @Test func windowsOpenForTheirDurationInTheirTimeZoneAndDenyWins() throws {
        let office = try Self.window(.allow, "0 9 * * 1-5", .seconds(8 * 3600), "Europe/Berlin")
        #expect(office.isOpen(at: Self.monday()))  // 09:00 Berlin
        #expect(office.isOpen(at: Self.monday(7.9)))
        #expect(!office.isOpen(at: Self.monday(8)))  // 17:00 Berlin
        #expect(!office.isOpen(at: Self.monday(-0.1)))
        #expect(ServeWindow.allowChanges([office], at: Self.monday(1)))
        #expect(!ServeWindow.allowChanges([office], at: Self.monday(9)))
        #expect(ServeWindow.nextAllowed([office], after: Self.monday(9)) == Self.monday(24))
        let freeze = try Self.window(.deny, "0 10 * * *", .seconds(3600))
        #expect(!ServeWindow.allowChanges([office, freeze], at: Self.monday(2.5)), "deny wins")
        #expect(ServeWindow.nextAllowed([office, freeze], after: Self.monday(2.5)) == Self.monday(3))
        #expect(ServeWindow.allowChanges([], at: Self.monday()))
        #expect(ServeWindow.allowChanges([freeze], at: Self.monday(5)))
    }

    @Test func windowsAreReadAndTheirMistakesNamedByLine() throws {
        let text = """
            project: tidemark-test
            serve:
              windows:
                - {kind: allow, schedule: "0 9 * * 1-5", duration: 8h, time_zone: Europe/Berlin}
              heal_outside_windows: true
            """
        let (settings, diagnostics) = ProjectSettings.decode(text, file: "tidemark.yaml")
        #expect(!diagnostics.hasErrors, "\(diagnostics)")
        let defaults = try #require(settings.serve?.defaults)
        #expect(defaults.windows.count == 1 && defaults.healOutsideWindows)
        #expect(defaults.windows[0].timeZone.identifier == "Europe/Berlin" && defaults.windows[0].location.line == 4)
        let mistakes: [(String, Int, String)] = [
            ("serve:\n  windows:\n    - {kind: allow, schedule: '0 9 * *', duration: 1h}\n", 3, "five fields"),
            ("serve:\n  windows:\n    - {kind: maybe, schedule: '0 9 * * *', duration: 1h}\n", 3, "allow or deny"),
            ("serve:\n  windows:\n    - {kind: deny, schedule: '0 9 * * *', duration: 9d}\n", 3, "from 1m to 7d"),
            ("serve:\n  windows:\n    - {kind: deny, schedule: '0 9 * * *'}\n", 3, "needs 'kind'"),
            (
                "serve:\n  windows:\n    - {kind: deny, schedule: '0 9 * * *', duration: 1h, time_zone: Mars/Base}\n",
                3,
                "time zone"
            ),
        ]
        for (text, line, says) in mistakes {
            let errors = ProjectSettings.decode(text, file: "tidemark.yaml").1.filter { $0.severity == .error }
            #expect(errors.count == 1 && errors.first?.location?.line == line, "\(text): \(errors)")
            #expect(errors.first?.message.contains(says) == true, "\(errors.first?.message ?? "none")")
        }
    }

    @Test func outsideTheWindowsChangesWaitUntilAWindowLetsThemThrough() async throws {
        let project = try ServeProject()
        defer { project.remove() }
        try project.writeDevices([0, 1, 2])
        #expect(try await project.reconciler().reconcile().outcome == .success)
        try project.writeDevices([0, 1, 2, 3])
        // The machine found the windows closed until Monday 09:00 when it started the reconcile.
        let waiting = try await project.reconciler().reconcile(window: .closed(opensAt: Self.monday(1)))
        #expect(waiting.outcome == .success && waiting.windowClosed && waiting.subscribed == 0, "\(waiting)")
        #expect(waiting.windowOpensAt == Self.monday(1))
        #expect(
            waiting.changesWaiting == 1 && waiting.summary.contains("outside the sync windows"), "\(waiting.summary)")
        #expect(try await project.subscribers("phones", of: [0, 1, 2, 3]) == 3)
        // Once the windows let changes through, they are applied.
        let applied = try await project.reconciler().reconcile(window: .open)
        #expect(applied.outcome == .success && !applied.windowClosed && applied.subscribed == 1, "\(applied)")
    }

    @Test func outsideTheWindowsDriftIsOnlyReportedUnlessHealOutsideWindows() throws {
        let closed = try Self.window(.deny, "0 8 * * *", .seconds(3600))
        var settings = ServeSettings()
        settings.windows = [closed]
        settings.drift = .heal
        let window = SyncWindow(settings.windows, at: Self.monday(0.5))
        #expect(window == .closed(opensAt: Self.monday(1)))
        var result = ReconcileResult(outcome: .success, startedAt: Self.monday(), seconds: 0)
        let outside = Reconciler.effective(settings, window: window, into: &result)
        #expect(outside.onChange == .plan && outside.drift == .warn && result.windowClosed)
        #expect(result.windowOpensAt == Self.monday(1))
        settings.healOutsideWindows = true
        #expect(Reconciler.effective(settings, window: window, into: &result).drift == .heal)
        var inside = ReconcileResult(outcome: .success, startedAt: Self.monday(), seconds: 0)
        #expect(SyncWindow(settings.windows, at: Self.monday(2)) == .open)
        let open = Reconciler.effective(settings, window: .open, into: &inside)
        #expect(open.onChange == .apply && open.drift == .heal && !inside.windowClosed)
    }
}
