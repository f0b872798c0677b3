import Foundation
import TidemarkAuth
import TidemarkCore

/// Keyless credentials, as CI systems use them now: the Security Token Service's token exchange
/// (workload identity federation), IAM credentials' generateAccessToken (service-account
/// impersonation) and a Compute Engine metadata server, so that tidemark's `external_account` and
/// metadata-server credentials are tested end to end.
extension FCMEmulator {
    /// The form or JSON fields of a token request (the OAuth2 endpoint's and the STS's).
    func formFields(_ request: WireRequest) -> [String: String] {
        var form: [String: String] = [:]
        if (request.headers["content-type"] ?? "").contains("json") {
            for (key, value) in jsonBody(request) ?? [:] { if let value = value as? String { form[key] = value } }
        } else {
            for pair in String(decoding: request.body, as: UTF8.self).split(separator: "&") {
                let kv = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
                form[WireRequest.formDecode(kv[0])] = kv.count > 1 ? WireRequest.formDecode(kv[1]) : ""
            }
        }
        return form
    }

    /// `POST /v1/token` (sts.googleapis.com): RFC 8693 token exchange.
    func stsToken(_ request: WireRequest) async -> WireResponse {
        guard request.method == "POST" else { return methodNotFound(request) }
        let form = formFields(request)
        func refuse(_ error: String, _ description: String) -> WireResponse {
            .encoded(400, FCMWire.OAuthError(error: error, errorDescription: description))
        }
        guard form["grant_type"] == "urn:ietf:params:oauth:grant-type:token-exchange" else {
            return refuse("unsupported_grant_type", "Invalid grant_type: \(form["grant_type"] ?? "")")
        }
        guard form["requested_token_type"] == "urn:ietf:params:oauth:token-type:access_token" else {
            return refuse("invalid_request", "Invalid requested_token_type.")
        }
        let subjectTypes = [
            "urn:ietf:params:oauth:token-type:jwt", "urn:ietf:params:oauth:token-type:id_token",
        ]
        guard let type = form["subject_token_type"], subjectTypes.contains(type) else {
            return refuse("invalid_request", "Invalid subject_token_type: \(form["subject_token_type"] ?? "")")
        }
        guard let subject = form["subject_token"], !subject.isEmpty else {
            return refuse("invalid_request", "Missing required parameter: subject_token")
        }
        guard let audience = form["audience"], !audience.isEmpty else {
            return refuse("invalid_request", "Missing required parameter: audience")
        }
        let scopes = (form["scope"] ?? "").split(separator: " ").map(String.init)
        do {
            let (token, grant) = try authority.federate(subjectToken: subject, audience: audience, scopes: scopes)
            traffic.count { $0.tokenGrants += 1 }
            let expiresIn = max(0, Int(grant.expires.timeIntervalSince(timing.wallClock()).rounded()))
            return .encoded(200, FCMWire.STSToken(accessToken: token, expiresIn: expiresIn))
        } catch let error as AuthError {
            return refuse("invalid_grant", error.message)
        } catch {
            return refuse("invalid_grant", "The subject token could not be verified.")
        }
    }

    /// `POST /v1/projects/-/serviceAccounts/EMAIL:generateAccessToken` (iamcredentials.googleapis.com).
    func generateAccessToken(_ request: WireRequest, email: String) async -> WireResponse {
        guard request.method == "POST" else { return methodNotFound(request) }
        let header = request.headers["authorization"] ?? ""
        guard header.hasPrefix("Bearer ") else {
            return .status(401, "UNAUTHENTICATED", "Request is missing required authentication credential.")
        }
        let body = jsonBody(request) ?? [:]
        guard let scopes = body["scope"] as? [String], !scopes.isEmpty else {
            return .status(400, "INVALID_ARGUMENT", "Scope is required.")
        }
        do {
            let (token, grant) = try authority.impersonate(
                bearer: String(header.dropFirst("Bearer ".count)), serviceAccount: email, scopes: scopes)
            traffic.count { $0.tokenGrants += 1 }
            return .encoded(
                200, FCMWire.GeneratedAccessToken(accessToken: token, expireTime: RFC3339.timestamp(grant.expires)))
        } catch let error as AuthError {
            switch error.code {
            case .unknownKey: return .status(404, "NOT_FOUND", error.message)
            case .invalidClaims:
                return .status(403, "PERMISSION_DENIED", error.message)
            default: return .status(401, "UNAUTHENTICATED", error.message)
            }
        } catch {
            return .status(401, "UNAUTHENTICATED", "Request had invalid authentication credentials.")
        }
    }

    /// `GET /computeMetadata/v1/…`: the default service account's token, email and the project id.
    func metadata(_ request: WireRequest, path: [String]) async -> WireResponse {
        guard request.method == "GET" else { return methodNotFound(request) }
        guard request.headers["metadata-flavor"] == "Google" else {
            // The real server answers 403 with an HTML page when the header is missing.
            return .html(403, title: "Missing Metadata-Flavor:Google header.")
        }
        switch path {
        case ["v1", "instance", "service-accounts", "default", "token"]:
            let scopes = (request.queryValue("scopes") ?? "https://www.googleapis.com/auth/cloud-platform")
                .split(separator: ",").map(String.init)
            do {
                let (token, grant) = try authority.metadataToken(scopes: scopes)
                traffic.count { $0.tokenGrants += 1 }
                let expiresIn = max(0, Int(grant.expires.timeIntervalSince(timing.wallClock()).rounded()))
                return .encoded(200, FCMWire.AccessToken(accessToken: token, expiresIn: expiresIn))
            } catch {
                return .html(404, title: "Not Found")
            }
        case ["v1", "project", "project-id"]:
            let project = authority.projects.sorted().first ?? ""
            return WireResponse(status: 200, headers: [("Content-Type", "application/text")], body: Data(project.utf8))
        default:
            return .html(404, title: "Not Found")
        }
    }
}
