import Crypto
import Foundation
import TidemarkCore

/// The key saved plans are sealed with: `TIDEMARK_PLAN_KEY`, base64 of 32 random bytes
/// (`openssl rand -base64 32`), kept as a CI secret.
public struct PlanKey: Sendable {
    /// The environment variable that holds it.
    public static let variable = "TIDEMARK_PLAN_KEY"

    let key: SymmetricKey
    /// Names the key without revealing it: `sha256:` and 12 hex digits of a hash of it, so a plan
    /// sealed with another key says so.
    public let id: String

    /// The key in `base64` (the value of `variable`); a value that is not base64 of 32 bytes is refused
    /// naming the variable, never the value.
    public init(base64: String, variable: String = PlanKey.variable) throws(RuntimeError) {
        let trimmed = base64.trimmingCharacters(in: .whitespacesAndNewlines)
        guard let bytes = Data(base64Encoded: trimmed), bytes.count == 32 else {
            let length = Data(base64Encoded: trimmed).map { "\($0.count) bytes" } ?? "not base64"
            throw RuntimeError(
                "\(variable) must be base64 of 32 random bytes (make one with 'openssl rand -base64 32'); the value set is \(length)."
            )
        }
        key = SymmetricKey(data: bytes)
        let digest = SHA256.hash(data: Data("tidemark plan key".utf8) + bytes)
        id = "sha256:" + digest.prefix(6).map { String(format: "%02x", $0) }.joined()
    }

    /// The key `environment` sets, nil when it sets none (or an empty value).
    public static func from(_ environment: [String: String]) throws(RuntimeError) -> PlanKey? {
        guard let value = environment[variable], !value.trimmingCharacters(in: .whitespaces).isEmpty else {
            return nil
        }
        return try PlanKey(base64: value)
    }
}

extension Runtime {
    /// The key saved plans are sealed with (`TIDEMARK_PLAN_KEY`), nil when none is set; a value that is
    /// not one is refused.
    public func planKey() throws(RuntimeError) -> PlanKey? {
        try PlanKey.from(resolved.environment)
    }

    /// Reads and checks the plan saved at `path`, within the limits of tidemark.yaml (`plan_bytes`,
    /// `plan_operations`): a sealed one is opened with `planKey()`, or, unless `requireWhole`, read
    /// without its tokens when it cannot be. Throws `SavedPlanError` naming the file.
    public func readSavedPlan(_ path: String, requireWhole: Bool = true) throws -> SealedPlan.Opened {
        let data: Data
        do {
            data = try InputFile.read(path, atMost: settings.limits.planBytes, setting: "plan_bytes")
        } catch {
            throw SavedPlanError(description: "cannot read the plan file \(path): \(error.problem).")
        }
        return try SealedPlan.read(
            data, file: path, key: try planKey(), requireWhole: requireWhole,
            maxOperations: settings.limits.planOperations)
    }
}

/// A saved plan whose registration tokens are sealed: a JSON file whose `plan` is the plan with every
/// token and group key redacted (what `tidemark show` renders without the key, and all that the text
/// and markdown renderings ever show of them), and whose `sealed` is the whole plan encrypted with
/// AES-256-GCM under `PlanKey`. Opening checks the seal and that the readable part is what the sealed
/// plan redacts to, so neither can be edited without `apply` refusing the file.
public enum SealedPlan {
    /// The key that marks a sealed plan, and its version.
    static let marker = "tidemark_sealed_plan"
    /// Bound to the ciphertext with the key's id: a seal made for another purpose does not open here.
    static let context = "tidemark sealed plan 1"
    /// The version of the sealed format this tidemark writes and reads.
    package static let formatVersion = 1

    /// The data a seal is bound to (authenticated, not encrypted), the same when sealing and opening.
    static func boundData(_ key: PlanKey) -> Data { Data((context + key.id).utf8) }

    /// What reading a plan file gave.
    public struct Opened: Sendable {
        /// The plan: whole when it was not sealed or was opened; otherwise its readable part, tokens redacted.
        public var plan: Plan
        /// Whether the file was sealed.
        public var sealed: Bool
        /// Whether the plan holds its tokens (not sealed, or opened with the key).
        public var whole: Bool
        /// Why a sealed plan was not opened (no key, or another key), as a sentence.
        public var closedBecause: String?
    }

