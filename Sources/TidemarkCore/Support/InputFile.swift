import Foundation

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// What tidemark reads at most, so that no input can cost unbounded memory. The defaults sit well
/// above the design scale (1,000,000 devices: a 183 MB inventory, a first plan of about 1 GB of
/// JSON); `limits:` in tidemark.yaml raises or lowers them.
public struct InputLimits: Sendable, Equatable {
    /// Bytes of one manifest file (`limits.manifest_bytes`): 16 MiB, about 370,000 member entries. A
    /// manifest is read whole into a YAML tree (about 1 KB of memory per entry), so the bound holds
    /// before that memory is taken; fleets belong in the inventory, and a generated manifest larger
    /// than this raises the limit.
    public var manifestBytes = 16 << 20
    /// Bytes of one inventory file (`limits.inventory_bytes`).
    public var inventoryBytes = 8 << 30
    /// Bytes of a saved plan file (`limits.plan_bytes`).
    public var planBytes = 8 << 30
    /// Devices in the whole inventory (`limits.devices`).
    public var devices = 50_000_000
    /// Operations in a saved plan (`limits.plan_operations`), counted before the plan is decoded. A
    /// plan tidemark makes has one per 1,000 changes of a topic and one per group call: 200 topics of
    /// a million devices are at most 200,000.
    public var planOperations = 1_000_000
    /// Bytes of one token file a manifest names (`limits.token_file_bytes`): about 400,000 tokens by
    /// default. Fleets belong in the inventory; token files list test devices and small cohorts.
    public var tokenFileBytes = 64 << 20

    /// The default limits.
    public init() {}

    /// The settings of `limits:`, by key.
    public static let keys = [
        "manifest_bytes", "inventory_bytes", "plan_bytes", "devices", "token_file_bytes", "plan_operations",
    ]

    /// Parses a size such as `512MiB`, `2GiB`, `300MB` or `1000000`.
    public static func bytes(_ text: String) -> Int? {
        let units: [(String, Int)] = [
            ("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30), ("TiB", 1 << 40), ("KB", 1000),
            ("MB", 1_000_000), ("GB", 1_000_000_000), ("TB", 1_000_000_000_000), ("B", 1),
        ]
        let trimmed = text.trimmingCharacters(in: .whitespaces)
        for (suffix, factor) in units where trimmed.hasSuffix(suffix) {
            guard let number = Double(trimmed.dropLast(suffix.count).trimmingCharacters(in: .whitespaces)),
                number > 0, number * Double(factor) < Double(Int.max / 2)
            else { return nil }
            return Int(number * Double(factor))
        }
        guard let number = Int(trimmed), number > 0 else { return nil }
        return number
    }
}

/// Why a file could not be read, in words a person can act on (never a Foundation error dump).
public struct InputFileError: TidemarkError, Equatable {
    /// What kind of problem it is, for callers that act on it (a missing file may be optional).
    public enum Kind: Sendable, Equatable {
        case notFound, isDirectory, notRegular, permissionDenied, tooLarge, outsideProject, io
        /// Not UTF-8 text: another encoding, an archive, a compressed or a binary file.
        case notText
    }

    /// What kind of problem it is.
    public var kind: Kind
    /// What is wrong, without the path (callers name the file).
    public var problem: String

    /// `input_not_found`, `input_too_large`, `input_outside_project`…
    public var reason: FailureReason {
        switch kind {
        case .notFound: "input_not_found"
        case .isDirectory: "input_is_directory"
        case .notRegular: "input_not_regular"
        case .permissionDenied: "input_permission_denied"
        case .tooLarge: "input_too_large"
        case .outsideProject: "input_outside_project"
        case .io: "input_unreadable"
        case .notText: "input_not_text"
        }
    }

