import Testing
import TidemarkCore

/// `tidemark fmt --diff`'s diffs read as `diff -u` prints them.
struct UnifiedDiffTests {
    @Test func hunksCarryThreeLinesOfContextAndTheirRanges() {
        let old = (1...20).map { "line \($0)" }.joined(separator: "\n") + "\n"
        var lines = (1...20).map { "line \($0)" }
        lines[1] = "line 2 changed"
        lines.remove(at: 15)
        lines.insert("added", at: 18)
        let new = lines.joined(separator: "\n") + "\n"
        let diff = UnifiedDiff.render(old, new, oldName: "a.yaml", newName: "a.yaml (formatted)")
        #expect(
            diff == """
                --- a.yaml
                +++ a.yaml (formatted)
                @@ -1,5 +1,5 @@
                 line 1
                -line 2
                +line 2 changed
                 line 3
                 line 4
                 line 5
                @@ -13,8 +13,8 @@
                 line 13
                 line 14
                 line 15
                -line 16
                 line 17
                 line 18
                 line 19
                +added
                 line 20

                """)
    }

    @Test func equalTextsHaveNoDiffAndAMissingLastNewlineIsSaid() {
        #expect(UnifiedDiff.render("a\nb\n", "a\nb\n", oldName: "x", newName: "y").isEmpty)
        #expect(UnifiedDiff.render("a\nb", "a\nb\n", oldName: "x", newName: "y").contains("only the newline"))
        #expect(UnifiedDiff.render("", "a\n", oldName: "x", newName: "y") == "--- x\n+++ y\n@@ -0,0 +1 @@\n+a\n")
    }
}
