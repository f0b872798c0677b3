import Foundation

extension Plan {
    /// The plan with every registration token and device-group key it holds passed through
    /// `transform`: the operations' tokens, what the refresh observed (memberships, dead and revived
    /// registrations, group keys), rotations, departures, the sweep's matches and a shadow verify's
    /// differences. A field added to a plan that holds a token must be mapped here: a sealed plan's
    /// readable part is made with it (`SealedPlan` in TidemarkRuntime), and its test looks for every
    /// token in the file.
    public func mappingTokens(_ transform: (String) -> String) -> Plan {
        var plan = self
        plan.operations = operations.map { op in
            var op = op
            op.tokens = op.tokens.map(transform)
            return op
        }
        plan.observations.topics = observations.topics.map { delta in
            var delta = delta
            delta.subscribed = delta.subscribed.map(transform)
            delta.unsubscribed = delta.unsubscribed.map(transform)
            return delta
        }
        plan.observations.dead = observations.dead.map(transform)
        plan.observations.revived = observations.revived.map(transform)
        plan.observations.groupKeys = observations.groupKeys.map { key in
            var key = key
            key.key = key.key.map(transform)
            return key
        }
        plan.rotations = rotations?.map { rotation in
            var rotation = rotation
            rotation.from = transform(rotation.from)
            rotation.to = transform(rotation.to)
            return rotation
        }
        plan.departed = departed?.map { departure in
            var departure = departure
            departure.token = transform(departure.token)
            return departure
        }
        plan.sweptMatching = sweptMatching?.map(transform)
        if var verify = shadowVerify {
            verify.differences = verify.differences.map { difference in
                var difference = difference
                difference.token = transform(difference.token)
                return difference
            }
            plan.shadowVerify = verify
        }
        if operationsDigestWhenMade != nil { plan.operationsDigestWhenMade = plan.operationsDigest }
        return plan
    }

    /// The plan as it may be read by anyone: every token and group key redacted (`Redaction.redact`),
    /// which is also all that its text and markdown renderings show of them.
    public var redacted: Plan { mappingTokens(Redaction.redact) }
}
