import Foundation

/// Turns member references into token sets and checks the manifests against FCM's limits.
public struct Resolver {
    /// The manifests, merged.
    public let manifests: ManifestSet
    /// The devices selectors and device lists resolve against.
    public let inventory: Inventory
    /// Where token files are read from.
    public let files: FileSource
    /// The largest token file read (`limits.token_file_bytes`).
    public var tokenFileBytes = InputLimits().tokenFileBytes

    /// A resolver of `manifests` against `inventory`.
    public init(manifests: ManifestSet, inventory: Inventory, files: FileSource) {
        self.manifests = manifests
        self.inventory = inventory
        self.files = files
    }

    /// Resolves every topic and group; ids are interned into `table`.
    public func resolve(into table: inout some TokenInterning) -> (DesiredState, [Diagnostic]) {
        var context = Context(inventory: inventory, files: files, tokenFileBytes: tokenFileBytes)
        context.deviceTokenIDs.reserveCapacity(inventory.count)
        table.reserveCapacity(table.count + inventory.count)
        // The inventory usually lists devices in the order state first met them: try the id after
        // the previous one before hashing (a sequential string compare instead of a random probe).
        var hint = 0
        for token in inventory.tokens {
            let id = hint < table.count && table.token(UInt32(hint)) == token ? UInt32(hint) : table.intern(token)
            context.deviceTokenIDs.append(id)
            hint = Int(id) + 1
        }
        var diagnostics: [Diagnostic] = []
        var topics: [DesiredTopic] = []
        var seenTopics: [String: SourceLocation] = [:]
        for spec in manifests.topics {
            let name = spec.name.value
            if let problem = FCMLimits.topicNameProblem(name) {
                diagnostics.append(.error("invalid topic name '\(name)': \(problem).", at: spec.name.location))
            }
            if let first = seenTopics[name] {
                diagnostics.append(
                    .error(
                        "topic '\(name)' is defined twice: here and at \(first); merge the two definitions.",
                        at: spec.name.location))
                continue
            }
            seenTopics[name] = spec.name.location
            var parts: [TokenSet] = []
            let diagnosticsBefore = diagnostics.count
            let members = context.resolve(
                spec.members, owner: "topic '\(name)'", table: &table, &diagnostics, parts: &parts)
            // An entry that could not be read (a file refused, a misspelt key) was reported: an empty
            // result then says nothing about what the author meant, and "allow_empty" is no advice.
            let unread = spec.incomplete || diagnostics[diagnosticsBefore...].contains { $0.severity == .error }
            // Each entry's own devices, to say why a device joins (kept only when there are several).
            let entries = zip(spec.members, parts).map { MemberEntry(ref: $0, ids: spec.members.count > 1 ? $1 : nil) }
            if members.isEmpty, !spec.allowEmpty, !unread {
                diagnostics.append(
                    .error(
                        "topic '\(name)' has no members; add members or set 'allow_empty: true' to unsubscribe everyone tidemark manages.",
                        at: spec.name.location))
            }
            var topic = DesiredTopic(
                name: name, mode: spec.mode, protect: spec.protect, allowEmpty: spec.allowEmpty,
                optOuts: spec.optOuts, members: members, location: spec.name.location, entries: entries)
            topic.maxUnsubscribes = spec.maxUnsubscribes
            topics.append(topic)
        }
        var groups: [DesiredGroup] = []
        var seenGroups: [String: SourceLocation] = [:]
        for spec in manifests.groups {
            let name = spec.name.value
            if let first = seenGroups[name] {
                diagnostics.append(
                    .error(
                        "device group '\(name)' is defined twice: here and at \(first); merge the two definitions.",
                        at: spec.name.location))
                continue
            }
            seenGroups[name] = spec.name.location
            let diagnosticsBefore = diagnostics.count
            let members = context.resolve(spec.members, owner: "group '\(name)'", table: &table, &diagnostics)
            let unread = spec.incomplete || diagnostics[diagnosticsBefore...].contains { $0.severity == .error }
            if members.count > FCMLimits.maxGroupMembers {
                diagnostics.append(
                    .error(
                        "device group '\(name)' has \(members.count) members; FCM allows at most \(FCMLimits.maxGroupMembers) per group. Split it or narrow its members.",
                        at: spec.name.location))
            }
            if members.isEmpty, !unread {
                diagnostics.append(
                    .error(
                        "device group '\(name)' has no members; FCM deletes empty groups. Remove the group to delete it.",
                        at: spec.name.location))
            }
            groups.append(
                DesiredGroup(name: name, protect: spec.protect, members: members, location: spec.name.location))
        }
        var audiences: [DesiredGroup] = []
        var seenAudiences: [String: SourceLocation] = [:]
        for spec in manifests.audiences {
            let name = spec.name.value
            if name.isEmpty {
                diagnostics.append(.error("an audience's 'name' is empty.", at: spec.name.location))
                continue
            }
            if let first = seenAudiences[name] {
                diagnostics.append(
                    .error(
                        "audience '\(name)' is defined twice: here and at \(first); merge the two definitions.",
                        at: spec.name.location))
                continue
            }
            if let group = seenGroups[name] {
                diagnostics.append(
                    .error(
                        "'\(name)' is declared both as a device group (at \(group)) and as an audience; converting a group to an audience moves it from 'groups:' to 'audiences:'. Keep one.",
                        at: spec.name.location))
                continue
            }
            seenAudiences[name] = spec.name.location
            let members = context.resolve(spec.members, owner: "audience '\(name)'", table: &table, &diagnostics)
            audiences.append(
                DesiredGroup(
                    name: name, protect: spec.protect, members: members, location: spec.name.location,
                    retireGroupKey: spec.retireGroupKey))
        }
        diagnostics += checkTopicsPerToken(topics, table: table)
        let known = TokenSet(context.deviceTokenIDs).union(TokenSet(context.namedTokens))
        var desired = DesiredState(topics: topics, groups: groups, audiences: audiences, knownTokens: known)
        let released = releases(declared: [.topic: seenTopics, .group: seenGroups, .audience: seenAudiences])
        desired.released = released.addresses
        diagnostics += released.diagnostics
        return (desired, diagnostics)
    }

