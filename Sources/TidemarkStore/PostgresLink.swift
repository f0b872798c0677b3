import Foundation
import Logging
import NIOCore
import PostgresNIO
import Synchronization
import TidemarkCore

#if canImport(Glibc)
import Glibc
#endif

/// One connection, used by one transaction at a time, opened on first use.
actor PostgresLink {
    let url: PostgresURL
    let location: String
    private var connection: PostgresConnection?
    private(set) var migrated = false
    private var busy = false
    private var waiting: [CheckedContinuation<Void, Never>] = []
    private static let logger = Logger(label: "tidemark.state.postgres")

    /// Called after each committed transaction (the work under a lease moved).
    private let committed: @Sendable () -> Void

    init(url: PostgresURL, location: String, committed: @escaping @Sendable () -> Void = {}) {
        self.url = url
        self.location = location
        self.committed = committed
    }

    deinit {
        // A connection must be closed before it is released; the completion keeps it until then.
        if let connection, !connection.isClosed {
            connection.close().whenComplete { _ in _ = connection }
        }
    }

    func setMigrated() { migrated = true }

    /// The queries of one transaction; each answer (a statement's, a thousand rows of a read) counts
    /// as the transaction moving, for its time limit.
    struct Connection: Sendable {
        let base: PostgresConnection
        var progress = TimeLimit.Progress()

        @discardableResult
        func query(_ query: PostgresQuery) async throws -> Rows {
            let rows = try await base.query(query, logger: PostgresLink.logger)
            progress.moved()
            return Rows(rows: rows, progress: progress)
        }

        func run(_ query: PostgresQuery) async throws {
            try await base.query(query, logger: PostgresLink.logger).collect()
            progress.moved()
        }

        func first(_ query: PostgresQuery) async throws -> PostgresRow? {
            let rows = try await base.query(query, logger: PostgresLink.logger).collect()
            progress.moved()
            return rows.first
        }
    }

    /// The rows of a read, each thousand of them counted as the transaction moving.
    struct Rows: AsyncSequence, Sendable {
        typealias Element = PostgresRow
        let rows: PostgresRowSequence
        let progress: TimeLimit.Progress

        struct AsyncIterator: AsyncIteratorProtocol {
            var base: PostgresRowSequence.AsyncIterator
            let progress: TimeLimit.Progress
            var count = 0

            mutating func next() async throws -> PostgresRow? {
                let row = try await base.next()
                count += 1
                if count % 1000 == 0 || row == nil { progress.moved() }
                return row
            }
        }

        func makeAsyncIterator() -> AsyncIterator {
            AsyncIterator(base: rows.makeAsyncIterator(), progress: progress)
        }

        /// Every row.
        func collect() async throws -> [PostgresRow] {
            var all: [PostgresRow] = []
            for try await row in self { all.append(row) }
            return all
        }
    }

    /// Runs `body` in a transaction on the link's connection; one transaction at a time. The server
    /// must answer within `url.timeout` of the transaction's last move (its start, a statement
    /// answered, a thousand rows read): past it the connection is dropped (which fails the query it
    /// waits on, however the server or the network went away) and the error names the server. A
    /// long transaction whose statements each answer (the first save of five million tokens, 250
    /// statements) is not cut off.
    func transaction<T: Sendable>(
        readOnly: Bool = false, _ body: @Sendable @escaping (Connection) async throws -> T
    ) async throws -> T {
        while busy { await withCheckedContinuation { waiting.append($0) } }
        busy = true
        defer {
            busy = false
            if !waiting.isEmpty { waiting.removeFirst().resume() }
        }
        let base = try await open()
        let limit = url.timeout
        let progress = TimeLimit.Progress()
        // A run paused inside a transaction (SIGSTOP, a frozen VM) must not hold its row locks, and with
        // them every other runner, for ever: the server ends a session idle in a transaction this long.
        let idle = max(1, limit.components.seconds / 3) * 1000
        // Bounded as every query tidemark sends: past the limit the connection is closed and the run goes
        // on without waiting for the statement (on a dropped connection it can wait in the driver for ever).
        do {
            let result = try await PostgresURL.bounded(base, limit, movedBy: progress) {
                try await Self.run(base, progress: progress, readOnly: readOnly, idleMillis: idle, body)
            }
            committed()
            return result
        } catch let late as PostgresURL.NoAnswer {
            connection = nil
            throw StateStoreError(.io, path: location, "PostgreSQL: \(late.words)")
        } catch let ended as PostgresURL.ConnectionEnded {
            connection = nil
            throw StateStoreError(.io, path: location, "PostgreSQL: \(ended.words)")
        } catch {
            if base.isClosed { connection = nil }
            if let known = error as? StateStoreError { throw known }
            throw describe(error)
        }
    }

    /// BEGIN, `body`, COMMIT; ROLLBACK when `body` fails.
    private static func run<T: Sendable>(
        _ base: PostgresConnection, progress: TimeLimit.Progress, readOnly: Bool, idleMillis: Int64,
        _ body: @Sendable (Connection) async throws -> T
    ) async throws -> T {
        let c = Connection(base: base, progress: progress)
        try await c.run(readOnly ? "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY" : "BEGIN")
        try await c.run(
            PostgresQuery(unsafeSQL: "SET LOCAL idle_in_transaction_session_timeout = \(idleMillis)"))
        do {
            let result = try await body(c)
            try await c.run("COMMIT")
            return result
        } catch {
            _ = try? await c.run("ROLLBACK")
            throw error
        }
    }

    func execute(_ sql: String) async throws {
        let c = Connection(base: try await open())
        do {
            try await c.run(PostgresQuery(unsafeSQL: sql))
        } catch {
            throw describe(error)
        }
    }

    /// The open connection, or a new one. Opening (TCP, TLS, start-up and authentication) is bounded
    /// by `connect_timeout`: a server that accepts and never answers fails the command, it does not hang it.
    private func open() async throws -> PostgresConnection {
        if let connection, !connection.isClosed { return connection }
        let configuration = try url.configuration()
        let limit = url.connectTimeout
        let opened: PostgresConnection?
        do {
            opened = try await TimeLimit.race(limit) {
                try await PostgresConnector.connect(self.url, configuration: configuration, id: 1, logger: Self.logger)
            } late: { connection in
                try? await connection.close()
            }
        } catch {
            throw describe(error)
        }
        guard let opened else {
            throw StateStoreError(
                .io, path: location,
                "the server accepted no PostgreSQL session within \(limit.components.seconds) s (connect_timeout); check the host and port, and that a PostgreSQL server (not another service) listens there"
            )
        }
        connection = opened
        return opened
    }

    func close() async {
        try? await connection?.close()
        connection = nil
    }

    /// A PostgreSQL error as one line naming the store: the server's message, or why it cannot be reached.
    func describe(_ error: any Error) -> StateStoreError {
        if let error = error as? StateStoreError { return error }
        return StateStoreError(.io, path: location, PostgresURL.explain(error))
    }
}
