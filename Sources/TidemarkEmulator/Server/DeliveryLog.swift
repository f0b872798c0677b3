import Foundation
import Synchronization

/// One message the emulator accepted for delivery, and the app instances it reached.
public struct Delivery: Sendable, Codable, Equatable {
    /// `projects/P/messages/ID`.
    public var name: String
    /// The project the message was sent in.
    public var project: String
    /// `token`, `topic` or `condition`.
    public var targetKind: String
    /// The token, topic name or condition it was sent to.
    public var target: String
    /// The registration tokens that received the message.
    public var recipients: [String]
    /// The `message` object as sent, JSON.
    public var message: String
    /// When the emulator accepted it.
    public var sentAt: Date

    enum CodingKeys: String, CodingKey {
        case name, project, recipients, message
        case targetKind = "target_kind"
        case target
        case sentAt = "sent_at"
    }
}

/// The deliveries the emulator recorded, newest last, capped so a long run does not grow without bound.
public final class DeliveryLog: Sendable {
    /// The most deliveries kept; older ones are dropped first.
    public let capacity: Int
    private let state = Mutex<(entries: [Delivery], counter: UInt64)>(([], 0))

    /// A log that keeps the last `capacity` deliveries.
    public init(capacity: Int = 10_000) { self.capacity = capacity }

    /// Records a delivery and returns its message name.
    func record(
        project: String, targetKind: String, target: String, recipients: [String], message: String,
        at date: Date
    ) -> String {
        state.withLock { state in
            state.counter += 1
            let id = String(format: "0:%lld%%%016llx", Int64(date.timeIntervalSince1970 * 1000), state.counter)
            let name = "projects/\(project)/messages/\(id)"
            state.entries.append(
                Delivery(
                    name: name, project: project, targetKind: targetKind, target: target,
                    recipients: recipients, message: message, sentAt: date))
            if state.entries.count > capacity { state.entries.removeFirst(state.entries.count - capacity) }
            return name
        }
    }

    /// The deliveries of `project`, optionally only those that reached `token`.
    public func deliveries(project: String, token: String? = nil) -> [Delivery] {
        state.withLock { state in
            state.entries.filter { $0.project == project && (token == nil || $0.recipients.contains(token!)) }
        }
    }

    /// Forgets the deliveries of `project`, or all of them.
    public func clear(project: String? = nil) {
        state.withLock { state in
            if let project { state.entries.removeAll { $0.project == project } } else { state.entries.removeAll() }
        }
    }
}