    /// Whether `data` is a sealed plan: its marker, the last of its sorted keys, ends the file (looked
    /// for there, so a plan of a million changes is not parsed twice).
    public static func isSealed(_ data: Data) -> Bool {
        let tail = Data(data.suffix(256))
        return tail.range(of: Data("\"\(marker)\"".utf8)) != nil
    }

    /// The file `plan` is saved as, sealed with `key`.
    public static func seal(_ plan: Plan, key: PlanKey) throws -> Data {
        let whole = try Plan.encoder(pretty: false).encode(plan)
        let box = try AES.GCM.seal(whole, using: key.key, authenticating: boundData(key))
        guard let combined = box.combined else { throw RuntimeError("cannot seal the plan: AES-GCM gave no output.") }
        let envelope = Envelope(
            tidemarkSealedPlan: formatVersion, cipher: "AES-256-GCM", keyId: key.id, plan: plan.redacted,
            sealed: combined.base64EncodedString())
        var data = try Plan.encoder().encode(envelope)
        data.append(UInt8(ascii: "\n"))
        return data
    }

    /// Reads the plan file `data` (`file` names it in messages): a plan saved without a key as it is;
    /// a sealed one opened with `key`, or (when `requireWhole` is false) its readable part when no key
    /// or another key is given. Refuses a seal that fails, and a readable part that is not what the
    /// sealed plan redacts to.
    public static func read(
        _ data: Data, file: String, key: PlanKey?, requireWhole: Bool,
        maxOperations: Int = InputLimits().planOperations
    ) throws -> Opened {
        guard isSealed(data) else {
            let plan = try Plan.decodeSaved(data, file: file, maxOperations: maxOperations)
            return Opened(plan: plan, sealed: false, whole: true)
        }
        let envelope: Envelope
        do {
            envelope = try Plan.decoder().decode(Envelope.self, from: data)
        } catch {
            throw RuntimeError(
                "\(file) is not a valid sealed tidemark plan (\(ErrorText.describe(error))); make a new plan with 'tidemark plan --out'."
            )
        }
        guard envelope.tidemarkSealedPlan == formatVersion, envelope.cipher == "AES-256-GCM" else {
            throw RuntimeError(
                "\(file) is sealed in a way this tidemark does not read (version \(envelope.tidemarkSealedPlan), \(envelope.cipher)); upgrade tidemark."
            )
        }
        // The readable part passes the checks of any saved plan.
        let readable = try Plan.decodeSaved(
            Plan.encoder(pretty: false).encode(envelope.plan), file: file, maxOperations: maxOperations)
        guard let key, key.id == envelope.keyId else {
            let why =
                if let key {
                    "it was sealed with another key (the plan names key \(envelope.keyId), \(PlanKey.variable) is key \(key.id)); set \(PlanKey.variable) to the key the plan was sealed with"
                } else {
                    "its registration tokens are sealed and \(PlanKey.variable) is not set; set it to the key the plan was sealed with (key \(envelope.keyId))"
                }
            if requireWhole { throw RuntimeError("cannot apply \(file): \(why).") }
            return Opened(plan: readable, sealed: true, whole: false, closedBecause: why)
        }
        let whole: Data
        do {
            let box = try AES.GCM.SealedBox(combined: Data(base64Encoded: envelope.sealed) ?? Data())
            whole = try AES.GCM.open(box, using: key.key, authenticating: boundData(key))
        } catch {
            throw RuntimeError(
                "\(file)'s seal does not verify: the file was edited or damaged after 'tidemark plan --out' sealed it. Apply only plans as tidemark wrote them; make a new plan."
            )
        }
        let plan = try Plan.decodeSaved(whole, file: file, maxOperations: maxOperations)
        // The readable part is what a reviewer saw: it must be what the sealed plan shows.
        func shown(_ plan: Plan) throws -> Data {
            var plan = plan
            plan.operationsDigestWhenMade = nil
            return try Plan.encoder(pretty: false).encode(plan)
        }
        guard try shown(plan.redacted) == shown(readable) else {
            throw RuntimeError(
                "\(file)'s readable part was edited after it was sealed: it no longer shows the plan the seal holds. Apply only plans as tidemark wrote them; make a new plan."
            )
        }
        return Opened(plan: plan, sealed: true, whole: true)
    }

    /// The file: its marker, how it is sealed, the readable plan and the sealed one.
    private struct Envelope: Codable {
        var tidemarkSealedPlan: Int
        var cipher: String
        var keyId: String
        var plan: Plan
        var sealed: String
    }
}
