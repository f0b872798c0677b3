import Foundation
import Testing
import TidemarkCore
import TidemarkTesting

/// FCM's 2027 deadlines, at dates before and after each: warnings with the dates and the way off,
/// then, past a deadline that is enforced, an error with the migration path before anything reaches FCM.
@Suite struct DeadlineTests {
    static func day(_ text: String) -> Date {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withFullDate]
        return formatter.date(from: text)!
    }

    @Test func groupsWordingFollowsTheDate() throws {
        func check(_ date: String, enforced: Bool = true) -> [Diagnostic] {
            DeadlineCheck(transport: .v1, enforcedAt: enforced ? Self.day(date) : nil, now: Self.day(date))
                .diagnostics(groups: 3, full: true)
        }
        let before = check("2026-11-22")
        #expect(before.count == 1 && before[0].severity == .warning)
        #expect(before[0].message.contains("new projects cannot use them from 1 December 2026"))
        #expect(before[0].message.contains("stop working on 29 September 2027"))
        #expect(before[0].message.contains("this project manages 3 device groups"))
        #expect(before[0].code == "deadline.device_groups" && before[0].deadline == "2027-09-29")
        let closed = check("2027-01-15")
        #expect(
            closed[0].severity == .warning
                && closed[0].message.contains("new projects cannot use them since 1 December 2026"))
        let lastDay = check("2027-09-28")
        #expect(lastDay[0].severity == .warning)
        let after = check("2027-09-29")
        #expect(after.count == 1 && after[0].severity == .error)
        #expect(after[0].message.contains("FCM turned device groups down on 29 September 2027"))
        #expect(after[0].message.contains("docs/migrating.md"))
        // Not enforced (the embedded backend and the emulator without a date): a warning, however late.
        #expect(check("2031-01-01", enforced: false)[0].severity == .warning)
        #expect(
            DeadlineCheck(transport: .v1, enforcedAt: Self.day("2030-01-01"), now: Self.day("2030-01-01")).diagnostics(
                groups: 0
            ).isEmpty)
        #expect(DeadlineCheck.off.diagnostics(groups: 3).isEmpty)
    }

    /// Plans and applies say each deadline in one short line, left out while acknowledged in
    /// tidemark.yaml; the full paragraph is validate's, and says until when it is acknowledged. Past
    /// the turn-down nothing is left out.
    @Test func plansSayOneShortLineThatCanBeAcknowledged() {
        var check = DeadlineCheck(transport: .iid, enforcedAt: Self.day("2027-01-10"), now: Self.day("2027-01-10"))
        let short = check.diagnostics(groups: 2)
        #expect(short.count == 2 && short.allSatisfy { $0.severity == .warning && $0.message.count < 260 })
        #expect(short[0].message.hasPrefix("FCM ends device groups on 29 September 2027, and this project manages 2;"))
        #expect(short[1].message.contains("iid transport") && short[1].message.contains("29 September 2027"))
        check.acknowledged = ["device_groups": Self.day("2027-03-01")]
        #expect(check.diagnostics(groups: 2).map(\.code) == ["deadline.iid_transport"])
        let full = check.diagnostics(groups: 2, full: true)
        #expect(full[0].message.contains("Acknowledged in tidemark.yaml until 1 March 2027"))
        #expect(full[0].message.contains("groups export"))
        // The acknowledgement runs out on its day.
        check.now = Self.day("2027-03-01")
        #expect(check.diagnostics(groups: 2).count == 2)
        // Past the turn-down the error is said whatever was acknowledged.
        var late = DeadlineCheck(transport: .v1, enforcedAt: Self.day("2027-10-01"), now: Self.day("2027-10-01"))
        late.acknowledged = ["device_groups": Self.day("2027-09-29")]
        #expect(late.diagnostics(groups: 1).first?.severity == .error)
    }

    @Test func iidWordingFollowsTheDate() {
        func check(_ date: String) -> [Diagnostic] {
            DeadlineCheck(transport: .iid, enforcedAt: Self.day(date), now: Self.day(date)).diagnostics(
                groups: 0, full: true)
        }
        let before = check("2026-09-01")
        #expect(before.count == 1 && before[0].severity == .warning)
        #expect(before[0].message.contains("closed to new projects from 1 October 2026"))
        #expect(before[0].message.contains("'tidemark plan --transport v1 --refresh all'"))
        #expect(check("2026-11-22")[0].message.contains("closed to new projects since 1 October 2026"))
        let after = check("2027-10-01")
        #expect(after[0].severity == .error && after[0].code == "deadline.iid_transport")
        #expect(after[0].message.contains("set 'transport: v1' in tidemark.yaml"))
        #expect(
            DeadlineCheck(transport: .v1, enforcedAt: Self.day("2028-01-01"), now: Self.day("2028-01-01")).diagnostics(
                groups: 0
            ).isEmpty)
    }

    /// Through the workflows: a plan before the deadline carries the warning once; after it, plan and
    /// drift stop with the error, and nothing is asked of FCM.
    @Test func workflowsWarnOnceThenStopBeforeFCM() async throws {
        var project = try WorkflowTests.Project()
        var parts = project.parts
        parts.deadlines = DeadlineCheck(transport: .v1, enforcedAt: Self.day("2027-03-01"), now: Self.day("2027-03-01"))
        let outcome = try await PlanWorkflow(parts).run(PlanRequest())
        let warnings = outcome.plan.diagnostics.filter { $0.code == "deadline.device_groups" }
        #expect(warnings.count == 1 && warnings[0].severity == .warning)
        _ = try await ApplyWorkflow(parts).run(ApplyRequest())
        let drift = try await DriftWorkflow(parts).run()
        #expect(drift.warnings?.filter { $0.code == "deadline.device_groups" }.count == 1)

        parts.deadlines = DeadlineCheck(transport: .v1, enforcedAt: Self.day("2027-10-01"), now: Self.day("2027-10-01"))
        let callsBefore = project.backend.calls.count
        await #expect(throws: WorkflowError.self) { try await PlanWorkflow(parts).run(PlanRequest()) }
        await #expect(throws: WorkflowError.self) { try await DriftWorkflow(parts).run() }
        await #expect(throws: WorkflowError.self) { try await ApplyWorkflow(parts).run(ApplyRequest()) }
        #expect(project.backend.calls.count == callsBefore, "nothing was sent to FCM past the deadline")
        // With the groups gone from the manifests, the one state remembers is not planned (deleting it
        // would call the API that is gone): a warning, and the plan goes on.
        project.files["topics.yaml"] = """
            topics:
              - name: team-zero
                members: [{selector: {team: t0}}]
              - name: everyone
                mode: authoritative
                members: [{selector: {team: [t0, t1]}}]
            """
        parts.manifests = Fixtures.manifests(project.files)
        let after = try await PlanWorkflow(parts).run(PlanRequest())
        #expect(!after.plan.operations.contains { $0.kind.isGroup })
        #expect(after.plan.diagnostics.contains { $0.code == "deadline.device_groups" && $0.severity == .warning })
        // A project without groups meets no deadline.
        let plain = try WorkflowTests.Project(
            topics: "topics:\n  - name: team-zero\n    members: [{selector: {team: t0}}]\n")
        var plainParts = plain.parts
        plainParts.deadlines = parts.deadlines
        #expect(try await PlanWorkflow(plainParts).run(PlanRequest()).plan.diagnostics.allSatisfy { $0.code == nil })
    }
}

