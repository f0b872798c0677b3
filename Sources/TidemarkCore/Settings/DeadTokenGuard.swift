/// A refresh or an apply in which too many known devices come back dead is refused as a likely
/// misconfiguration (a wrong URL, project or credentials) rather than believed: uninstalls trickle,
/// they do not arrive as a fifth of the fleet at once. `--accept-dead` accepts such a run when it is real.
public struct DeadTokenGuard: Sendable, Equatable {
    /// The share of the inventory's registrations read in one refresh that may newly come back dead.
    public var share: Double
    /// At most this many newly dead are always accepted, whatever their share.
    public var minimum: Int

    /// A guard with the defaults: 20%, and at least 50 always accepted.
    public init(share: Double = 0.2, minimum: Int = 50) {
        self.share = share
        self.minimum = minimum
    }

    /// Where the "unregistered" answers came from.
    public enum Phase: Sendable {
        /// A refresh read the registrations.
        case refresh
        /// An apply's own subscribe and unsubscribe calls were answered so.
        case apply
    }

    /// Whether `newlyDead` of `read` inventory registrations coming back unregistered is more than
    /// uninstalls explain.
    public func exceeded(newlyDead: Int, read: Int) -> Bool {
        newlyDead > minimum && read > 0 && Double(newlyDead) > share * Double(read)
    }

    /// Why a refresh that read `read` inventory registrations, `newlyDead` of them dead, is refused; nil
    /// when it is believable. `location` names the FCM that answered (the backend and its address).
    public func violation(newlyDead: Int, read: Int, location: String? = nil, phase: Phase = .refresh) -> String? {
        guard exceeded(newlyDead: newlyDead, read: read) else { return nil }
        let percent = Int((Double(newlyDead) * 100 / Double(read)).rounded())
        let asked = location.map { " by \($0)" } ?? ""
        let limit = "more than the \(Int((share * 100).rounded()))% (and \(minimum)) that uninstalls explain"
        switch phase {
        case .refresh:
            return
                "\(newlyDead) of the \(read) registrations read for inventory devices (\(percent)%) came back unregistered at once\(asked), \(limit). That looks like a misconfiguration (a wrong fcm_url or iid_url, another project's credentials) rather than devices that are gone, so nothing was planned or written. Check the backend's settings; if the devices really are gone, run again with --accept-dead."
        case .apply:
            return
                "\(newlyDead) of the \(read) inventory registrations this apply changed (\(percent)%) were answered as unregistered\(asked), \(limit); tidemark expected FCM to know them, as state and the plan say it did. That looks like the wrong FCM (an emulator restarted without its data, a wrong FCM_EMULATOR_HOST, fcm_url or project) rather than devices that are gone, so the apply stopped: no token was recorded as dead and no on_dead hook was told. Check the backend's settings and run 'tidemark apply' again (what finished is journaled); if the devices really are gone, run it with --accept-dead."
        }
    }
}