    /// The problem, without the path.
    public var description: String { problem }
}

/// Reads whole files with the checks every input needs: it exists, is a regular file (a FIFO would
/// block forever), is readable, and is no larger than a limit.
package enum InputFile {
    /// The bytes of `path`; `setting` names the limit in tidemark.yaml, for the message. With `within`,
    /// the file must be inside one of those directories (real paths, symlinks resolved) once opened: the
    /// check is made on the file actually opened, so no symlink swapped in between can lead elsewhere.
    package static func read(
        _ path: String, atMost limit: Int, setting: String? = nil, within roots: Confinement? = nil
    ) throws(InputFileError) -> Data {
        // O_NONBLOCK: opening a FIFO with no writer must not hang; it is refused below.
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK)
        guard fd >= 0 else { throw openError(errno) }
        defer { close(fd) }
        if let roots {
            let real = openedPath(fd) ?? realPath(path) ?? path
            guard roots.contains(real) else {
                throw InputFileError(
                    kind: .outsideProject,
                    problem:
                        "it is outside \(roots.description)\(real == path ? "" : " (it leads to \(real))"); tidemark reads manifests, token files and inventories only from inside the project, so that no change to them can make it read other files on the machine"
                )
            }
        }
        var info = stat()
        guard fstat(fd, &info) == 0 else { throw InputFileError(kind: .io, problem: String(cString: strerror(errno))) }
        switch info.st_mode & S_IFMT {
        case S_IFREG: break
        case S_IFDIR: throw InputFileError(kind: .isDirectory, problem: "it is a directory, not a file")
        default:
            throw InputFileError(
                kind: .notRegular, problem: "it is not a regular file (a FIFO, socket or device); tidemark reads files")
        }
        let size = Int(info.st_size)
        guard size <= limit else { throw tooLarge(size, limit, setting) }
        var data = size >= largeFile ? largeBuffer(size) : Data(count: size)
        var offset = 0
        let failure: Int32? = data.withUnsafeMutableBytes { buffer -> Int32? in
            while offset < size {
                let n = Glibc.read(fd, buffer.baseAddress! + offset, size - offset)
                if n < 0 {
                    if errno == EINTR || errno == EAGAIN { continue }
                    return errno
                }
                if n == 0 { break }  // shrank while read
                offset += n
            }
            return nil
        }
        if let failure { throw InputFileError(kind: .io, problem: String(cString: strerror(failure))) }
        data.count = offset
        return data
    }

    /// The directories files may be read from: the project's, and the manifests directory when the
    /// command line puts it elsewhere. Held as real paths (symlinks resolved).
    package struct Confinement: Sendable, CustomStringConvertible {
        /// The allowed directories, as real paths.
        package let roots: [String]
        /// How the project directory is named in messages.
        package let display: String

        /// `directories` as they are on disk; one that does not exist (yet) is kept as given.
        package init(_ directories: [String], display: String) {
            var roots: [String] = []
            for directory in directories.map({ InputFile.realPath($0) ?? $0 }) where !roots.contains(directory) {
                // A directory inside one already allowed adds nothing.
                if !roots.contains(where: { directory.hasPrefix($0 + "/") }) { roots.append(directory) }
            }
            self.roots = roots
            self.display = display
        }

        /// Whether the real path `real` is inside one of the roots.
        package func contains(_ real: String) -> Bool {
            roots.contains { root in real == root || real.hasPrefix(root == "/" ? "/" : root + "/") }
        }

        /// How messages name the allowed directories.
        package var description: String {
            "the project directory \(display)" + (roots.count > 1 ? " and the manifests directory" : "")
        }
    }

    /// Why `data` is not the UTF-8 text an inventory or token file holds, naming what it is instead
    /// (another encoding, an archive, a compressed or a binary file), or nil. `decompressed`: `data`
    /// came out of gzip already. Looks at the first 64 KiB only: a file that starts as text is read as
    /// text, and its rows say what is wrong further on.
    package static func notTextProblem(_ data: Data, decompressed: Bool = false) -> InputFileError? {
        let head = [UInt8](data.prefix(64 << 10))
        func starts(_ magic: [UInt8]) -> Bool { head.starts(with: magic) }
        let problem: String? =
            if starts([0xFF, 0xFE, 0, 0]) || starts([0, 0, 0xFE, 0xFF]) {
                "it is UTF-32 text; save it as UTF-8"
            } else if starts([0xFF, 0xFE]) || starts([0xFE, 0xFF]) || Self.looksUTF16(head) {
                "it is UTF-16 text (as Excel's 'Unicode Text' and PowerShell's redirection write); save or export it as UTF-8"
            } else if starts([0x1F, 0x8B]) {
                decompressed
                    ? "it is compressed twice (a gzip inside a gzip); compress the export once"
                    : "it is gzip-compressed; name it with .gz at the end"
            } else if starts([0x50, 0x4B, 0x03, 0x04]) || starts([0x50, 0x4B, 0x05, 0x06]) {
                "it is a ZIP archive (a spreadsheet such as .xlsx, or a .zip); export the sheet as CSV, or unpack it"
            } else if starts([0x28, 0xB5, 0x2F, 0xFD]) {
                "it is zstd-compressed; tidemark reads plain or gzip files"
            } else if starts([0x42, 0x5A, 0x68]) {
                "it is bzip2-compressed; tidemark reads plain or gzip files"
            } else if starts([0xFD, 0x37, 0x7A, 0x58, 0x5A, 0x00]) {
                "it is xz-compressed; tidemark reads plain or gzip files"
            } else if let offset = head.firstIndex(of: 0) {
                "it is a binary file, not text (a NUL byte at offset \(offset))"
            } else if let offset = Self.firstInvalidUTF8(head, complete: head.count == data.count) {
                "it is not UTF-8 text (byte 0x\(String(head[offset], radix: 16, uppercase: true)) at offset \(offset)); save it as UTF-8"
            } else {
                nil
            }
        return problem.map { InputFileError(kind: .notText, problem: $0) }
    }