    /// The `removed:` entries that release (`unsubscribe: false`), refusing an entry that names what
    /// the manifests still declare, and a name listed twice. An entry with `unsubscribe: true` keeps
    /// the meaning of deleting the declaration: tidemark removes what it made.
    private func releases(
        declared: [StateAddress.Kind: [String: SourceLocation]]
    ) -> (addresses: [DesiredRelease], diagnostics: [Diagnostic]) {
        var result: (addresses: [DesiredRelease], diagnostics: [Diagnostic]) = ([], [])
        var seen: [StateAddress: SourceLocation] = [:]
        for entry in manifests.removed {
            let address = entry.address
            if let first = seen[address] {
                result.diagnostics.append(
                    .error(
                        "\(address) is listed under 'removed' twice: here and at \(first); keep one entry.",
                        at: entry.location))
                continue
            }
            seen[address] = entry.location
            // A group and an audience share a name space in state: either declaration keeps it managed.
            let kinds: [StateAddress.Kind] = entry.kind == .topic ? [.topic] : [.group, .audience]
            if let kind = kinds.first(where: { declared[$0]?[entry.name.value] != nil }),
                let at = declared[kind]?[entry.name.value]
            {
                result.diagnostics.append(
                    .error(
                        "\(address) is listed under 'removed' but \(kind == .group ? "'groups:'" : kind == .audience ? "'audiences:'" : "'topics:'") still declares '\(entry.name.value)' (at \(at)); delete the declaration to let it go, or this entry to keep managing it.",
                        at: entry.location))
                continue
            }
            if !entry.unsubscribe { result.addresses.append(DesiredRelease(address, at: entry.location)) }
        }
        return result
    }

