import Logging
import NIOCore
import NIOPosix
import PostgresNIO

/// Opens every PostgreSQL connection tidemark makes (state stores, inventory sources, change
/// readers, `on_dead` hooks): a TCP channel of its own with `ReadCompleteGuard` next to the socket,
/// handed to PostgresNIO as an established channel.
///
/// Why: when the server ends a connection while a large result is streaming (a failover, a PgBouncer
/// restart, `pg_terminate_backend`, `idle_session_timeout`), SwiftNIO reads what is left in the socket
/// at once, firing `channelReadComplete` once per read cycle and once more at the end of the stream,
/// with no `read` in between. PostgresNIO 1.33's row stream takes a second `channelReadComplete`
/// without a `read` for a bug and stops the process with a precondition (its
/// `RowStreamStateMachine.channelReadComplete`), in release builds too. The guard passes on only the
/// `channelReadComplete` that follows a read the pipeline asked for; the channel closes right after
/// such a drain, and the query fails with a connection error that the caller names and tries again.
enum PostgresConnector {
    /// A connection to `url` (built by `configuration`), opened within the URL's `connect_timeout`.
    static func connect(
        _ url: PostgresURL, configuration: PostgresConnection.Configuration, id: Int, logger: Logger
    ) async throws -> PostgresConnection {
        let eventLoop = MultiThreadedEventLoopGroup.singleton.any()
        let channel = try await ClientBootstrap(group: eventLoop)
            .connectTimeout(configuration.options.connectTimeout)
            .channelOption(ChannelOptions.socketOption(.so_keepalive), value: 1)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(ReadCompleteGuard())
                }
            }
            .connect(host: url.host, port: url.port).get()
        var established = PostgresConnection.Configuration(
            establishedChannel: channel, tls: configuration.tls, username: configuration.username,
            password: configuration.password, database: configuration.database)
        established.options = configuration.options
        if established.options.tlsServerName == nil, !url.hostIsAddress {
            // PostgresNIO names the server for TLS (SNI, and verify-full's host check) only when it
            // connects itself; on an established channel it is given here.
            established.options.tlsServerName = url.host
        }
        do {
            return try await PostgresConnection.connect(
                on: channel.eventLoop, configuration: established, id: id, logger: logger
            ).get()
        } catch {
            try? await channel.close()
            throw error
        }
    }
}

/// Passes `channelReadComplete` toward PostgresNIO only after a `read` went out since the last one
/// (see `PostgresConnector`). In a healthy connection every read cycle follows a read, so nothing is
/// held back; only the extra ones of a drain at the end of the stream are dropped, and the channel
/// closes right after them.
final class ReadCompleteGuard: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = NIOAny
    typealias InboundOut = NIOAny
    typealias OutboundIn = NIOAny
    typealias OutboundOut = NIOAny

    /// Whether a read went out toward the socket since the last `channelReadComplete` passed on.
    private var readAsked = true

    func read(context: ChannelHandlerContext) {
        readAsked = true
        context.read()
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        guard readAsked else { return }
        readAsked = false
        context.fireChannelReadComplete()
    }
}
