import Foundation
import Testing
import TidemarkTesting

@testable import TidemarkCore

/// The third round of hostile input (issue 53): each class the campaign found, held by a test.
@Suite struct HostileInputRoundThreeTests {
    /// Every URL tidemark prints goes through one redaction: no password, no token as user name, no
    /// query value but how to connect (`sslmode`, `lease`…); where the request went (scheme, host, port,
    /// path, parameter names) stays.
    @Test func oneRedactionForEveryPrintedURL() {
        let cases: [(String, String)] = [
            ("http://user:PASSWORD@host:8080/token", "http://user:***@host:8080/token"),
            ("https://ghp_TOKENTOKEN@github.com/acme/x.git", "https://***@github.com/acme/x.git"),
            (
                "https://sts.example.com/v1/token?key=SECRET&alt=json",
                "https://sts.example.com/v1/token?key=***&alt=json"
            ),
            ("https://h/p?flag&x=", "https://h/p?***&x=***"),
            ("https://h/p#access_token=SECRET", "https://h/p"),
            ("https://a:b@c@host/p?q=1", "https://a:***@host/p?q=***"),
            ("http://host/a@b", "http://host/a@b"),
            ("git@github.com:acme/x.git", "git@github.com:acme/x.git"),
            ("postgres://tm:pw@db:5432/tm?sslmode=require", "postgres://tm:***@db:5432/tm?sslmode=require"),
            // How to connect stays readable; a value that could hide anything else does not.
            (
                "postgres://db/tm?sslmode=verify-full&lease=5&password=pw",
                "postgres://db/tm?sslmode=verify-full&lease=5&password=***"
            ),
            (
                "postgres://db/tm?application_name=a%20b&sslmode=x@y",
                "postgres://db/tm?application_name=***&sslmode=***"
            ),
            ("https://fcm.googleapis.com", "https://fcm.googleapis.com"),
        ]
        for (url, shown) in cases {
            #expect(URLRedaction.display(url) == shown, "\(url)")
        }
        let secrets = Set(URLRedaction.secrets(in: "https://u:p%40ss@h/x?sig=a%2Fb&n#frag"))
        #expect(secrets.isSuperset(of: ["p%40ss", "p@ss", "a%2Fb", "a/b", "n", "frag"]), "\(secrets)")
        // A server that quotes the request back: the secrets named are hidden, encoded or not.
        let quoted = QuotedAnswer.safe("bad request: ?s=abc/def&pw=p@ssword", hiding: ["abc/def", "p@ssword"])
        #expect(!quoted.contains("abc/def") && !quoted.contains("p@ssword"), "\(quoted)")
    }

    /// `unregistered:` lists only answers FCM sends: a typo would mark no token dead, silently.
    @Test func unregisteredTakesOnlyAnswersFCMSends() {
        let (settings, diagnostics) = ProjectSettings.decode(
            "project: my-project\nunregistered:\n  v1: [NOT_FOUND, not_found, UNREGISTERD]\n  iid: [NOT_FOUND, GONE]\n",
            file: "tidemark.yaml")
        let errors = diagnostics.filter { $0.severity == .error }
        #expect(errors.count == 3, "\(errors)")
        #expect(
            errors.contains {
                $0.message.contains("'UNREGISTERD'") && $0.message.contains("did you mean 'UNREGISTERED'")
            })
        #expect(errors.contains { $0.message.contains("'not_found'") && $0.location?.line == 3 })
        #expect(errors.contains { $0.message.contains("'GONE'") && $0.location?.line == 4 })
        #expect(settings.unregistered.v1 == ["NOT_FOUND"])
        let (_, clean) = ProjectSettings.decode(
            "project: my-project\nunregistered: {v1: [UNREGISTERED], iid: [NOT_FOUND]}\n", file: "tidemark.yaml")
        #expect(!clean.hasErrors, "\(clean)")
    }

    /// The loopback servers answer exactly the names they document.
    @Test func loopbackHostNamesAreExactlyTheDocumentedOnes() {
        for host in ["127.0.0.1", "127.0.0.1:9099", "localhost", "LOCALHOST:80", "[::1]", "[::1]:8080"] {
            #expect(LoopbackHost.accepts(host), "\(host)")
        }
        for host in [
            "[127.0.0.1]", "[127.0.0.1]:80", "[localhost]", "127.0.0.1:", "127.0.0.1:99999999", "127.0.0.1:\u{0663}",
            "evil.example", "127.0.0.1.evil.example", "", "[::2]", "a:b:c", "[::1",
        ] {
            #expect(!LoopbackHost.accepts(host), "\(host)")
        }
    }

    /// A thousand identical lines are one; a thousand of a kind are twenty and a count.
    @Test func diagnosticsArePrintedOnceAndBoundedByKind() {
        let location = SourceLocation(file: "m.yaml", line: 3, column: 5)
        var flood = Array(repeating: Diagnostic.error("topic 'news' is defined twice", at: location), count: 1000)
        flood += (0..<1000).map { .error("invalid topic name 'bad \($0)!': ' ' is not allowed", at: location) }
        flood.append(.warning("don't worry"))
        let shown = flood.condensed()
        #expect(shown.filter { $0.message.contains("defined twice") }.count == 1)
        #expect(shown.filter { $0.message.hasPrefix("invalid topic name") }.count == 20)
        #expect(
            shown.contains { $0.message.contains("980 more like") && $0.message.contains("1000 in all") }, "\(shown)")
        #expect(shown.contains { $0.message == "don't worry" })
        #expect(shown.count == 23)
    }

    /// A file two inventory declarations name (a glob and a name) is read once, with a warning; its
    /// rows are not duplicates of themselves.
    @Test func aFileNamedByTwoDeclarationsIsReadOnce() async {
        let files = InMemoryFileSource([
            "a.yaml": "inventory:\n  files: [devices.csv]\n",
            "b.yaml":
                "inventory:\n  files: [\"dev*.csv\"]\ntopics:\n  - {name: news, members: [{selector: {team: a}}]}\n",
            "devices.csv": "device_id,token,team\nd1,\(Fixtures.token(1)),a\nd2,\(Fixtures.token(2)),a\n",
        ])
        var table = TokenTable()
        let loaded = await ManifestLoader(files: files).load(into: &table)
        #expect(!loaded.diagnostics.hasErrors, "\(loaded.diagnostics)")
        #expect(
            loaded.diagnostics.contains { $0.severity == .warning && $0.message.contains("is also named at") },
            "\(loaded.diagnostics)")
        #expect(loaded.inventory.count == 2)
    }

    /// A selector no topic or group name could match is refused, for --target and in a saved plan alike.
    @Test func selectorsThatNoNameCanMatchAreRefused() {
        for text in [
            "topic:a b", "topic:news\nevil", "group:\u{7}", "weather\t", "topic:" + String(repeating: "x", count: 1000),
        ] {
            #expect(throws: TargetError.self, "\(text.debugDescription)") { try Targets.Selector(parsing: text) }
        }
        for text in ["topic:weather-*", "group:user 42", "weather-??", "topic:a%2Fb~c.d_e"] {
            #expect(throws: Never.self) { try Targets.Selector(parsing: text) }
        }
    }
}
