/// A value together with where the user wrote it.
public struct Located<Value: Sendable>: Sendable {
    /// The value.
    public var value: Value
    /// Where it was written: file, line and column.
    public var location: SourceLocation

    /// `value` as written at `location`.
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
    /// How the label's value is compared.
    public enum Operator: Sendable, Equatable {
        case equals(String)
        case inSet([String])
        case notEquals(String)
        case notInSet([String])
    }

    /// The label's name.
    public var key: String
    /// How its value is compared.
    public var op: Operator
    /// Where the condition was written.
    public var location: SourceLocation

    /// A condition on label `key`.
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

/// A topic as a manifest declares it.
public struct TopicSpec: Sendable {
    /// The topic's name, where it was written.
    public var name: Located<String>
    /// Authoritative or additive (the default).
    public var mode: TopicMode = .additive
    /// `protect: true`: the topic never loses members without `--allow-protected`.
    public var protect = false
    /// `allow_empty: true`: the topic may resolve to no members (otherwise an error, since that would empty it).
    public var allowEmpty = false
    /// `max_unsubscribes: N|P%`: a plan that takes more members than this from the topic (a share of
    /// its known subscribers; rotated tokens are not counted) is refused.
    public var maxUnsubscribes: UnsubscribeLimit?
    /// nil: the mode's default.
    public var optOuts: OptOutPolicy?
    /// The manifest's `description`, for people.
    public var description: String?
    /// Its member entries, in order.
    public var members: [MemberRef] = []
    /// Where the topic's entry starts.
    public var location: SourceLocation
    /// Its decoding reported an error (a misspelt key, a bad value): what it lists may not be all
    /// its author meant, so "no members" is not concluded from it.
    public var incomplete = false

    /// A topic named `name` with the defaults.
    public init(name: Located<String>, location: SourceLocation) {
        self.name = name
        self.location = location
    }
}

/// A device group or an audience as a manifest declares it.
public struct GroupSpec: Sendable {
    /// The group's name (`notification_key_name`), where it was written.
    public var name: Located<String>
    /// `protect: true`: the group never loses members without `--allow-protected`.
    public var protect = false
    /// Audiences only: the app no longer sends to the key of the FCM group this audience was
    /// converted from, so the group may be deleted in FCM.
    public var retireGroupKey = false
    /// The manifest's `description`, for people.
    public var description: String?
    /// Its member entries, in order.
    public var members: [MemberRef] = []
    /// Where the group's entry starts.
    public var location: SourceLocation
    /// Its decoding reported an error: "no members" is not concluded from it.
    public var incomplete = false

    /// A group named `name` with the defaults.
    public init(name: Located<String>, location: SourceLocation) {
        self.name = name
        self.location = location
    }
}

/// A device declared inline in a manifest.
public struct DeviceSpec: Sendable {
    /// The device's id, where it was written.
    public var id: Located<String>
    /// Its registration token, where it was written.
    public var token: Located<String>
    /// Its labels, for selectors.
    public var labels: [String: String]

    /// A device with `id`, `token` and `labels`.
    public init(id: Located<String>, token: Located<String>, labels: [String: String]) {
        self.id = id
        self.token = token
        self.labels = labels
    }
}

/// All manifest files of a project, merged.
public struct ManifestSet: Sendable {
    /// The topics, from every file, in order.
    public var topics: [TopicSpec] = []
    /// The device groups, from every file, in order.
    public var groups: [GroupSpec] = []
    /// tidemark audiences: named sets of devices kept in state, with no FCM group behind them.
    public var audiences: [GroupSpec] = []
    /// Inventory files (CSV or JSON lines), paths relative to the manifests directory.
    public var inventoryFiles: [InventoryFileSpec] = []
    /// Devices declared inline in the manifests.
    public var devices: [DeviceSpec] = []
    /// Topics, groups and audiences leaving management (`removed:`), in order.
    public var removed: [RemovedSpec] = []
    /// The manifest files read, relative to the manifests directory, in order.
    public var files: [String] = []

    /// No manifests.
    public init() {}
}

/// An inventory file the manifests name, and its format when they say it.
public struct InventoryFileSpec: Sendable {
    /// The file's path, relative to the manifests directory, where it was named.
    public var path: Located<String>
    /// nil: from the file's suffix.
    public var format: InventoryFormat?

    /// An inventory file at `path`.
    public init(path: Located<String>, format: InventoryFormat? = nil) {
        self.path = path
        self.format = format
    }
}

/// A `removed:` entry: a topic, device group or audience leaving management.
public struct RemovedSpec: Sendable {
    /// What it names: a topic, a device group or an audience.
    public var kind: StateAddress.Kind
    /// Its name, where written.
    public var name: Located<String>
    /// `unsubscribe: true` removes the memberships tidemark made, as deleting the entry from the
    /// manifests does; `false` releases it: nothing is sent to FCM and state forgets it.
    public var unsubscribe: Bool
    /// Where the entry starts.
    public var location: SourceLocation

    /// The entry for `kind` `name`.
    public init(kind: StateAddress.Kind, name: Located<String>, unsubscribe: Bool, location: SourceLocation) {
        self.kind = kind
        self.name = name
        self.unsubscribe = unsubscribe
        self.location = location
    }

    /// `topic:NAME`, `group:NAME` or `audience:NAME`.
    public var address: StateAddress { StateAddress(kind, name.value) }
}
