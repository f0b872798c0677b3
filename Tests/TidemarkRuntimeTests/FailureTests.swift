import Foundation
import Testing
import TidemarkCore
import TidemarkFCM
import TidemarkRuntime

/// Every front end words a failure the same way: one `error: ` line a person can act on, and a stable
/// reason `serve` shows and an alert can match.
@Suite struct FailureTests {
    @Test func tidemarksOwnErrorsKeepTheirWordsAndNameTheirReason() {
        let locked = Failure(StateStoreError(.locked, path: "state.db", "pid 42 on ci-7"))
        #expect(locked.reason == "state_locked")
        #expect(
            locked.lines == [
                "error: the state state.db is locked by pid 42 on ci-7. Wait for that run to finish; the lock is released when its process ends."
            ])

        let stale = Failure(
            WorkflowError.stalePlan(
                StalePlan(file: "plan.json", stateLocation: "state.db", reason: .serialMoved(plan: 3, state: 4))))
        #expect(stale.reason == "stale_plan")
        #expect(
            stale.message
                == "error: plan.json is stale: the state moved from serial 3 (when planned) to 4. Make a new plan.")

        #expect(Failure(WorkflowError.unfinishedApply).reason == "unfinished_apply")
        #expect(Failure(CredentialError("no key")).reason == "credentials")
        #expect(Failure(RuntimeError("FCM_EMULATOR_HOST is empty.")).message == "error: FCM_EMULATOR_HOST is empty.")
    }

    @Test func aWorkflowErrorMatchesItsKindAsAnEnumCaseWould() {
        let error: any Error = WorkflowError.noState(location: "state.db")
        #expect(WorkflowError.noState(location: "elsewhere") ~= error)
        #expect(!(WorkflowError.unfinishedApply ~= error))
        #expect((error as? WorkflowError)?.stalePlan == nil)
        #expect(WorkflowError.invalidManifests(errorCount: 2).errorCount == 2)
    }

    @Test func diagnosticsAreShownAsTheyAreAndTheManifestCountIsNotPrefixedTwice() {
        let location = SourceLocation(file: "topics.yaml", line: 4, column: 3)
        let failure = Failure(DiagnosticsError([.error("unknown key 'subscribe'", at: location)]))
        #expect(failure.reason == "invalid_input")
        #expect(failure.lines.count == 1 && failure.lines[0].hasPrefix("topics.yaml:4:3"))
        #expect(
            Failure(WorkflowError.invalidManifests(errorCount: 1)).message
                == "1 error found; nothing was planned or changed.")
    }

    @Test func anErrorTidemarkDidNotThrowIsUnexpectedAndNeverADump() {
        struct SingleConnectionFailure: Error { var target: String }
        let failure = Failure(SingleConnectionFailure(target: "db:5432"))
        #expect(failure.reason == "unexpected")
        #expect(failure.message.hasPrefix("error: "))
        #expect(!failure.message.contains("target:"))
        #expect(Failure(CocoaError(.fileReadNoSuchFile)).reason == "unexpected")
    }

    @Test func theFirstWordIsLowerCasedUnlessItIsAName() {
        #expect(Failure.line("Cannot read x") == "error: cannot read x")
        #expect(Failure.line("FCM_EMULATOR_HOST is empty") == "error: FCM_EMULATOR_HOST is empty")
        #expect(Failure.line("HTTP 502 from x") == "error: HTTP 502 from x")
        #expect(Failure.line("error: said already") == "error: said already")
    }
}
