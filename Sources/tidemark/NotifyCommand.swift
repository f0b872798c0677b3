import ArgumentParser
import Foundation
import TidemarkCore
import TidemarkServe

/// `tidemark notify EVENT`: one signed event to a webhook, with the body, headers and signature of
/// `tidemark serve`'s events, for a pipeline whose apply or drift job failed.
struct NotifyCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "notify",
        abstract: "Send one signed event to a webhook, as 'tidemark serve' does (for a pipeline's failed job).",
        discussion: """
            EVENT is one of \(NotifyTarget.Event.allCases.map(\.rawValue).joined(separator: ", ")). The body is \
            the JSON of serve's events (event, workspace, dedupe_key, reason, summary, counts, commit, \
            replica, occurred_at), signed with HMAC-SHA256 over TIMESTAMP.BODY: X-Tidemark-Signature: \
            sha256=HEX, with X-Tidemark-Timestamp, X-Tidemark-Event and X-Tidemark-Delivery. The address and \
            the secret come from environment variables, never from the command line. Three tries, 1 s and \
            2 s apart; exit 1 when it was not delivered. With --if-configured, an unset address variable \
            is said and is not an error (a pipeline that set no webhook).
            """
    )

    @Argument(help: ArgumentHelp("What happened, such as apply_failed or drift_found.", valueName: "EVENT"))
    var event: String

    @Option(help: ArgumentHelp("The workspace it happened in.", valueName: "NAME"))
    var workspace = "default"

    @Option(help: "One sentence for a person: what happened and what to look at (no token, no link needed).")
    var summary: String

    @Option(help: "Why, in a stable word (such as stale_plan or rail.max_unsubscribes); part of the dedupe key.")
    var reason: String?

    @Option(help: "The commit of the manifests (default: $TIDEMARK_COMMIT, $GITHUB_SHA or $CI_COMMIT_SHA).")
    var commit: String?

    @Option(help: ArgumentHelp("The environment variable holding the webhook's address.", valueName: "VAR"))
    var urlEnv = "TIDEMARK_WEBHOOK_URL"

    @Option(help: ArgumentHelp("The environment variable holding the signing secret.", valueName: "VAR"))
    var secretEnv = "TIDEMARK_WEBHOOK_SECRET"

    @Flag(help: "Say so and exit 0 when the address variable is not set.")
    var ifConfigured = false

    func validate() throws {
        guard NotifyTarget.Event(rawValue: event) != nil else {
            throw ValidationError(
                "'\(event)' is not an event; use one of \(NotifyTarget.Event.allCases.map(\.rawValue).joined(separator: ", "))."
            )
        }
    }

    func run() async throws {
        try await runReportingErrors {
            let sent = try await Notifier.notifyFromPipeline(
                NotifyTarget.Event(rawValue: event)!, workspace: workspace, reason: reason, summary: summary,
                commit: commit, urlEnv: urlEnv, secretEnv: secretEnv, ifConfigured: ifConfigured)
            try Terminal.write(
                sent
                    ? "Sent \(event) for workspace '\(workspace)' to the webhook in \(urlEnv).\n"
                    : "No webhook: \(urlEnv) is not set, so nothing was sent.\n")
        }
    }
}
