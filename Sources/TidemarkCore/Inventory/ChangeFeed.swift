import Foundation

/// What `tidemark serve` follows of an inventory source between its whole reads: which devices
/// changed, by a cursor over the source's rows, by notifications, or both. A source kind offers one
/// through its registry entry (`InventorySourceRegistry.register(_:as:_:follow:)`); PostgreSQL's
/// (`changes`, `listen`) is one, and a kind added from outside adds its own the same way.
public protocol ChangeFeed: Sendable {
    /// The source's name in tidemark.yaml.
    var source: String { get }
    /// How long at most between two whole reads of the source while its changes are followed: what
    /// the changes built is checked against a whole read this often.
    var resync: Duration { get }
    /// What a person checks when following fails, as the log names it (`'postgres.changes' and
    /// APP_DB_URL`).
    var settingsHint: String { get }
    /// Equal for two feeds that follow the same source the same way (reloaded settings that change
    /// it start the following over).
    var identity: String { get }
    /// The cursor it follows, as the log names it (`'updated_at'`); nil when it follows none
    /// (`cursor()` is nil).
    var cursorName: String? { get }
    /// How it listens, as the log names it (`LISTEN 'devices'`); nil when it does not
    /// (`listen(connected:each:)` is not called).
    var listenName: String? { get }

    /// A reader of the rows past a cursor, keeping what it needs (a connection) until closed; nil
    /// when the feed follows no cursor.
    func cursor() -> (any ChangeCursor)?

    /// Listens: calls `connected` once the feed hears every notification from then on, then `each`
    /// with each one's payload (a device id; empty: the source must be read in full) until `each`
    /// returns false or the task is cancelled. Returns when the connection ends; throws when it
    /// cannot be made.
    func listen(connected: @escaping @Sendable () -> Void, each: @escaping @Sendable (String) -> Bool) async throws

    /// Reads the devices `ids` as a whole read of the source sees them (its labels, its exclusions)
    /// into `builder`: the devices found among them, and the problems of their rows.
    func readDevices(_ ids: [String], into builder: inout InventoryBuilder) async throws
}

/// A cursor over a source's changed rows (`ChangeFeed.cursor()`).
public protocol ChangeCursor: Sendable {
    /// The cursor's largest value now (nil: the source has no row): where following starts.
    func current() async throws -> String?
    /// The devices whose rows changed after `cursor` (nil: from the start), in the cursor's order, at
    /// most `limit`, and the cursor after the last of them.
    func changed(after cursor: String?, limit: Int) async throws -> (ids: [String], cursor: String?)
    /// Whether the cursor's largest value is now below `cursor` (a restored table, a reset sequence).
    func wentBack(from cursor: String) async throws -> Bool
    /// Lets go of what it keeps (a later read takes it again).
    func close() async
}
