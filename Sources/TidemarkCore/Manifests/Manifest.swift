/// A value together with where the user wrote it.
public struct Located<Value: Sendable>: Sendable {
    public var value: Value
    public var location: SourceLocation

    public init(_ value: Value, at location: SourceLocation) {
        self.value = value
        self.location = location
    }
}

extension Located: Equatable where Value: Equatable {}

/// How tidemark treats subscriptions to a topic that the manifests do not declare.
public enum TopicMode: String, Sendable, Codable, CaseIterable {
    /// Ensure the declared members are subscribed; remove only memberships tidemark itself made earlier.
    case additive
    /// Among known devices, the membership is exactly the declared set.
    case authoritative

    /// What a device that unsubscribes itself gets by default: respected in additive topics, undone in
    /// authoritative ones.
    public var defaultOptOuts: OptOutPolicy { self == .additive ? .respect : .restore }
}

/// What tidemark does about a device that unsubscribed itself (a user's choice in the app).
public enum OptOutPolicy: String, Sendable, Codable, CaseIterable {
    /// Leave it unsubscribed, shown as "opted out", until the device subscribes itself again.
    case respect
    /// Subscribe it again: the manifests decide.
    case restore
}

/// One condition of a label selector.
public struct LabelRequirement: Sendable, Equatable {
    public enum Operator: Sendable, Equatable {
        case equals(String)
        case inSet([String])
        case notEquals(String)
        case notInSet([String])
    }

    public var key: String
    public var op: Operator
    public var location: SourceLocation

    public init(key: String, op: Operator, location: SourceLocation) {
        self.key = key
        self.op = op
        self.location = location
    }
}

/// Who a topic or group member entry names.
public enum MemberRef: Sendable, Equatable {
    case tokens([Located<String>])
    case devices([Located<String>])
    /// All requirements must hold (AND).
    case selector([LabelRequirement], SourceLocation)
    case file(Located<String>)
}

public struct TopicSpec: Sendable {
    public var name: Located<String>
    public var mode: TopicMode = .additive
    public var protect = false
    public var allowEmpty = false
    /// nil: the mode's default.
    public var optOuts: OptOutPolicy?
    public var description: String?
    public var members: [MemberRef] = []
    public var location: SourceLocation
    /// Its decoding reported an error (a misspelt key, a bad value): what it lists may not be all
    /// its author meant, so "no members" is not concluded from it.
    public var incomplete = false

    public init(name: Located<String>, location: SourceLocation) {
        self.name = name
        self.location = location
    }
}

public struct GroupSpec: Sendable {
    public var name: Located<String>
    public var protect = false
    /// Audiences only: the app no longer sends to the key of the FCM group this audience was
    /// converted from, so the group may be deleted in FCM.
    public var retireGroupKey = false
    public var description: String?
    public var members: [MemberRef] = []
    public var location: SourceLocation
    /// Its decoding reported an error: "no members" is not concluded from it.
    public var incomplete = false

    public init(name: Located<String>, location: SourceLocation) {
        self.name = name
        self.location = location
    }
}

/// A device declared inline in a manifest.
public struct DeviceSpec: Sendable {
    public var id: Located<String>
    public var token: Located<String>
    public var labels: [String: String]

    public init(id: Located<String>, token: Located<String>, labels: [String: String]) {
        self.id = id
        self.token = token
        self.labels = labels
    }
}

/// All manifest files of a project, merged.
public struct ManifestSet: Sendable {
    public var topics: [TopicSpec] = []
    public var groups: [GroupSpec] = []
    /// tidemark audiences: named sets of devices kept in state, with no FCM group behind them.
    public var audiences: [GroupSpec] = []
    /// Inventory files (CSV or JSON lines), paths relative to the manifests directory.
    public var inventoryFiles: [InventoryFileSpec] = []
    public var devices: [DeviceSpec] = []
    /// The manifest files read, relative to the manifests directory, in order.
    public var files: [String] = []

    public init() {}
}

/// An inventory file the manifests name, and its format when they say it.
public struct InventoryFileSpec: Sendable {
    public var path: Located<String>
    /// nil: from the file's suffix.
    public var format: InventoryFormat?

    public init(path: Located<String>, format: InventoryFormat? = nil) {
        self.path = path
        self.format = format
    }
}
