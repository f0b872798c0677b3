/// The shape of a plan tidemark could have written, checked before a saved plan is rendered or
/// applied: `tidemark show`, `tidemark apply PLAN` and anything else that reads one go through
/// `Plan.decodeSaved`, which calls this. A file that passes the digest check can still have been
/// forged whole (a digest is not a signature): every operation must be one the planner makes.
extension Plan {
    /// The first way this plan differs from what tidemark writes, as a sentence naming the operation,
    /// or nil when it has the shape of one of tidemark's plans.
    public var shapeProblem: String? {
        for (index, op) in operations.enumerated() {
            let which = "operation \(index + 1) (\(op.kind.rawValue) \(Self.quoted(op.target)))"
            switch op.kind {
            case .subscribe, .unsubscribe:
                if op.tokens.isEmpty { return "\(which) names no registration token; tidemark writes no empty batch" }
                if op.tokens.count > FCMLimits.maxBatchTokens {
                    return
                        "\(which) carries \(op.tokens.count) registration tokens, more than the \(FCMLimits.maxBatchTokens) FCM takes in one batch and tidemark writes"
                }
            case .groupCreate, .groupAdd, .groupRemove:
                if op.tokens.isEmpty {
                    return "\(which) names no registration token; tidemark writes no empty group call"
                }
                if op.tokens.count > FCMLimits.maxGroupMembers {
                    return
                        "\(which) carries \(op.tokens.count) registration tokens, more than the \(FCMLimits.maxGroupMembers) members a device group holds"
                }
            case .audienceSet, .audienceDelete, .audienceUnlink, .topicAdopt, .topicRelease, .groupRelease:
                break
            }
            if op.kind.isGroup {
                if op.target.isEmpty { return "\(which) names no device group" }
                if let problem = FCMLimits.groupNameProblem(op.target) { return "\(which): its group name \(problem)" }
            } else if let problem = FCMLimits.topicNameProblem(op.target) {
                return "\(which) is not for a topic FCM accepts: \(problem)"
            }
            for token in op.tokens {
                if let problem = Self.tokenShapeProblem(token) { return "\(which) carries a token that \(problem)" }
            }
        }
        for tokens in observations.topics.flatMap({ [$0.subscribed, $0.unsubscribed] })
            + [observations.dead, observations.revived]
        {
            for token in tokens {
                if let problem = Self.tokenShapeProblem(token) {
                    return "its observations hold a token that \(problem)"
                }
            }
        }
        for rotation in rotations ?? [] {
            for token in [rotation.from, rotation.to] {
                if let problem = Self.tokenShapeProblem(token) { return "its rotations hold a token that \(problem)" }
            }
        }
        for departure in departed ?? [] {
            if let problem = Self.tokenShapeProblem(departure.token) {
                return "its departed devices hold a token that \(problem)"
            }
        }
        return nil
    }

    /// Why `token` is not one a saved plan holds (a registration ID FCM issues, or one redacted as a
    /// sealed plan's readable part shows it), or nil.
    static func tokenShapeProblem(_ token: String) -> String? {
        if Redaction.isRedacted(token) { return nil }
        guard let problem = FCMLimits.tokenProblem(token) else { return nil }
        return "is not a registration token (\(problem))"
    }

    /// `name` quoted for a message: on one line, cut short.
    static func quoted(_ name: String) -> String {
        let shown = name.count > 60 ? String(name.prefix(60)) + "…" : name
        return "'\(shown.escapedOnOneLine)'"
    }
}
