import Foundation
import Testing
import TidemarkCore
import TidemarkRuntime

/// `tidemark inventory triggers`: the SQL for a source's `listen` channel, from tidemark.yaml alone.
@Suite struct ChangeTriggersTests {
    static func runtime(_ settings: String) throws -> (Runtime, URL) {
        let project = FileManager.default.temporaryDirectory.appendingPathComponent("tm-trg-\(UUID().uuidString)")
        try FileManager.default.createDirectory(
            at: project.appendingPathComponent("manifests"), withIntermediateDirectories: true)
        try settings.write(to: project.appendingPathComponent("tidemark.yaml"), atomically: true, encoding: .utf8)
        var flags = RuntimeFlags()
        flags.directory = project.path
        // The database URL is deliberately unreachable: printing the triggers connects to nothing.
        return (try Runtime.load(flags, environment: ["APP_DATABASE_URL": "postgres://u@127.0.0.1:1/app"]), project)
    }

    static let settings = """
        project: tidemark-triggers
        inventory:
          - name: app-db
            postgres:
              url_env: APP_DATABASE_URL
              query: select device_id, token from fcm_tokens where active
              listen: tidemark_devices
          - name: quiet-db
            postgres: {url_env: APP_DATABASE_URL, query: 'select device_id, token from fcm_tokens'}
          - name: script
            exec: {command: [python3, devices.py]}
        """

    @Test func printsTheScriptForTheSourcesChannel() throws {
        let (runtime, project) = try Self.runtime(Self.settings)
        defer { try? FileManager.default.removeItem(at: project) }
        let sql = try runtime.changeTriggers(source: "app-db", table: "app.fcm_tokens", idColumn: "device_id")
        #expect(sql.contains("CREATE OR REPLACE FUNCTION app.tidemark_notify_tidemark_devices() RETURNS trigger"))
        #expect(sql.contains("PERFORM pg_notify('tidemark_devices', OLD.device_id::text);"))
        #expect(sql.contains("AFTER INSERT OR UPDATE OR DELETE ON app.fcm_tokens"))
        #expect(sql.contains("AFTER TRUNCATE ON app.fcm_tokens"))
        #expect(sql.hasPrefix("-- tidemark: tell the inventory source 'app-db'"))
    }

    @Test(arguments: [
        ("app-bd", "no inventory source 'app-bd' (did you mean 'app-db'?)"),
        ("quiet-db", "has no 'listen' channel; add 'listen: tidemark_devices'"),
        ("script", "reads with 'exec', not 'postgres'; triggers watch the table"),
    ])
    func refusesASourceThatCannotListen(_ name: String, _ expected: String) throws {
        let (runtime, project) = try Self.runtime(Self.settings)
        defer { try? FileManager.default.removeItem(at: project) }
        let error = #expect(throws: RuntimeError.self) {
            try runtime.changeTriggers(source: name, table: "fcm_tokens", idColumn: "device_id")
        }
        #expect(error?.description.contains(expected) == true, "\(error?.description ?? "")")
    }

    @Test func refusesATableItCannotName() throws {
        let (runtime, project) = try Self.runtime(Self.settings)
        defer { try? FileManager.default.removeItem(at: project) }
        let error = #expect(throws: (any Error).self) {
            try runtime.changeTriggers(source: "app-db", table: "fcm_tokens; drop table users", idColumn: "device_id")
        }
        #expect("\(error!)".contains("--table must be a table name"))
    }
}