    private func checkTopicsPerToken(_ topics: [DesiredTopic], table: some TokenInterning) -> [Diagnostic] {
        var counts = [UInt16](repeating: 0, count: table.count)
        for topic in topics {
            for id in topic.members { counts[Int(id)] &+= 1 }
        }
        var diagnostics: [Diagnostic] = []
        var over = 0
        for (id, count) in counts.enumerated() where Int(count) > FCMLimits.maxTopicsPerToken {
            over += 1
            guard over <= 10 else { continue }
            let token = table.token(UInt32(id))
            if let device = inventory.index(ofToken: token) {
                diagnostics.append(
                    .error(
                        "device '\(inventory.deviceIDs[device])' would be subscribed to \(count) topics; FCM allows \(FCMLimits.maxTopicsPerToken) per app instance. Narrow the selectors that match it.",
                        at: inventory.location(ofDevice: device)))
            } else {
                diagnostics.append(
                    .error(
                        "token \(Redaction.redact(token)) would be subscribed to \(count) topics; FCM allows \(FCMLimits.maxTopicsPerToken) per app instance."
                    ))
            }
        }
        if over > 10 {
            diagnostics.append(.error("\(over - 10) more devices would pass \(FCMLimits.maxTopicsPerToken) topics."))
        }
        return diagnostics
    }

    struct Context {
        let inventory: Inventory
        let files: FileSource
        var deviceTokenIDs: [UInt32] = []
        var namedTokens: [UInt32] = []
        var postings: [String: [[Int32]]] = [:]
        var tokenFiles: [String: [String]] = [:]
        let tokenFileBytes: Int

        init(inventory: Inventory, files: FileSource, tokenFileBytes: Int) {
            self.inventory = inventory
            self.files = files
            self.tokenFileBytes = tokenFileBytes
        }

        mutating func resolve(
            _ refs: [MemberRef], owner: String, table: inout some TokenInterning,
            _ diagnostics: inout [Diagnostic]
        ) -> TokenSet {
            var parts: [TokenSet] = []
            return resolve(refs, owner: owner, table: &table, &diagnostics, parts: &parts)
        }

        /// `resolve`, also handing back each entry's own set, in order.
        mutating func resolve(
            _ refs: [MemberRef], owner: String, table: inout some TokenInterning,
            _ diagnostics: inout [Diagnostic], parts: inout [TokenSet]
        ) -> TokenSet {
            parts = []
            for ref in refs {
                switch ref {
                case .tokens(let tokens):
                    var ids: [UInt32] = []
                    for token in tokens {
                        if let problem = FCMLimits.tokenProblem(token.value) {
                            diagnostics.append(
                                .error("member of \(owner) is not a valid token: \(problem).", at: token.location))
                            continue
                        }
                        let id = table.intern(token.value)
                        namedTokens.append(id)
                        ids.append(id)
                    }
                    parts.append(TokenSet(ids))
                case .devices(let devices):
                    var ids: [UInt32] = []
                    for device in devices {
                        guard let index = inventory.index(ofDevice: device.value) else {
                            var message = "unknown device '\(device.value)' in \(owner)"
                            if inventory.count < 100_000, let near = nearest(device.value, in: inventory.deviceIDs) {
                                message += "; did you mean '\(near)'?"
                            } else {
                                message += "; declare it in the inventory first."
                            }
                            diagnostics.append(.error(message, at: device.location))
                            continue
                        }
                        ids.append(deviceTokenIDs[index])
                    }
                    parts.append(TokenSet(ids))
                case .selector(let requirements, let location):
                    parts.append(select(requirements, at: location, owner: owner, &diagnostics))
                case .file(let path):
                    parts.append(tokensFromFile(path, owner: owner, table: &table, &diagnostics))
                }
            }
            return TokenSet.union(of: parts)
        }

        private mutating func postingsFor(_ key: String) -> [[Int32]]? {
            if let cached = postings[key] { return cached }
            guard let lists = inventory.postings(forLabel: key) else { return nil }
            postings[key] = lists
            return lists
        }

