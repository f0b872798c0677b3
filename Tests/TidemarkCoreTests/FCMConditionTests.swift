import Testing
import TidemarkCore

@Suite struct FCMConditionTests {
    @Test func parsesTheDocumentedExamples() throws {
        let c = try FCMCondition.parse("'TopicA' in topics && ('TopicB' in topics || 'TopicC' in topics)")
        #expect(c == .and(.topic("TopicA"), .or(.topic("TopicB"), .topic("TopicC"))))
        #expect(c.matches { ["TopicA", "TopicC"].contains($0) })
        #expect(!c.matches { ["TopicB", "TopicC"].contains($0) })
        #expect(try FCMCondition.parse("!('TopicA' in topics)").matches { _ in false })
        #expect(try FCMCondition.parse("!'a' in topics") == .not(.topic("a")))
    }

    @Test func unparenthesisedChainsRunLeftToRight() throws {
        // (A || B) && C, not A || (B && C).
        let c = try FCMCondition.parse("'A' in topics || 'B' in topics && 'C' in topics")
        #expect(c == .and(.or(.topic("A"), .topic("B")), .topic("C")))
        #expect(!c.matches { $0 == "A" })
    }

    @Test func rejectsWhatFCMRejects() {
        let cases: [(String, String)] = [
            ("\"A\" in topics", "single quotes"),
            ("'A' in topics &&", "found the end"),
            ("'A' in topic", "in topics"),
            ("('A' in topics", "expected ')'"),
            ("'A' in topics 'B' in topics", "expected '&&'"),
            ("'bad/name' in topics", "invalid topic name"),
            (
                "'a' in topics || 'b' in topics || 'c' in topics || 'd' in topics || 'e' in topics || 'f' in topics",
                "at most 5"
            ),
        ]
        for (text, fragment) in cases {
            #expect(throws: ConditionError.self) { try FCMCondition.parse(text) }
            do {
                _ = try FCMCondition.parse(text)
            } catch {
                #expect(error.description.contains(fragment), "\(text): \(error)")
            }
        }
    }
}
