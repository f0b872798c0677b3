import Foundation
import TidemarkAuth
import TidemarkCore

/// The ways tidemark can get an access token for FCM, as Google's client libraries find them:
/// a service-account key file, an `external_account` file (workload identity federation, what
/// GitHub's and GitLab's OIDC flows produce: no key to leak), or the metadata server of the
/// Google Cloud machine it runs on.
public enum GoogleCredentials: Sendable, Equatable {
    case serviceAccount(ServiceAccountKey)
    case externalAccount(ExternalAccount)
    case metadataServer(MetadataServer)

    /// Who the tokens are for, for messages (never a secret).
    public var principal: String {
        switch self {
        case .serviceAccount(let key): key.clientEmail
        case .externalAccount(let account):
            account.serviceAccountEmail.map { "\($0) (impersonated by a workload identity)" }
                ?? "the workload identity of \(account.audience)"
        case .metadataServer(let server): "the metadata server's default service account (\(server.host))"
        }
    }

    /// The project a key file names; nil for credentials that do not name one.
    public var projectID: String? {
        if case .serviceAccount(let key) = self { return key.projectID }
        return nil
    }

    /// Reads a credentials file (`GOOGLE_APPLICATION_CREDENTIALS`) of either supported type.
    public static func load(path: String) throws -> GoogleCredentials {
        guard let data = FileManager.default.contents(atPath: path) else {
            throw CredentialError(
                "The credentials file \(path) does not exist or cannot be read; set GOOGLE_APPLICATION_CREDENTIALS to a service account's JSON key or to an external_account file from workload identity federation."
            )
        }
        struct Kind: Decodable { var type: String? }
        guard let kind = try? JSONDecoder().decode(Kind.self, from: data) else {
            throw CredentialError("The credentials file \(path) is not JSON; it should be a Google credentials file.")
        }
        switch kind.type {
        case "service_account": return .serviceAccount(try ServiceAccountKey.load(path: path))
        case "external_account": return .externalAccount(try ExternalAccount.load(data, path: path))
        case "authorized_user":
            throw CredentialError(
                "The credentials file \(path) holds a person's login (authorized_user, from 'gcloud auth application-default login'); tidemark acts as a service account: use its JSON key, or workload identity federation in CI."
            )
        default:
            throw CredentialError(
                "The credentials file \(path) is of type \"\(kind.type ?? "(none)")\"; tidemark reads service_account and external_account files."
            )
        }
    }
}

/// An `external_account` credentials file: a subject token from a file or URL (an OIDC token from
/// the CI system), exchanged at Google's Security Token Service for a federated token, then,
/// optionally, for a service account's token through IAM credentials' generateAccessToken.
public struct ExternalAccount: Sendable, Equatable {
    /// Where the subject token is read: a file or a URL.
    public struct Source: Sendable, Equatable {
        /// The file holding the token.
        public var file: String?
        /// The URL serving the token.
        public var url: String?
        /// Headers sent to `url`.
        public var headers: [String: String]
        /// "text" (the whole body or file) or "json" (one field of it).
        public var format: String
        /// The field holding the token when `format` is "json".
        public var fieldName: String?
    }

    /// The workload identity provider the token is exchanged for.
    public var audience: String
    /// The subject token's type, as STS takes it (an OIDC ID token, a JWT).
    public var subjectTokenType: String
    /// The Security Token Service endpoint.
    public var tokenURL: String
    /// The IAM credentials URL of the service account to impersonate, when one is.
    public var impersonationURL: String?
    /// Where the subject token comes from.
    public var source: Source

    /// The service account impersonated, read from the impersonation URL.
    public var serviceAccountEmail: String? {
        guard let url = impersonationURL, let range = url.range(of: "/serviceAccounts/") else { return nil }
        let rest = url[range.upperBound...]
        return String(rest.prefix { $0 != ":" }).removingPercentEncoding
    }

