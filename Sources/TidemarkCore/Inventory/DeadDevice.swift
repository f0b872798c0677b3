import Foundation

/// A device the inventory still lists whose token FCM reported unregistered: what apply writes to
/// `--dead-tokens FILE` and reports to the source's `on_dead` hook, so the app stops sending to it.
public struct DeadDevice: Sendable, Equatable, Codable {
    /// The inventory's id of the device.
    public var deviceID: String
    /// Its token, which FCM no longer knows.
    public var token: String
    /// Where the inventory got the device: a file, or `inventory source 'NAME'`.
    public var source: String
    /// Why it is reported (`DeadDevice.unregistered`).
    public var reason: String

    /// A dead device, reported for `reason`.
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

/// One line of `--dead-tokens FILE` and of an `on_dead` program's stdin.
public struct DeadTokenLine: Codable, Sendable, Equatable {
    /// The inventory's id of the device (`device_id` in JSON).
    public var deviceId: String
    /// The token FCM no longer knows, whole: what the app's database holds, to match on.
    public var token: String
    /// The token redacted, for logs.
    public var tokenRedacted: String
    /// Where the inventory got the device.
    public var source: String
    /// Why it is reported.
    public var reason: String
    /// When (ISO 8601); nil in tests that compare lines.
    public var reportedAt: String?

    /// The line for `device`, reported at `reportedAt` (ISO 8601).
    public init(_ device: DeadDevice, reportedAt: String?) {
        deviceId = device.deviceID
        token = device.token
        tokenRedacted = Redaction.redact(device.token)
        source = device.source
        reason = device.reason
        self.reportedAt = reportedAt
    }

    /// The devices as NDJSON, one object a line: the `--dead-tokens` file and a hook's stdin alike.
    public static func ndjson(_ devices: some Sequence<DeadDevice>, reportedAt time: Date) throws -> Data {
        let encoder = JSONEncoder()
        encoder.keyEncodingStrategy = .convertToSnakeCase
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        let when = ISO8601DateFormatter().string(from: time)
        var data = Data()
        for device in devices {
            data.append(try encoder.encode(DeadTokenLine(device, reportedAt: when)))
            data.append(UInt8(ascii: "\n"))
        }
        return data
    }
}
