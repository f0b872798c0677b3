import Foundation
import TidemarkAuth
import TidemarkCore

/// The OAuth2 token endpoint: the JWT-bearer grant of a service account (reference §4.3).
extension FCMEmulator {
    func oauthToken(_ request: WireRequest) async -> WireResponse {
        guard request.method == "POST" else { return methodNotFound(request) }
        if control.drawTokenEndpointFailure() {
            var response = WireResponse.html(503, title: "Service Unavailable")
            response.headers.append(("Retry-After", "1"))
            return response
        }
        var form: [String: String] = [:]
        let contentType = request.headers["content-type"] ?? ""
        if contentType.contains("json") {
            for (key, value) in jsonBody(request) ?? [:] { if let value = value as? String { form[key] = value } }
        } else {
            for pair in String(decoding: request.body, as: UTF8.self).split(separator: "&") {
                let kv = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
                form[WireRequest.formDecode(kv[0])] = kv.count > 1 ? WireRequest.formDecode(kv[1]) : ""
            }
        }
        let grantType = form["grant_type"] ?? ""
        guard grantType == "urn:ietf:params:oauth:grant-type:jwt-bearer" else {
            return .encoded(
                400,
                FCMWire.OAuthError(
                    error: "unsupported_grant_type", errorDescription: "Invalid grant_type: \(grantType)"))
        }
        guard let assertion = form["assertion"], !assertion.isEmpty else {
            return .encoded(
                400,
                FCMWire.OAuthError(error: "invalid_request", errorDescription: "Missing required parameter: assertion"))
        }
        do {
            let (token, grant) = try authority.exchange(assertion: assertion)
            let expiresIn = max(0, Int(grant.expires.timeIntervalSince(timing.wallClock()).rounded()))
            return .encoded(200, FCMWire.AccessToken(accessToken: token, expiresIn: expiresIn))
        } catch let error as AuthError {
            return .encoded(400, FCMWire.OAuthError(error: "invalid_grant", errorDescription: error.message))
        } catch {
            return .encoded(
                400,
                FCMWire.OAuthError(error: "invalid_grant", errorDescription: "The assertion could not be verified."))
        }
    }
}