/// Device groups converted to audiences: one step that deletes nothing in FCM until the manifests say
/// `retire_group_key: true`; after FCM's turn-down the group is only forgotten. Every member stays.
@Suite struct AudienceDifferTests {
    static func tokens(_ n: Int) -> [String] { (0..<n).map { Fixtures.token($0) } }

    /// A state with device group "family" (key k1, members 0–2), and `desired` whose audiences are given.
    static func setUp(audiences: [DesiredGroup]) -> (State, DesiredState) {
        var state = State(lineage: "l", serial: 1)
        for token in tokens(30) { state.intern(token) }
        state.setGroup("family", GroupState(key: "k1", members: TokenSet([0, 1, 2])))
        let desired = DesiredState(
            topics: [], groups: [], audiences: audiences, knownTokens: TokenSet(0..<30))
        return (state, desired)
    }

    static func applied(_ ops: [PlannedOperation], to state: State) -> State {
        var next = state
        for op in ops { next.recordOutcome(op, outcomes: op.tokens.map { _ in .ok }, groupKey: nil) }
        return next
    }

    @Test func convertingKeepsTheGroupUntilRetired() throws {
        let members = TokenSet([0, 1, 2])
        var (state, desired) = Self.setUp(audiences: [DesiredGroup(name: "family", members: members)])
        var result = Differ().diff(desired: desired, state: state)
        #expect(result.operations.map(\.kind) == [.audienceSet], "one step, and nothing sent to FCM")
        #expect(result.groups.map(\.action) == [.convert] && result.groups[0].audience == true)
        #expect(result.groups[0].notes.joined().contains("nothing is deleted in FCM"))
        state = Self.applied(result.operations, to: state)
        #expect(state.groups["family"] == GroupState(key: "k1", members: members, audience: true))
        #expect(Differ().diff(desired: desired, state: state).operations.isEmpty, "converged")

        // Kept in step while the key lives: a new member is added to the FCM group too.
        desired.audiences[0].members = TokenSet([0, 1, 2, 3])
        result = Differ().diff(desired: desired, state: state)
        #expect(result.operations.map(\.kind) == [.groupAdd, .audienceSet])
        #expect(result.operations[0].tokens == [Fixtures.token(3)])
        state = Self.applied(result.operations, to: state)
        // More than 20 members while the FCM group is kept: refused, with the way out.
        desired.audiences[0].members = TokenSet(0..<25)
        let tooMany = Differ().diff(desired: desired, state: state)
        #expect(tooMany.diagnostics.contains { $0.severity == .error && $0.message.contains("retire_group_key") })

        // Retired: the FCM group is emptied (deleted), and the audience keeps every member.
        desired.audiences[0].retireGroupKey = true
        result = Differ().diff(desired: desired, state: state)
        #expect(result.operations.map(\.kind) == [.groupRemove, .audienceSet])
        #expect(Set(result.operations[0].tokens) == Set((0..<4).map { Fixtures.token($0) }))
        #expect(result.groups.map(\.action) == [.retire])
        state = Self.applied(result.operations, to: state)
        #expect(state.groups["family"] == GroupState(key: nil, members: TokenSet(0..<25), audience: true))
        #expect(Differ().diff(desired: desired, state: state).operations.isEmpty)
        // An audience with no FCM group never needs a call.
        desired.audiences[0].members = TokenSet([5])
        #expect(Differ().diff(desired: desired, state: state).operations.map(\.kind) == [.audienceSet])
    }

