import CZlib
import Foundation

/// Why compressed input could not be read.
public struct GzipError: TidemarkError, Equatable {
    /// `invalid_gzip`.
    public var reason: FailureReason { "invalid_gzip" }

    /// The reason, as a sentence naming the setting to raise when a limit was hit.
    public var description: String
}

/// gzip (`.csv.gz`, `.jsonl.gz`) through the system zlib: whole members, concatenated members too
/// (as `cat a.gz b.gz` makes), with a bound on what it inflates to, so that a small file cannot
/// expand into all of memory.
public enum Gzip {
    /// Whether `data` starts with gzip's magic bytes.
    public static func isCompressed(_ data: Data) -> Bool {
        data.count >= 2 && data[data.startIndex] == 0x1f && data[data.startIndex + 1] == 0x8b
    }

    /// How many times its compressed size an input may inflate to (past a floor of `ratioFloor`). An
    /// inventory of registration tokens compresses two to four times, one of repeated labels perhaps
    /// twenty; a gzip bomb a thousand. Checked as the data streams, before it is kept.
    public static let maxRatio = 200
    /// The inflated size below which the ratio is not checked (64 MiB).
    public static let ratioFloor = 64 << 20

    /// The inflated bytes; more than `limit`, or more than `maxRatio` times the compressed size, is
    /// refused (`setting` names the limit in tidemark.yaml).
    public static func decompress(_ data: Data, atMost limit: Int, setting: String? = nil) throws(GzipError) -> Data {
        var stream = z_stream()
        // 15 + 16: a gzip wrapper only (zlib or raw deflate are not what a .gz file holds).
        guard inflateInit2_(&stream, 15 + 16, zlibVersion(), Int32(MemoryLayout<z_stream>.size)) == Z_OK else {
            throw GzipError(description: "zlib could not start")
        }
        defer { inflateEnd(&stream) }
        var output = Data()
        output.reserveCapacity(min(limit, max(data.count * 4, 1 << 16)))
        let (ratioLimit, overflow) = data.count.multipliedReportingOverflow(by: maxRatio)
        let plausible = max(ratioFloor, overflow ? .max : ratioLimit)
        let chunk = 1 << 18
        var buffer = [UInt8](repeating: 0, count: chunk)
        var problem: String?
        data.withUnsafeBytes { (input: UnsafeRawBufferPointer) in
            guard let base = input.bindMemory(to: UInt8.self).baseAddress else {
                problem = "the file is empty, not gzip"
                return
            }
            stream.next_in = UnsafeMutablePointer(mutating: base)
            stream.avail_in = UInt32(input.count)
            while true {
                let status = buffer.withUnsafeMutableBufferPointer { out -> Int32 in
                    stream.next_out = out.baseAddress
                    stream.avail_out = UInt32(chunk)
                    return inflate(&stream, Z_NO_FLUSH)
                }
                let produced = chunk - Int(stream.avail_out)
                if output.count + produced > limit {
                    problem =
                        "it inflates to more than \(limit) bytes\(setting.map { " (limits.\($0) in tidemark.yaml)" } ?? "")"
                    return
                }
                if output.count + produced > plausible {
                    problem =
                        "it inflates to more than \(maxRatio) times its compressed size (\(data.count) bytes), which no inventory does: it is not an export, or it is a gzip bomb"
                    return
                }
                output.append(contentsOf: buffer[0..<produced])
                switch status {
                case Z_OK: continue
                case Z_STREAM_END:
                    // Another member may follow (concatenated .gz files); trailing zero padding is allowed.
                    if stream.avail_in == 0 { return }
                    let rest = UnsafeBufferPointer(start: stream.next_in, count: Int(stream.avail_in))
                    if rest.allSatisfy({ $0 == 0 }) { return }
                    guard inflateReset(&stream) == Z_OK else {
                        problem = "zlib could not read the next gzip member"
                        return
                    }
                case Z_BUF_ERROR where stream.avail_in == 0:
                    problem = "the gzip data is truncated (the file ends inside the compressed stream)"
                    return
                default:
                    let message = stream.msg.map { String(cString: $0) } ?? "error \(status)"
                    problem = "it is not valid gzip data (\(message))"
                    return
                }
            }
        }
        if let problem { throw GzipError(description: problem) }
        return output
    }
}

extension Gzip {
    /// `data` as one gzip member (for tests, benchmarks and fixtures).
    public static func compress(_ data: Data, level: Int32 = 6) -> Data {
        var stream = z_stream()
        // 8 = deflate, 15 + 16 = gzip wrapper, memLevel 8, default strategy.
        guard
            deflateInit2_(
                &stream, level, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY, zlibVersion(),
                Int32(MemoryLayout<z_stream>.size)) == Z_OK
        else { preconditionFailure("zlib could not start") }
        defer { deflateEnd(&stream) }
        var output = Data()
        let chunk = 1 << 16
        var buffer = [UInt8](repeating: 0, count: chunk)
        var input = [UInt8](data)
        input.withUnsafeMutableBufferPointer { inputBuffer in
            stream.next_in = inputBuffer.baseAddress
            stream.avail_in = UInt32(inputBuffer.count)
            var status = Z_OK
            while status != Z_STREAM_END {
                status = buffer.withUnsafeMutableBufferPointer { out -> Int32 in
                    stream.next_out = out.baseAddress
                    stream.avail_out = UInt32(chunk)
                    return deflate(&stream, Z_FINISH)
                }
                output.append(contentsOf: buffer[0..<(chunk - Int(stream.avail_out))])
                precondition(status == Z_OK || status == Z_STREAM_END || status == Z_BUF_ERROR, "deflate failed")
            }
        }
        return output
    }
}