    /// UTF-16 without a byte order mark: in its first characters every other byte is zero (ASCII text).
    static func looksUTF16(_ head: [UInt8]) -> Bool {
        let sample = head.prefix(64)
        guard sample.count >= 8 else { return false }
        let even = stride(from: 0, to: sample.count - 1, by: 2).map { sample[sample.startIndex + $0] }
        let odd = stride(from: 1, to: sample.count, by: 2).map { sample[sample.startIndex + $0] }
        return (even.allSatisfy { $0 == 0 } && !odd.contains(0)) || (odd.allSatisfy { $0 == 0 } && !even.contains(0))
    }

    /// The offset of the first byte that breaks UTF-8 in `bytes`, or nil; when the bytes are cut from a
    /// longer file (`complete` false), a sequence cut at the end is not counted.
    static func firstInvalidUTF8(_ bytes: [UInt8], complete: Bool) -> Int? {
        var i = 0
        while i < bytes.count {
            let byte = bytes[i]
            let length: Int
            switch byte {
            case 0x00...0x7F:
                i += 1
                continue
            case 0xC2...0xDF: length = 2
            case 0xE0...0xEF: length = 3
            case 0xF0...0xF4: length = 4
            default: return i
            }
            if i + length > bytes.count { return complete ? i : nil }
            for k in 1..<length where bytes[i + k] & 0xC0 != 0x80 { return i }
            // Overlong and surrogate forms.
            if byte == 0xE0, bytes[i + 1] < 0xA0 { return i }
            if byte == 0xED, bytes[i + 1] > 0x9F { return i }
            if byte == 0xF0, bytes[i + 1] < 0x90 { return i }
            if byte == 0xF4, bytes[i + 1] > 0x8F { return i }
            i += length
        }
        return nil
    }

    /// The UTF-8 byte order mark some editors and spreadsheet exports put first; never part of a value.
    package static let utf8BOM: [UInt8] = [0xEF, 0xBB, 0xBF]

    /// The real path of an open file, as the kernel knows it.
    static func openedPath(_ fd: Int32) -> String? {
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let n = readlink("/proc/self/fd/\(fd)", &buffer, Int(PATH_MAX))
        guard n > 0, buffer[0] == 0x2F else { return nil }
        return String(decoding: buffer[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// `path` with every symlink resolved, or nil when it does not exist.
    package static func realPath(_ path: String) -> String? {
        guard let resolved = realpath(path, nil) else { return nil }
        defer { free(resolved) }
        return String(cString: resolved)
    }

    /// Files this large are read into memory mapped for them (huge pages where the kernel allows),
    /// rather than zeroed heap: a 183 MB inventory then costs a hundred page faults, not 45,000.
    static let largeFile = 8 << 20

    /// `size` bytes of fresh anonymous memory as `Data`, unmapped when the data is freed.
    static func largeBuffer(_ size: Int) -> Data {
        guard let memory = mmap(nil, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0),
            memory != MAP_FAILED
        else { return Data(count: size) }
        _ = madvise(memory, size, MADV_HUGEPAGE)
        return Data(
            bytesNoCopy: memory, count: size, deallocator: .custom { pointer, count in _ = munmap(pointer, count) })
    }

    static func openError(_ code: Int32) -> InputFileError {
        switch code {
        case ENOENT, ENOTDIR: InputFileError(kind: .notFound, problem: "no such file")
        case EACCES, EPERM:
            InputFileError(kind: .permissionDenied, problem: "permission denied; check the file's owner and mode")
        case EISDIR: InputFileError(kind: .isDirectory, problem: "it is a directory, not a file")
        default: InputFileError(kind: .io, problem: String(cString: strerror(code)))
        }
    }

    static func tooLarge(_ size: Int, _ limit: Int, _ setting: String?) -> InputFileError {
        let sizes = ByteCountFormatter.string(fromByteCount: Int64(size), countStyle: .binary)
        let limits = ByteCountFormatter.string(fromByteCount: Int64(limit), countStyle: .binary)
        var problem = "it is \(sizes), more than the \(limits) tidemark reads"
        if let setting { problem += "; if it is meant to be this large, raise limits.\(setting) in tidemark.yaml" }
        return InputFileError(kind: .tooLarge, problem: problem)
    }
}
