import Foundation

/// The process's own figures, in the names every Prometheus client library gives them
/// (`process_cpu_seconds_total`, `process_resident_memory_bytes`, `process_virtual_memory_bytes`,
/// `process_open_fds`, `process_max_fds`, `process_start_time_seconds`), read from `/proc` at each
/// scrape. On a system without `/proc` (macOS) the families are left out rather than exported as 0.
public struct ProcessMetrics: Sendable {
    /// Where `/proc` is (a test points it at a copy).
    public var proc: String
    /// The page size, for the resident set's pages.
    var pageSize: Int
    /// Clock ticks a second, for CPU times and the start time.
    var ticksPerSecond: Double

    /// The figures of the process that calls it, from `proc` (`/proc/self` by default).
    public init(proc: String = "/proc") {
        self.proc = proc
        pageSize = Int(sysconf(Int32(_SC_PAGESIZE)))
        ticksPerSecond = Double(sysconf(Int32(_SC_CLK_TCK)))
    }

    /// The families in Prometheus's text format; empty when `/proc` cannot be read.
    public func exposition() -> String {
        guard let stat = try? String(contentsOfFile: proc + "/self/stat", encoding: .utf8),
            let fields = Self.statFields(stat), fields.count > 21
        else { return "" }
        // Fields after the command, numbered from 3 as in proc(5): utime 14, stime 15, starttime 22,
        // vsize 23, rss 24.
        func field(_ number: Int) -> Double { Double(fields[number - 3]) ?? 0 }
        var text = ""
        func family(_ name: String, _ type: String, _ help: String, _ value: Double) {
            text += "# HELP \(name) \(help)\n# TYPE \(name) \(type)\n\(name) \(Self.format(value))\n"
        }
        family(
            "process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.",
            (field(14) + field(15)) / ticksPerSecond)
        family(
            "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.",
            field(24) * Double(pageSize))
        family("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.", field(23))
        if let boot = bootTime() {
            family(
                "process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds.",
                boot + field(22) / ticksPerSecond)
        }
        if let open = try? FileManager.default.contentsOfDirectory(atPath: proc + "/self/fd") {
            family("process_open_fds", "gauge", "Number of open file descriptors.", Double(open.count))
        }
        if let max = maxOpenFiles() {
            family("process_max_fds", "gauge", "Maximum number of open file descriptors.", max)
        }
        return text
    }

    /// The fields of `/proc/self/stat` after the command (which may hold spaces and parentheses: it
    /// ends at the last `)`).
    public static func statFields(_ stat: String) -> [Substring]? {
        guard let close = stat.lastIndex(of: ")") else { return nil }
        return stat[stat.index(after: close)...].split(separator: " ", omittingEmptySubsequences: true)
    }

    /// When the system booted, in seconds since 1970 (`btime` of `/proc/stat`).
    func bootTime() -> Double? {
        guard let text = try? String(contentsOfFile: proc + "/stat", encoding: .utf8) else { return nil }
        for line in text.split(separator: "\n") where line.hasPrefix("btime ") {
            return Double(line.dropFirst(6).trimmingCharacters(in: .whitespaces))
        }
        return nil
    }

    /// The soft limit of open files (`Max open files` of `/proc/self/limits`).
    func maxOpenFiles() -> Double? {
        guard let text = try? String(contentsOfFile: proc + "/self/limits", encoding: .utf8) else { return nil }
        for line in text.split(separator: "\n") where line.hasPrefix("Max open files") {
            let words = line.dropFirst("Max open files".count).split(separator: " ")
            return words.first.flatMap { Double($0) }
        }
        return nil
    }

    /// A value as Prometheus reads it: integers without a fraction.
    static func format(_ value: Double) -> String {
        value == value.rounded() && abs(value) < 1e15 ? String(Int64(value)) : String(value)
    }
}
