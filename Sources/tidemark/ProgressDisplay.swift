import Foundation
import Synchronization
import TidemarkCore

/// What a person sees of long work: for every phase that lasts over half a second, a line redrawn on
/// a terminal (at least once a second, even while no batch finishes) or, off a terminal, a plain line
/// once it has lasted a second and then every five. Rates and ETAs are measured over the last ten
/// seconds, and shown only once a second of work has been seen, never from the first batch alone.
final class ProgressDisplay: Sendable {
    private struct Current {
        var phase: WorkPhase
        var started: Duration
        var done = 0
        var total: Int?
        /// (time, done) samples of the last `window`, oldest first.
        var samples: [(Duration, Int)] = []
        /// When a plain line was last printed (off a terminal).
        var printed: Duration?
        /// Whether a redrawn line is on the terminal now.
        var drawn = false
        /// Whether the last counts were printed, so the end adds no line.
        var finalShown = false
    }

    /// Back to the start of the line, and the line cleared.
    private static let wipe = "\r\u{1B}[K"

    let interactive: Bool
    private let timing: Timing
    private let write: @Sendable (String) -> Void
    private let current = Mutex<Current?>(nil)
    private let window: Duration = .seconds(10)

    /// A display writing to `write` (standard error), redrawn when `interactive`.
    init(
        interactive: Bool = Terminal.stderrIsTerminal, timing: Timing = .live,
        write: @escaping @Sendable (String) -> Void = { FileHandle.standardError.write(Data($0.utf8)) }
    ) {
        self.interactive = interactive
        self.timing = timing
        self.write = write
    }

    /// Work named `phase` began.
    func start(_ phase: WorkPhase) {
        let now = timing.now()
        let erase = current.withLock { current -> Bool in
            let drawn = current?.drawn ?? false
            current = Current(phase: phase, started: now, samples: [(now, 0)])
            return drawn
        }
        if erase { write(Self.wipe) }
    }

    /// `done` of `total` units of the current phase are done.
    func update(done: Int, total: Int) {
        let now = timing.now()
        let text = current.withLock { current -> String? in
            guard var phase = current else { return nil }
            // The first count is the baseline (a resumed apply starts part-way): rates count from it.
            if phase.total == nil { phase.samples = [(now, done)] }
            phase.done = done
            phase.total = total
            record(&phase, now)
            defer { current = phase }
            // The last counts of a large job are worth a line of their own, as the work's receipt.
            guard done == total, total >= 5_000 || phase.printed != nil || phase.drawn else { return nil }
            phase.finalShown = true
            phase.drawn = false
            return render(phase, now, final: true) + "\n"
        }
        if let text { write(interactive ? Self.wipe + text : text) }
    }

    /// The phase ended: a line still drawn is wiped.
    func end(_ phase: WorkPhase) {
        let erase = current.withLock { current -> Bool in
            guard current?.phase == phase else { return false }
            defer { current = nil }
            return current?.drawn ?? false
        }
        if erase { write(Self.wipe) }
    }

    /// Before a notice: a drawn line is wiped (and redrawn at the next tick), so the notice starts a line.
    func clearForNotice() {
        let erase = current.withLock { current -> Bool in
            guard current?.drawn == true else { return false }
            current?.drawn = false
            return true
        }
        if erase { write(Self.wipe) }
    }

    /// Draws or prints the current phase if it is due.
    func tick() {
        let now = timing.now()
        let text = current.withLock { current -> String? in
            guard var phase = current, !phase.finalShown else { return nil }
            defer { current = phase }
            record(&phase, now)
            let elapsed = now - phase.started
            if interactive {
                guard elapsed >= .milliseconds(500) else { return nil }
                phase.drawn = true
                return Self.wipe + bar(phase) + render(phase, now, final: false)
            }
            guard elapsed >= .seconds(1), phase.printed.map({ now - $0 >= .seconds(5) }) ?? true else { return nil }
            phase.printed = now
            return render(phase, now, final: false) + "\n"
        }
        if let text { write(text) }
    }

    /// Runs `tick` every quarter of a second until cancelled.
    func ticking() async {
        while !Task.isCancelled {
            try? await Task.sleep(for: .milliseconds(250))
            tick()
        }
    }

    private func record(_ phase: inout Current, _ now: Duration) {
        if let last = phase.samples.last, last.1 == phase.done, now - last.0 < .milliseconds(250) { return }
        phase.samples.append((now, phase.done))
        while phase.samples.count > 2, let first = phase.samples.first, now - first.0 > window {
            phase.samples.removeFirst()
        }
    }

    private func bar(_ phase: Current) -> String {
        guard let total = phase.total, total > 0 else { return "" }
        let width = 24
        let filled = min(width, width * phase.done / total)
        return String(repeating: "█", count: filled) + String(repeating: "░", count: width - filled) + " "
    }

    /// `Applying: 1,204/11,085 tokens (10%), 2,950/s, ETA 4s`, or `Planning… 3 s` when nothing is counted.
    private func render(_ phase: Current, _ now: Duration, final: Bool) -> String {
        let elapsed = Timing.seconds(now - phase.started)
        guard let total = phase.total else { return "\(phase.phase.label)… \(Int(elapsed)) s" }
        let unit = phase.phase == .applying ? "tokens" : "registrations"
        let percent = total == 0 ? 100 : Int(Double(phase.done) * 100 / Double(total))
        var text =
            "\(phase.phase.label): \(PlanRenderer.formatCount(phase.done))/\(PlanRenderer.formatCount(total)) \(unit) (\(percent)%)"
        let rate: Double?
        if final {
            rate = Double(phase.done) / max(0.001, elapsed)
        } else if let first = phase.samples.first, now - first.0 >= .seconds(1) {
            rate = Double(phase.done - first.1) / Timing.seconds(now - first.0)
        } else {
            rate = nil
        }
        guard let rate else { return text + ", measuring the rate…" }
        guard final || rate > 0 else { return text + ", waiting for answers (\(Int(elapsed)) s so far)" }
        text += ", \(PlanRenderer.formatCount(Int(rate.rounded())))/s"
        if final { return text + ", ETA 0s" }
        return text + ", ETA \(Int((Double(total - phase.done) / rate).rounded()))s"
    }
}
