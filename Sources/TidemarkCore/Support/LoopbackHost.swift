import Foundation

/// The `Host` header check of tidemark's loopback servers (the emulator, and `serve`'s endpoints when
/// they listen on loopback): a request naming any other host reached the server through DNS
/// rebinding (a web page's name resolved to 127.0.0.1), and is refused.
public enum LoopbackHost {
    /// The host names answered, exactly: `127.0.0.1`, `localhost` and `::1` (written `[::1]`).
    public static let names: Set<String> = ["127.0.0.1", "localhost", "::1"]

    /// Whether a `Host` header names a loopback host (any case, with or without a port).
    public static func accepts(_ header: String) -> Bool {
        guard let name = hostName(header) else { return false }
        return names.contains(name.lowercased())
    }

    /// Whether `address` (a listening address) is a loopback one.
    public static func isLoopback(_ address: String) -> Bool {
        let bare = address.hasPrefix("[") && address.hasSuffix("]") ? String(address.dropFirst().dropLast()) : address
        return names.contains(bare.lowercased()) || bare.hasPrefix("127.")
    }

    /// The host name of a `Host` header, without the port (and without the brackets of an IPv6
    /// address), or nil when it is not one. Brackets hold an IPv6 address only (`[127.0.0.1]` is no
    /// host name); a port is one to five ASCII digits.
    public static func hostName(_ header: String) -> Substring? {
        let value = header.trimmingCharacters(in: .whitespaces)[...]
        func isPort(_ text: Substring) -> Bool {
            !text.isEmpty && text.count <= 5 && text.allSatisfy { $0.isASCII && $0.isNumber }
        }
        if value.hasPrefix("[") {
            guard let close = value.firstIndex(of: "]") else { return nil }
            let rest = value[value.index(after: close)...]
            guard rest.isEmpty || (rest.hasPrefix(":") && isPort(rest.dropFirst())) else { return nil }
            let address = value[value.index(after: value.startIndex)..<close]
            guard address.contains(":") else { return nil }
            return address
        }
        let parts = value.split(separator: ":", omittingEmptySubsequences: false)
        guard parts.count <= 2, let name = parts.first, !name.isEmpty else { return nil }
        if parts.count == 2, !isPort(parts[1]) { return nil }
        return name
    }
}