    static func load(_ data: Data, path: String) throws -> ExternalAccount {
        guard let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any] else {
            throw CredentialError("The credentials file \(path) is not a JSON object.")
        }
        func string(_ key: String, in object: [String: Any], required: Bool = true) throws -> String? {
            if let value = object[key] as? String, !value.isEmpty { return value }
            if required {
                throw CredentialError(
                    "The external_account file \(path) has no \"\(key)\"; download it again from the workload identity pool (gcloud iam workload-identity-pools create-cred-config)."
                )
            }
            return nil
        }
        guard let source = object["credential_source"] as? [String: Any] else {
            throw CredentialError("The external_account file \(path) has no \"credential_source\".")
        }
        if source["executable"] != nil || source["environment_id"] != nil {
            throw CredentialError(
                "The external_account file \(path) gets its subject token from \(source["executable"] != nil ? "an executable" : "AWS"); tidemark reads a subject token from a file or a URL (credential_source.file or .url), as GitHub's and GitLab's OIDC setups write."
            )
        }
        let file = try string("file", in: source, required: false)
        let url = try string("url", in: source, required: false)
        guard (file == nil) != (url == nil) else {
            throw CredentialError(
                "The external_account file \(path) must give exactly one of credential_source.file and credential_source.url."
            )
        }
        var headers: [String: String] = [:]
        for (name, value) in source["headers"] as? [String: Any] ?? [:] {
            guard let value = value as? String else {
                throw CredentialError("credential_source.headers.\(name) in \(path) is not a string.")
            }
            headers[name] = value
        }
        let format = source["format"] as? [String: Any] ?? [:]
        let type = format["type"] as? String ?? "text"
        guard type == "text" || type == "json" else {
            throw CredentialError("credential_source.format.type in \(path) is \"\(type)\"; it must be text or json.")
        }
        let field = format["subject_token_field_name"] as? String
        if type == "json", field == nil {
            throw CredentialError(
                "credential_source.format in \(path) is json but names no subject_token_field_name.")
        }
        let audience = try string("audience", in: object)!
        let tokenURL = try string("token_url", in: object, required: false) ?? "https://sts.googleapis.com/v1/token"
        let impersonation = try string("service_account_impersonation_url", in: object, required: false)
        for (name, value) in [
            ("token_url", tokenURL), ("service_account_impersonation_url", impersonation ?? tokenURL),
        ] {
            guard let parsed = URLComponents(string: value), parsed.scheme == "https" || parsed.scheme == "http",
                parsed.host != nil
            else {
                throw CredentialError(
                    "\(name) in \(path) is not a URL: \(URLRedaction.display(value).escapedOnOneLine)")
            }
        }
        return ExternalAccount(
            audience: audience,
            subjectTokenType: try string("subject_token_type", in: object)!,
            tokenURL: tokenURL, impersonationURL: impersonation,
            source: Source(file: file, url: url, headers: headers, format: type, fieldName: field))
    }
}

/// The metadata server of a Google Cloud machine (GCE, GKE, Cloud Run, Cloud Build):
/// `metadata.google.internal`, or `GCE_METADATA_HOST` as Google's libraries read it.
public struct MetadataServer: Sendable, Equatable {
    /// The server's host (and port).
    public var host: String

    /// The metadata server at `host`.
    public init(host: String) { self.host = host }

    /// Where the default service account's token is asked for, with FCM's scope.
    public var tokenURL: String {
        "http://\(host)/computeMetadata/v1/instance/service-accounts/default/token?scopes=\(AccessTokenProvider.scope)"
    }

    /// The metadata server to use when no credentials file is named: the one `GCE_METADATA_HOST`
    /// names, or Google's when this machine says it runs on Google Cloud (unless `NO_GCE_CHECK` is
    /// True); else nil.
    public static func detect(_ environment: [String: String], productName: String? = nil) -> MetadataServer? {
        if let host = environment["GCE_METADATA_HOST"], !host.isEmpty { return MetadataServer(host: host) }
        // As Google's libraries: NO_GCE_CHECK=True says not to look for one.
        if environment["NO_GCE_CHECK"]?.lowercased() == "true" { return nil }
        let product =
            productName
            ?? (try? String(contentsOfFile: "/sys/class/dmi/id/product_name", encoding: .utf8)) ?? ""
        if product.contains("Google") { return MetadataServer(host: "metadata.google.internal") }
        return nil
    }
}
