/// Why the state file cannot be used; every case says what to do.
public struct StateStoreError: Error, CustomStringConvertible, Sendable {
    public enum Code: Sendable {
        case notSQLite
        case foreign
        case damaged
        case newerFormat
        case locked
        case io
    }

    public var code: Code
    public var path: String
    public var detail: String

    public init(_ code: Code, path: String, _ detail: String) {
        self.code = code
        self.path = path
        self.detail = detail
    }

    public var description: String {
        switch code {
        case .notSQLite:
            "\(path) is not a tidemark state file (it is not an SQLite database). It was left untouched; move it away or point 'state' in tidemark.yaml elsewhere."
        case .foreign:
            "\(path) is an SQLite database but not a tidemark state file (\(detail)). It was left untouched; move it away or point 'state' in tidemark.yaml elsewhere."
        case .damaged:
            "\(path) is damaged (\(detail)). It was left untouched; restore it from a backup, or move it away and run 'tidemark import' to adopt the current memberships."
        case .newerFormat:
            "\(path) was written by a newer tidemark (\(detail)); upgrade tidemark to use it."
        case .locked:
            "the state \(path) is locked by \(detail). Wait for that run to finish; the lock is released when its process ends."
        case .io:
            "cannot use the state \(path): \(detail)"
        }
    }
}
