import Foundation
import Synchronization

/// Access tokens kept beyond the life of one backend. `serve` builds a backend for every reconcile
/// and for every batch of changed devices (several a second while a table changes); without this,
/// each would exchange the credentials for a token of its own at Google's token endpoint, one round
/// trip before its first call and a load that endpoint limits. One cache per process, shared by its
/// `AccessTokenProvider`s: a token is kept for the credentials it was granted to (a rotated key or
/// another file is other credentials) until a minute before it expires, or until a provider is
/// refused with it (a 401) and forgets it.
///
/// Tokens live in memory only; nothing of them is written or printed.
public final class AccessTokenCache: Sendable {
    private struct Entry {
        var credentials: GoogleCredentials
        var token: String
        var expires: Date
    }

    private let entries = Mutex<[Entry]>([])

    /// An empty cache.
    public init() {}

    /// The token kept for `credentials` that is still valid after `date`, with when it expires.
    func token(for credentials: GoogleCredentials, validAfter date: Date) -> (token: String, expires: Date)? {
        entries.withLock { entries in
            entries.first { $0.credentials == credentials && $0.expires > date }.map { ($0.token, $0.expires) }
        }
    }

    /// Keeps `token` for `credentials`, replacing what was kept for them; expired entries go.
    func keep(_ token: String, expires: Date, for credentials: GoogleCredentials, now: Date) {
        entries.withLock { entries in
            entries.removeAll { $0.credentials == credentials || $0.expires <= now }
            entries.append(Entry(credentials: credentials, token: token, expires: expires))
        }
    }

    /// Forgets `token` of `credentials` (refused with a 401): the next provider fetches a new one.
    /// A newer token another provider kept meanwhile stays.
    func forget(_ token: String, of credentials: GoogleCredentials) {
        entries.withLock { entries in entries.removeAll { $0.credentials == credentials && $0.token == token } }
    }

    /// How many credentials have a token kept.
    public var count: Int { entries.withLock { $0.count } }
}