        private mutating func select(
            _ requirements: [LabelRequirement], at location: SourceLocation, owner: String,
            _ diagnostics: inout [Diagnostic]
        ) -> TokenSet {
            var positive: [Int32]?
            var negative: [[Int32]] = []
            for requirement in requirements {
                guard let lists = postingsFor(requirement.key) else {
                    var message = "unknown label '\(requirement.key)' in the selector of \(owner)"
                    if let near = nearest(requirement.key, in: inventory.labelKeys) {
                        message += "; did you mean '\(near)'?"
                    } else if inventory.labelKeys.isEmpty {
                        message += "; the inventory has no labels."
                    } else {
                        message += "; the inventory has \(inventory.labelKeys.sorted().joined(separator: ", "))."
                    }
                    diagnostics.append(.error(message, at: requirement.location))
                    return TokenSet()
                }
                func devices(_ values: [String]) -> [Int32] {
                    let matched = values.compactMap { inventory.valueNumber(requirement.key, $0) }.map { lists[$0] }
                    return matched.count == 1 ? matched[0] : matched.flatMap { $0 }.sorted()
                }
                switch requirement.op {
                case .equals(let value):
                    positive = intersect(positive, devices([value]))
                case .inSet(let values):
                    positive = intersect(positive, devices(values))
                case .notEquals(let value):
                    negative.append(devices([value]))
                case .notInSet(let values):
                    negative.append(devices(values))
                }
            }
            var matched: [Int32]
            if let positive {
                matched = positive
            } else {
                matched = Array(0..<Int32(inventory.count))
            }
            for excluded in negative where !excluded.isEmpty {
                matched = TokenSet(sorted: matched.map { UInt32($0) })
                    .subtracting(TokenSet(sorted: excluded.map { UInt32($0) })).ids.map { Int32($0) }
            }
            if matched.isEmpty {
                diagnostics.append(
                    .error("the selector of \(owner) matches no device; \(describe(requirements)).", at: location))
            }
            return TokenSet(matched.map { deviceTokenIDs[Int($0)] })
        }

        private func describe(_ requirements: [LabelRequirement]) -> String {
            requirements.map { requirement in
                let known = inventory.values(ofLabel: requirement.key)
                let wanted: [String]
                switch requirement.op {
                case .equals(let v), .notEquals(let v): wanted = [v]
                case .inSet(let v), .notInSet(let v): wanted = v
                }
                let missing = wanted.filter { !known.contains($0) }
                if let first = missing.first {
                    if let near = nearest(first, in: known) {
                        return "label '\(requirement.key)' has no value '\(first)' (did you mean '\(near)'?)"
                    }
                    return "label '\(requirement.key)' has no value '\(first)'"
                }
                return
                    "label '\(requirement.key)' is \(known.count == 1 ? "only" : "one of") \(known.sorted().prefix(8).joined(separator: ", "))"
            }.joined(separator: "; ")
        }

        private func intersect(_ a: [Int32]?, _ b: [Int32]) -> [Int32] {
            guard let a else { return b }
            return TokenSet.intersection(a, b)
        }

        private mutating func tokensFromFile(
            _ path: Located<String>, owner: String, table: inout some TokenInterning,
            _ diagnostics: inout [Diagnostic]
        ) -> TokenSet {
            if tokenFiles[path.value] == nil {
                let data: Data
                do {
                    data = try files.read(path.value, atMost: tokenFileBytes, setting: "token_file_bytes")
                } catch {
                    diagnostics.append(
                        .error(
                            "cannot read token file '\(path.value)' named by \(owner): \(ErrorText.describe(error)) (paths are relative to the manifests directory).",
                            at: path.location))
                    return TokenSet()
                }
                // Another encoding, an archive or a binary file is named for what it is, once.
                if let problem = InputFile.notTextProblem(data) {
                    diagnostics.append(
                        .error(
                            "cannot read token file '\(path.value)' named by \(owner): \(problem.problem); a token file is UTF-8 text, one registration token per line.",
                            at: path.location))
                    tokenFiles[path.value] = []
                    return TokenSet()
                }
                var tokens: [String] = []
                var bad = 0
                let display = files.displayPath(path.value)
                // Lines by bytes, so CRLF line endings (a "\r\n" is one Character) end lines too.
                TokenFileLines.each(data) { line, text in
                    if text.isEmpty || text.hasPrefix("#") { return }
                    if let problem = FCMLimits.tokenProblem(text) {
                        bad += 1
                        // The first lines of a kind are listed; the rest are counted (a file of a
                        // million bad lines is one screen, not a million lines).
                        if bad <= YAMLDocument.repeatLimit {
                            diagnostics.append(
                                .error(
                                    "line is not a registration token: \(problem).",
                                    at: SourceLocation(file: display, line: line, column: 1)))
                        }
                        return
                    }
                    tokens.append(text)
                }
                if bad > YAMLDocument.repeatLimit {
                    diagnostics.append(
                        .error(
                            "\(bad - YAMLDocument.repeatLimit) more lines are not registration tokens (\(bad) in all); only the first \(YAMLDocument.repeatLimit) are listed.",
                            at: SourceLocation(file: display, line: 1, column: 1)))
                }
                tokenFiles[path.value] = tokens
            }
            let ids = (tokenFiles[path.value] ?? []).map { table.intern($0) }
            namedTokens.append(contentsOf: ids)
            return TokenSet(ids)
        }
    }
}

