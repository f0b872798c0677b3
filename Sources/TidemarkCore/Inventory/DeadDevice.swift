import Foundation

/// A device the inventory still lists whose token FCM reported unregistered: what apply writes to
/// `--dead-tokens FILE` and reports to the source's `on_dead` hook, so the app stops sending to it.
public struct DeadDevice: Sendable, Equatable, Codable {
    public var deviceID: String
    public var token: String
    /// Where the inventory got the device: a file, or `inventory source 'NAME'`.
    public var source: String
    public var reason: String

    public init(deviceID: String, token: String, source: String, reason: String = DeadDevice.unregistered) {
        self.deviceID = deviceID
        self.token = token
        self.source = source
        self.reason = reason
    }

    /// The one reason tidemark marks a token dead: FCM answered that it does not know it.
    public static let unregistered =
        "unregistered: FCM does not know the token (app uninstalled, token rotated or expired)"

    /// Every device of `inventory` whose token `state` has as dead, in inventory order. A source that
    /// filters dead rows out (`where active`) stops listing a device once its hook ran, so reporting
    /// is idempotent and survives a kill between the apply and the hook: the next apply reports again.
    public static func collect(state: State, inventory: Inventory) -> [DeadDevice] {
        guard !state.dead.isEmpty else { return [] }
        var result: [DeadDevice] = []
        for (index, token) in inventory.tokens.enumerated() {
            guard let id = state.tokens.id(token), state.dead.contains(id) else { continue }
            result.append(
                DeadDevice(
                    deviceID: inventory.deviceIDs[index], token: token,
                    source: inventory.location(ofDevice: index).file))
        }
        return result
    }
}
