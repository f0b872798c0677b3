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
        if control.echoesTokenRequests {
            // As a careless endpoint does: the query and the body, quoted back.
            let body = String(decoding: request.body, as: UTF8.self)
            let query = request.query.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }
            return .encoded(
                400,
                FCMWire.OAuthError(
                    error: "invalid_request",
                    errorDescription: "Bad request: \(query.isEmpty ? "" : "?\(query.joined(separator: "&")) ")\(body)")
            )
        }
        let form = formFields(request)
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
            traffic.count { $0.tokenGrants += 1 }
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