extension Resolver {
    /// Which member entries of each topic and group name `id` (a token id of `table`, after `resolve`
    /// interned the manifests into it), by `State.versionKey`: the same rules as `resolve`, one entry
    /// at a time, so a device's view says why it is in each.
    public func entries(naming id: UInt32, table: inout some TokenInterning) -> [String: [MemberRef]] {
        var context = Context(inventory: inventory, files: files, tokenFileBytes: tokenFileBytes)
        for token in inventory.tokens { context.deviceTokenIDs.append(table.intern(token)) }
        var ignored: [Diagnostic] = []
        var result: [String: [MemberRef]] = [:]
        func check(_ refs: [MemberRef], owner: String, key: String) {
            for ref in refs where context.resolve([ref], owner: owner, table: &table, &ignored).contains(id) {
                result[key, default: []].append(ref)
            }
        }
        for spec in manifests.topics {
            check(spec.members, owner: "topic '\(spec.name.value)'", key: State.versionKey(.topic, spec.name.value))
        }
        for spec in manifests.groups {
            check(spec.members, owner: "group '\(spec.name.value)'", key: State.versionKey(.group, spec.name.value))
        }
        for spec in manifests.audiences {
            check(
                spec.members, owner: "audience '\(spec.name.value)'", key: State.versionKey(.group, spec.name.value))
        }
        return result
    }
}

extension MemberRef {
    /// "selector {team: t0, platform: [ios, android]} at manifests/scores.yaml:4", for a device's view.
    public var explanation: String { "\(cause) at \(location.map { "\($0)" } ?? "?")" }

    /// What the entry is, without where: "selector {team: t0}", "token file 'beta.txt'".
    public var cause: String {
        switch self {
        case .tokens: return "listed by token"
        case .devices: return "listed by device id"
        case .selector(let requirements, _):
            let parts = requirements.map { r -> String in
                switch r.op {
                case .equals(let v): return "\(r.key): \(v)"
                case .inSet(let vs): return "\(r.key): [\(vs.joined(separator: ", "))]"
                case .notEquals(let v): return "\(r.key): {not: \(v)}"
                case .notInSet(let vs): return "\(r.key): {not: [\(vs.joined(separator: ", "))]}"
                }
            }
            return "selector {\(parts.joined(separator: ", "))}"
        case .file(let path):
            return "token file '\(path.value)'"
        }
    }

    /// Where the entry is in the manifests.
    public var location: SourceLocation? {
        switch self {
        case .tokens(let tokens): tokens.first?.location
        case .devices(let devices): devices.first?.location
        case .selector(_, let location): location
        case .file(let path): path.location
        }
    }
}

/// The lines of a token file: split at LF, a CR before it and surrounding blanks dropped, a leading
/// UTF-8 byte order mark ignored.
enum TokenFileLines {
    static func each(_ data: Data, _ body: (_ line: Int, _ text: String) -> Void) {
        data.withUnsafeBytes { (raw: UnsafeRawBufferPointer) in
            let bytes = raw.bindMemory(to: UInt8.self)
            var start = bytes.starts(with: InputFile.utf8BOM) ? 3 : 0
            var line = 0
            while start <= bytes.count {
                var end = start
                while end < bytes.count, bytes[end] != 0x0A { end += 1 }
                line += 1
                var (a, b) = (start, end)
                while a < b, bytes[a] == 0x20 || bytes[a] == 0x09 || bytes[a] == 0x0D { a += 1 }
                while b > a, bytes[b - 1] == 0x20 || bytes[b - 1] == 0x09 || bytes[b - 1] == 0x0D { b -= 1 }
                if end < bytes.count || a < b {
                    body(line, String(decoding: UnsafeBufferPointer(rebasing: bytes[a..<b]), as: UTF8.self))
                }
                start = end + 1
            }
        }
    }
}
