import Testing
import TidemarkCore
import TidemarkTesting

/// A wait is never silent, and never a flood: retries are said once they last a few seconds, then at
/// most every ten seconds however many calls retry, and the return of answers is said once.
@Suite struct RetryNarratorTests {
    func notice(attempt: Int, waited: Double, nextIn: Double) -> RetryNotice {
        RetryNotice(
            call: "GET http://127.0.0.1:9/v1/x", cause: "HTTP 503 (UNAVAILABLE)", attempt: attempt, nextIn: nextIn,
            waited: waited, budget: 300, setting: "FCM_EMULATOR_HOST (now http://127.0.0.1:9)")
    }

    func retries(_ output: RecordingOutput) -> [RetryNotice] {
        output.events.compactMap { if case .retrying(let notice) = $0 { notice } else { nil } }
    }

    func recoveries(_ output: RecordingOutput) -> [Double] {
        output.events.compactMap { if case .answeringAgain(let seconds) = $0 { seconds } else { nil } }
    }

    @Test func shortRetriesSayNothing() {
        let clock = ManualClock()
        let output = RecordingOutput()
        let narrator = RetryNarrator(output: output, timing: clock.timing)
        narrator.retrying(notice(attempt: 1, waited: 0, nextIn: 0.5))
        clock.advance(.milliseconds(500))
        narrator.retrying(notice(attempt: 2, waited: 0.5, nextIn: 1))
        clock.advance(.seconds(1))
        narrator.answered(attempt: 3)
        #expect(output.events.isEmpty)
    }

    @Test func aLongRetryIsSaidThenAtMostEveryTenSecondsAndItsEndOnce() {
        let clock = ManualClock()
        let output = RecordingOutput()
        let narrator = RetryNarrator(output: output, timing: clock.timing)
        var waited = 0.0
        // 40 calls retrying together, each second, for 25 s.
        for second in 0..<25 {
            for call in 0..<40 {
                narrator.retrying(notice(attempt: second + 1, waited: waited, nextIn: 1))
                if second == 0 && call == 0 { #expect(output.events.isEmpty, "a 1 s wait is not worth a line") }
            }
            clock.advance(.seconds(1))
            waited += 1
        }
        let said = retries(output)
        // At 2 s (2 + 1 ≥ 3), 12 s and 22 s.
        #expect(said.count == 3, "\(said.map(\.attempt))")
        #expect(said.first?.attempt == 3)
        #expect(said.first?.othersRetried == 80, "the 80 retries before it, not said one by one")
        #expect(said.dropFirst().allSatisfy { $0.othersRetried == 399 })
        narrator.answered(attempt: 1)
        #expect(recoveries(output).isEmpty, "a first attempt says nothing of retries")
        narrator.answered(attempt: 26)
        narrator.answered(attempt: 26)
        #expect(recoveries(output) == [25], "once, 25 s after the retries began")
    }

    @Test func underSteadyFaultsRetriesAndRecoveriesAlternateNoFasterThanTheInterval() {
        let clock = ManualClock()
        let output = RecordingOutput()
        let narrator = RetryNarrator(output: output, timing: clock.timing)
        for _ in 0..<60 {
            narrator.retrying(notice(attempt: 3, waited: 2, nextIn: 2))
            narrator.answered(attempt: 3)
            clock.advance(.seconds(1))
        }
        #expect(retries(output).count == 6)
        #expect(recoveries(output).count == 6)
    }
}