    @Test func afterTheTurnDownTheGroupIsOnlyForgotten() {
        var (state, desired) = Self.setUp(audiences: [DesiredGroup(name: "family", members: TokenSet([0, 1, 2, 4]))])
        desired.audiences[0].retireGroupKey = true
        let result = Differ(groupsTurnedDown: true).diff(desired: desired, state: state)
        #expect(result.operations.allSatisfy { $0.kind.isStateOnly }, "no call to an API that is gone")
        #expect(result.operations.map(\.kind) == [.audienceSet, .audienceUnlink])
        state = Self.applied(result.operations, to: state)
        #expect(state.groups["family"] == GroupState(key: nil, members: TokenSet([0, 1, 2, 4]), audience: true))
    }

    @Test func aNewAudienceAndAForgottenOne() {
        var (state, desired) = Self.setUp(audiences: [DesiredGroup(name: "beta", members: TokenSet([7, 8]))])
        state.setGroup("family", nil)
        var result = Differ().diff(desired: desired, state: state)
        #expect(
            result.operations == [
                PlannedOperation(kind: .audienceSet, target: "beta", tokens: [Fixtures.token(7), Fixtures.token(8)])
            ])
        #expect(result.groups.map(\.action) == [.create])
        state = Self.applied(result.operations, to: state)
        // Dead tokens are not members anyone can reach.
        state.setDead(TokenSet([8]))
        result = Differ().diff(desired: desired, state: state)
        #expect(result.groups.first?.add == 0 && result.groups.first?.remove == 1)
        desired.audiences = []
        result = Differ().diff(desired: desired, state: state)
        #expect(result.operations.map(\.kind) == [.audienceDelete])
        #expect(Self.applied(result.operations, to: state).groups["beta"] == nil)
        // A converted group declared as a device group again is refused, not silently re-made.
        var back = desired
        back.groups = [DesiredGroup(name: "beta", members: TokenSet([7]))]
        #expect(Differ().diff(desired: back, state: state).diagnostics.contains { $0.severity == .error })
    }
}
