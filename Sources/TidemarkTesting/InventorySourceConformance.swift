import Foundation
import Testing
import TidemarkCore

/// A device as a conformance check hands it to a source under test.
public struct FixtureDevice: Sendable, Equatable {
    /// The device's id.
    public var id: String
    /// Its registration token.
    public var token: String
    /// Its labels.
    public var labels: [String: String]

    /// A device with `id`, `token` and `labels`.
    public init(id: String, token: String, labels: [String: String] = [:]) {
        self.id = id
        self.token = token
        self.labels = labels
    }
}

/// One suite for every `InventorySource`: give it a way to make a source holding given devices.
///
/// ```swift
/// @Test(arguments: InventorySourceConformance.Check.allCases)
/// func conforms(_ check: InventorySourceConformance.Check) async throws {
///     try await InventorySourceConformance.run(check) { devices in InMemoryInventorySource(devices) }
/// }
/// ```
public enum InventorySourceConformance {
    /// The checks every inventory source passes.
    public enum Check: String, CaseIterable, Sendable, CustomTestStringConvertible {
        case loadsEveryDeviceWithItsLabels
        case loadsNothingFromAnEmptySource
        case snapshotFollowsTheContent
        case reportsDuplicatesNamingBothPlaces
        case refusesInvalidTokensAndKeepsTheRest
        case combinesWithOtherSources
        case reusesTheStringsOfTheLastRead

        /// The check's name, as test reports show it.
        public var testDescription: String { rawValue }
    }

    /// Makes the source under test, seeded with these devices.
    public typealias Make = @Sendable ([FixtureDevice]) async throws -> any InventorySource

    /// Runs `check` on sources `make` builds.
    public static func run(_ check: Check, _ make: Make) async throws {
        switch check {
        case .loadsEveryDeviceWithItsLabels: try await loadsEveryDevice(make)
        case .loadsNothingFromAnEmptySource: try await loadsNothing(make)
        case .snapshotFollowsTheContent: try await snapshotFollowsTheContent(make)
        case .reportsDuplicatesNamingBothPlaces: try await reportsDuplicates(make)
        case .refusesInvalidTokensAndKeepsTheRest: try await refusesInvalidTokens(make)
        case .combinesWithOtherSources: try await combines(make)
        case .reusesTheStringsOfTheLastRead: try await reusesTheStringsOfTheLastRead(make)
        }
    }

    /// Fixture devices `range`, with labels on two in three.
    public static func devices(_ range: Range<Int>) -> [FixtureDevice] {
        range.map { i in
            FixtureDevice(
                id: "device-\(i)", token: Fixtures.token(i, prefix: "inv"),
                labels: i % 3 == 0 ? [:] : ["platform": i % 2 == 0 ? "ios" : "android", "region": "r\(i % 5)"])
        }
    }

    static func load(
        _ source: any InventorySource, into builder: inout InventoryBuilder
    ) async throws -> InventorySnapshot {
        try await source.load(into: &builder)
    }

    static func loadsEveryDevice(_ make: Make) async throws {
        let expected = devices(0..<500)
        var builder = InventoryBuilder()
        _ = try await load(try await make(expected), into: &builder)
        #expect(builder.diagnostics.isEmpty, "\(builder.diagnostics.prefix(3))")
        let inventory = builder.inventory
        #expect(inventory.count == expected.count)
        for device in expected {
            guard let index = inventory.index(ofDevice: device.id) else {
                Issue.record("device \(device.id) is missing")
                continue
            }
            #expect(inventory.tokens[index] == device.token)
            #expect(inventory.index(ofToken: device.token) == index)
            for key in ["platform", "region"] {
                #expect(inventory.label(key, ofDevice: index) == device.labels[key], "label \(key) of \(device.id)")
            }
        }
    }

