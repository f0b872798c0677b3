/// A refresh in which too many known devices come back dead is refused as a likely misconfiguration
/// (a wrong URL, project or credentials) rather than believed: uninstalls trickle, they do not arrive
/// as a fifth of the fleet at once. `--accept-dead` accepts such a refresh when it is real.
public struct DeadTokenGuard: Sendable, Equatable {
    /// The share of the inventory's registrations read in one refresh that may newly come back dead.
    public var share: Double
    /// At most this many newly dead are always accepted, whatever their share.
    public var minimum: Int

    public init(share: Double = 0.2, minimum: Int = 50) {
        self.share = share
        self.minimum = minimum
    }

    /// Why a refresh that read `read` inventory registrations, `newlyDead` of them dead, is refused; nil
    /// when it is believable.
    public func violation(newlyDead: Int, read: Int) -> String? {
        guard newlyDead > minimum, read > 0, Double(newlyDead) > share * Double(read) else { return nil }
        let percent = Int((Double(newlyDead) * 100 / Double(read)).rounded())
        return
            "\(newlyDead) of the \(read) registrations read for inventory devices (\(percent)%) came back unregistered at once, more than the \(Int((share * 100).rounded()))% (and \(minimum)) that uninstalls explain. That looks like a misconfiguration (a wrong fcm_url or iid_url, another project's credentials) rather than devices that are gone, so nothing was planned or written. Check the backend's settings; if the devices really are gone, run again with --accept-dead."
    }
}
