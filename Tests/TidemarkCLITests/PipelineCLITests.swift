import Crypto
import Foundation
import Testing

/// What the CI recipes lean on: `init --ci` passing the project's inventory variables, and
/// `tidemark notify` sending a signed event as `serve` does.
struct PipelineCLITests {
    @Test func initPassesTheInventoryVariablesTidemarkYamlNames() throws {
        let cli = try CLIRunner(demo: true)
        defer { cli.remove() }
        try cli.write(
            "tidemark.yaml",
            """
            project: acme-news
            inventory:
              - name: app-db
                postgres:
                  url_env: APP_DATABASE_URL
                  query: select id as device_id, token from fcm_tokens

            """)
        let added = try cli.run(["init", "--ci", "github"])
        #expect(added.status == 0, "\(added.stderr)")
        #expect(added.stdout.contains("the inventory's APP_DATABASE_URL from CI secrets"), "\(added.stdout)")
        let workflow = try String(
            contentsOf: cli.project.appendingPathComponent(".github/workflows/tidemark.yml"), encoding: .utf8)
        let live = workflow.split(separator: "\n").filter { !$0.trimmingCharacters(in: .whitespaces).hasPrefix("#") }
        #expect(live.contains { $0.contains("APP_DATABASE_URL: ${{ secrets.APP_DATABASE_URL_READONLY }}") })
        #expect(live.filter { $0.contains("APP_DATABASE_URL: ${{ secrets.APP_DATABASE_URL }}") }.count == 2)
        #expect(!live.contains { $0.contains("TIDEMARK_INVENTORY_URL") }, "\(workflow)")
        let gitlab = try cli.run(["init", "--ci", "gitlab"])
        #expect(gitlab.status == 0, "\(gitlab.stderr)")
        let template = try String(contentsOf: cli.project.appendingPathComponent(".gitlab-ci.yml"), encoding: .utf8)
        #expect(template.contains("APP_DATABASE_URL: $APP_DATABASE_URL_READONLY"), "\(template)")
    }

    /// A receiver that keeps what it was sent, with the headers that sign it.
    final class Receiver: @unchecked Sendable {
        let lock = NSLock()
        var requests: [(headers: [String: String], body: Data)] = []
        let socket: Int32
        let port: Int

        init() throws {
            let fd = Foundation.socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_addr.s_addr = inet_addr("127.0.0.1")
            address.sin_port = 0
            var one: Int32 = 1
            setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
            _ = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
                }
            }
            listen(fd, 8)
            var bound = sockaddr_in()
            var length = socklen_t(MemoryLayout<sockaddr_in>.size)
            _ = withUnsafeMutablePointer(to: &bound) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
            }
            socket = fd
            port = Int(UInt16(bigEndian: bound.sin_port))
            let thread = Thread { [self] in serve() }
            thread.start()
        }

        func serve() {
            while true {
                let client = accept(socket, nil, nil)
                if client < 0 { return }
                var data = Data()
                var buffer = [UInt8](repeating: 0, count: 65536)
                while true {
                    let n = read(client, &buffer, buffer.count)
                    if n <= 0 { break }
                    data.append(contentsOf: buffer[0..<n])
                    if let end = data.range(of: Data("\r\n\r\n".utf8)) {
                        let head = String(decoding: data[..<end.lowerBound], as: UTF8.self)
                        var headers: [String: String] = [:]
                        for line in head.split(separator: "\r\n").dropFirst() {
                            let parts = line.split(separator: ":", maxSplits: 1)
                            if parts.count == 2 {
                                headers[parts[0].lowercased()] = parts[1].trimmingCharacters(in: .whitespaces)
                            }
                        }
                        let length = Int(headers["content-length"] ?? "0") ?? 0
                        if data.count - end.upperBound >= length {
                            let body = data[end.upperBound..<(end.upperBound + length)]
                            lock.withLock { requests.append((headers, Data(body))) }
                            let reply = "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n"
                            _ = reply.withCString { write(client, $0, strlen($0)) }
                            break
                        }
                    }
                }
                close(client)
            }
        }

        func stop() {
            shutdown(socket, Int32(SHUT_RDWR))
            close(socket)
        }
    }

    @Test func notifySendsOneEventSignedAsServeSignsItsEvents() throws {
        let cli = try CLIRunner()
        defer { cli.remove() }
        let receiver = try Receiver()
        defer { receiver.stop() }
        let secret = "pipeline-secret"
        let environment = [
            "TIDEMARK_WEBHOOK_URL": "http://127.0.0.1:\(receiver.port)/hook", "TIDEMARK_WEBHOOK_SECRET": secret,
            "GITHUB_SHA": "abc123",
        ]
        let sent = try cli.run(
            [
                "notify", "apply_failed", "--workspace", "prod", "--reason", "ci_apply", "--summary",
                "The apply failed.",
            ],
            environment: environment)
        #expect(sent.status == 0, "\(sent.stderr)")
        let requests = receiver.lock.withLock { receiver.requests }
        let request = try #require(requests.first)
        let timestamp = try #require(request.headers["x-tidemark-timestamp"])
        var signed = Data("\(timestamp).".utf8)
        signed.append(request.body)
        let mac = HMAC<SHA256>.authenticationCode(for: signed, using: SymmetricKey(data: Data(secret.utf8)))
        #expect(request.headers["x-tidemark-signature"] == "sha256=" + mac.map { String(format: "%02x", $0) }.joined())
        #expect(request.headers["x-tidemark-event"] == "apply_failed")
        let body = try #require(try JSONSerialization.jsonObject(with: request.body) as? [String: Any])
        #expect(body["dedupe_key"] as? String == "prod/apply_failed/ci_apply")
        #expect(body["commit"] as? String == "abc123" && body["summary"] as? String == "The apply failed.")

        // No webhook set: said, and not an error with --if-configured; an error without it.
        let unset = try cli.run(["notify", "apply_failed", "--summary", "x", "--if-configured"])
        #expect(unset.status == 0 && unset.stdout.contains("nothing was sent"), "\(unset.stdout)\(unset.stderr)")
        #expect(try cli.run(["notify", "apply_failed", "--summary", "x"]).status == 1)
        let bad = try cli.run(["notify", "exploded", "--summary", "x"])
        #expect(bad.status == 64 && bad.stderr.contains("is not an event"), "\(bad.stderr)")
        // A closed port: not delivered, exit 1, the address never printed.
        var closed = environment
        closed["TIDEMARK_WEBHOOK_URL"] = "http://user:token@127.0.0.1:9/hook"
        let refused = try cli.run(["notify", "apply_failed", "--summary", "x"], environment: closed)
        #expect(refused.status == 1 && refused.stderr.contains("was not delivered after 3 tries"), "\(refused.stderr)")
        #expect(!refused.stderr.contains("token@"), "\(refused.stderr)")
    }
}