    /// A builder made inside `StringReuse.$current.withValue` keeps the strings it is given for the tokens it
    /// reads with the same bytes, and for their device ids when state recorded the same device for them.
    static func reusesTheStringsOfTheLastRead(_ make: Make) async throws {
        let listed = (0..<40).map { i in
            FixtureDevice(
                id: "device-\(i)-with-a-long-stable-id", token: Fixtures.token(i, prefix: "inv"),
                labels: ["platform": "ios"])
        }
        func anew(_ string: String) -> String { String(decoding: Array(string.utf8), as: UTF8.self) }
        // What the last whole read kept: the first 30 tokens, with their devices but for token 5's.
        var kept = TokenRegistry()
        for device in listed.prefix(30) {
            let id = kept.intern(anew(device.token))
            kept.setDeviceID(id, device.id == listed[5].id ? "a-device-that-had-the-token-before" : anew(device.id))
        }
        let storage = StateStoreConformance.storage
        var builder = StringReuse.$current.withValue(StringReuse(kept)) { InventoryBuilder() }
        _ = try await load(try await make(listed), into: &builder)
        let inventory = builder.inventory
        #expect(builder.diagnostics.isEmpty && inventory.count == 40)
        for (i, device) in listed.enumerated() {
            let index = try #require(inventory.index(ofDevice: device.id))
            #expect(inventory.tokens[index] == device.token && inventory.deviceIDs[index] == device.id)
            let id = kept.id(device.token)
            #expect(
                (storage(inventory.tokens[index]) == id.flatMap { storage(kept[$0]) }) == (i < 30),
                "the token of \(device.id) is the kept string exactly when one was kept")
            #expect(
                (storage(inventory.deviceIDs[index]) == id.flatMap { storage(kept.deviceIDs[Int($0)]) })
                    == (i < 30 && i != 5), "the id of \(device.id) is the kept string when its token's device is")
        }
        var plain = InventoryBuilder()
        _ = try await load(try await make(listed), into: &plain)
        #expect(storage(plain.inventory.tokens[0]) != storage(kept[0]), "outside a whole read, nothing is reused")
    }

    static func loadsNothing(_ make: Make) async throws {
        var builder = InventoryBuilder()
        _ = try await load(try await make([]), into: &builder)
        #expect(builder.inventory.count == 0 && builder.diagnostics.isEmpty)
    }

    static func snapshotFollowsTheContent(_ make: Make) async throws {
        var scratch = InventoryBuilder()
        let first = try await load(try await make(devices(0..<20)), into: &scratch)
        scratch = InventoryBuilder()
        let again = try await load(try await make(devices(0..<20)), into: &scratch)
        scratch = InventoryBuilder()
        var changed = devices(0..<20)
        changed[7].token = Fixtures.token(7, prefix: "rotated")
        let other = try await load(try await make(changed), into: &scratch)
        #expect(!first.identity.isEmpty, "a source says which snapshot it read")
        #expect(first == again, "the same devices are the same snapshot")
        #expect(first != other, "a rotated token is another snapshot")
    }

    static func reportsDuplicates(_ make: Make) async throws {
        var list = devices(0..<5)
        list.append(FixtureDevice(id: "device-2", token: Fixtures.token(99, prefix: "inv")))
        list.append(FixtureDevice(id: "device-77", token: list[1].token))
        var builder = InventoryBuilder()
        let source = try await make(list)
        _ = try await load(source, into: &builder)
        #expect(builder.inventory.count == 5)
        let messages = builder.diagnostics.map(\.description)
        #expect(builder.diagnostics.count == 2, "\(messages)")
        #expect(messages.contains { $0.contains("device id 'device-2' is declared twice") })
        #expect(messages.contains { $0.contains("device 'device-77' has the same token as device 'device-1'") })
    }

    static func refusesInvalidTokens(_ make: Make) async throws {
        var list = devices(0..<3)
        list.insert(FixtureDevice(id: "bad", token: "has spaces in it"), at: 1)
        var builder = InventoryBuilder()
        _ = try await load(try await make(list), into: &builder)
        #expect(builder.inventory.count == 3)
        #expect(builder.inventory.index(ofDevice: "bad") == nil)
        let messages = builder.diagnostics.map(\.description)
        #expect(messages.count == 1 && messages[0].contains("token of device 'bad' is not valid"), "\(messages)")
    }

    static func combines(_ make: Make) async throws {
        var builder = InventoryBuilder()
        let other = builder.source("other.csv")
        builder.add(id: "device-1", token: Fixtures.token(1000, prefix: "o"), labels: [], from: other, line: 2)
        _ = try await load(try await make(devices(0..<3)), into: &builder)
        #expect(builder.inventory.count == 3, "device-1 stays the first source's")
        let messages = builder.diagnostics.map(\.description)
        #expect(messages.count == 1 && messages[0].contains("the other is at other.csv:2"), "\(messages)")
    }
}

/// Devices in memory: the twin of file and database sources for unit tests.
public struct InMemoryInventorySource: InventorySource {
    /// How messages name the source.
    public var name: String
    /// The devices it lists.
    public var devices: [FixtureDevice]

    /// A source of `devices`.
    public init(_ devices: [FixtureDevice], name: String = "memory") {
        self.devices = devices
        self.name = name
    }

    /// Adds every device; the snapshot is a digest of them.
    public func load(into builder: inout InventoryBuilder) async throws -> InventorySnapshot {
        let source = builder.source(name)
        var digest = SHA256Digest()
        for (line, device) in devices.enumerated() {
            let labels = device.labels.sorted { $0.key < $1.key }
            digest.update(
                "\(device.id)\u{0}\(device.token)\u{0}\(labels.map { "\($0.key)=\($0.value)" }.joined(separator: ","))\n"
            )
            builder.add(
                id: device.id, token: device.token, labels: labels.map { ($0.key, $0.value) }, from: source,
                line: line + 1)
        }
        return InventorySnapshot(identity: digest.finalize())
    }
}
