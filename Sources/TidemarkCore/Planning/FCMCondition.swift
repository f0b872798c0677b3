/// An FCM topic condition such as `'TopicA' in topics && ('TopicB' in topics || 'TopicC' in topics)`.
///
/// Parsed as FCM documents it (reference §3.2): quoted topic atoms, `!`, `&&`, `||` and parentheses,
/// at most five topics, and operators of equal rank evaluated left to right once parentheses are
/// resolved. The emulator's send path and `tidemark audience` use this one parser.
public indirect enum FCMCondition: Sendable, Equatable, CustomStringConvertible {
    case topic(String)
    case not(FCMCondition)
    case and(FCMCondition, FCMCondition)
    case or(FCMCondition, FCMCondition)

    /// FCM's limit on topics in one condition.
    public static let maxTopics = 5
    /// The deepest nesting of parentheses and `!` accepted: far more than five topics can use, and
    /// bounded so that no input can exhaust the stack.
    public static let maxDepth = 32
    /// The longest condition accepted, in characters.
    public static let maxLength = 4096

    /// Whether an app instance subscribed to the topics that `isSubscribed` says yes to receives the message.
    public func matches(_ isSubscribed: (String) -> Bool) -> Bool {
        switch self {
        case .topic(let name): isSubscribed(name)
        case .not(let inner): !inner.matches(isSubscribed)
        case .and(let lhs, let rhs): lhs.matches(isSubscribed) && rhs.matches(isSubscribed)
        case .or(let lhs, let rhs): lhs.matches(isSubscribed) || rhs.matches(isSubscribed)
        }
    }

    /// The topic atoms, in order of appearance (repeats included).
    public var topics: [String] {
        switch self {
        case .topic(let name): [name]
        case .not(let inner): inner.topics
        case .and(let lhs, let rhs), .or(let lhs, let rhs): lhs.topics + rhs.topics
        }
    }

    /// The condition with every operation parenthesised, so the evaluation order is explicit.
    public var description: String {
        switch self {
        case .topic(let name): "'\(name)' in topics"
        case .not(let inner): "!(\(inner))"
        case .and(let lhs, let rhs): "(\(lhs) && \(rhs))"
        case .or(let lhs, let rhs): "(\(lhs) || \(rhs))"
        }
    }

    /// Parses `text`; the error names the column and what was expected.
    public static func parse(_ text: String) throws(ConditionError) -> FCMCondition {
        guard text.utf8.count <= maxLength else {
            throw ConditionError(
                column: maxLength + 1,
                message: "the condition is \(text.utf8.count) bytes long; tidemark reads at most \(maxLength)")
        }
        var parser = ConditionParser(text)
        let condition = try parser.parseExpression()
        guard parser.atEnd else { throw parser.error("expected '&&', '||' or the end of the condition") }
        return condition
    }
}

/// Why a condition does not parse.
public struct ConditionError: TidemarkError, Equatable {
    /// `invalid_condition`.
    public var reason: FailureReason { "invalid_condition" }

    /// 1-based column of the problem.
    public var column: Int
    /// What is wrong there.
    public var message: String

    /// "Invalid condition at column N: …."
    public var description: String { "Invalid condition at column \(column): \(message)." }
}

struct ConditionParser {
    private let scalars: [Unicode.Scalar]
    private var index = 0
    private var depth = 0
    private var topics = 0

    init(_ text: String) { scalars = Array(text.unicodeScalars) }

    var atEnd: Bool {
        mutating get {
            skipSpaces()
            return index == scalars.count
        }
    }

    func error(_ message: String) -> ConditionError { ConditionError(column: index + 1, message: message) }

    private mutating func skipSpaces() {
        while index < scalars.count, scalars[index].properties.isWhitespace { index += 1 }
    }

    private mutating func consume(_ literal: String) -> Bool {
        skipSpaces()
        let wanted = Array(literal.unicodeScalars)
        guard index + wanted.count <= scalars.count, Array(scalars[index..<index + wanted.count]) == wanted else {
            return false
        }
        index += wanted.count
        return true
    }

    /// expression := unary (('&&' | '||') unary)*, folded left to right.
    mutating func parseExpression() throws(ConditionError) -> FCMCondition {
        var result = try parseUnary()
        while true {
            if consume("&&") {
                result = .and(result, try parseUnary())
            } else if consume("||") {
                result = .or(result, try parseUnary())
            } else {
                return result
            }
        }
    }

    private mutating func parseUnary() throws(ConditionError) -> FCMCondition {
        if consume("!") {
            try deeper()
            defer { depth -= 1 }
            return .not(try parseUnary())
        }
        if consume("(") {
            try deeper()
            defer { depth -= 1 }
            let inner = try parseExpression()
            guard consume(")") else { throw error("expected ')'") }
            return inner
        }
        return try parseAtom()
    }

    private mutating func deeper() throws(ConditionError) {
        depth += 1
        guard depth <= FCMCondition.maxDepth else {
            throw error(
                "'!' and parentheses nest more than \(FCMCondition.maxDepth) deep; FCM conditions name at most \(FCMCondition.maxTopics) topics, so no useful condition needs this"
            )
        }
    }

    /// atom := "'" topic "'" 'in' 'topics'
    private mutating func parseAtom() throws(ConditionError) -> FCMCondition {
        skipSpaces()
        guard index < scalars.count else { throw error("expected a topic such as 'news' in topics, found the end") }
        if scalars[index] == "\"" { throw error("topic names are quoted with single quotes, not double quotes") }
        guard scalars[index] == "'" else { throw error("expected a topic such as 'news' in topics, '!' or '('") }
        let start = index + 1
        var end = start
        while end < scalars.count, scalars[end] != "'" { end += 1 }
        guard end < scalars.count else { throw error("the quoted topic name is not closed") }
        let name = String(String.UnicodeScalarView(scalars[start..<end]))
        if let problem = FCMLimits.topicNameProblem(name) {
            throw ConditionError(column: start + 1, message: "invalid topic name '\(name)': \(problem)")
        }
        topics += 1
        guard topics <= FCMCondition.maxTopics else {
            throw ConditionError(
                column: start,
                message:
                    "the condition names more than \(FCMCondition.maxTopics) topics; FCM allows at most \(FCMCondition.maxTopics)"
            )
        }
        index = end + 1
        guard consume("in"), requireWordBoundary(), consume("topics"), requireWordBoundary() else {
            throw error("expected 'in topics' after '\(name)'")
        }
        return .topic(name)
    }

    private func requireWordBoundary() -> Bool {
        guard index < scalars.count else { return true }
        let next = scalars[index]
        return !(next.properties.isAlphabetic || ("0"..."9").contains(next))
    }
}
