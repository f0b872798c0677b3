import Foundation
import Logging
import Synchronization
import Testing
import TidemarkServe

@Suite struct JSONLogHandlerTests {
    @Test func eachLineIsOneJSONObjectWithTheLeadingWordsAsFields() throws {
        let lines = Mutex<[String]>([])
        var logger = Logger(
            label: "tidemark.serve",
            factory: { JSONLogHandler(label: $0, write: { line in lines.withLock { $0.append(line) } }) })
        logger[metadataKey: "replica"] = "host/1"
        logger.info("reconcile workspace=prod result=blocked reason=rail.max_unsubscribes next_in=5m: a=b is prose")
        logger.debug("not written at info")
        let written = lines.withLock { $0 }
        #expect(written.count == 1 && !written[0].contains("\n"))
        let object = try #require(
            try JSONSerialization.jsonObject(with: Data(written[0].utf8)) as? [String: String])
        #expect(object["workspace"] == "prod" && object["result"] == "blocked")
        #expect(object["reason"] == "rail.max_unsubscribes" && object["next_in"] == "5m")
        #expect(object["a"] == nil, "words after the first ': ' are the summary, not fields")
        #expect(object["replica"] == "host/1" && object["level"] == "info" && object["logger"] == "tidemark.serve")
        #expect(object["message"]?.hasPrefix("reconcile workspace=prod") == true)
        #expect(object["time"]?.hasSuffix("Z") == true)
    }
}
