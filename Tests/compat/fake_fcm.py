"""An independent fake of FCM, written from the public facts in the wire-protocol reference and
sharing no code with tidemark's emulator: OAuth2 JWT-bearer token endpoint, the v1 topic
subscription API, the Instance ID batch API and device groups. It is strict where the facts are
(headers, body shapes, limits) and records every request, so a test can check what a client sent.
"""

import base64
import json
import secrets
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

SCOPE = "https://www.googleapis.com/auth/firebase.messaging"


def b64url_decode(part):
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def make_key(project, token_uri):
    """A service-account key file's JSON (a fresh RSA key) and the public key to verify with."""
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    key = {"type": "service_account", "project_id": project, "private_key_id": secrets.token_hex(20),
           "private_key": pem, "client_email": "fake@%s.iam.gserviceaccount.com" % project,
           "client_id": "1234567890", "auth_uri": "https://accounts.google.com/o/oauth2/auth",
           "token_uri": token_uri, "auth_provider_x509_cert_url": "https://www.googleapis.com/oauth2/v1/certs",
           "client_x509_cert_url": "https://example.invalid/cert", "universe_domain": "googleapis.com"}
    return key, private.public_key()


class FakeFCM:
    """State and rules. `violations` lists every request that broke a documented rule."""

    def __init__(self, project, sender_id, public_key, client_email, list_page=3):
        self.project, self.sender_id = project, sender_id
        self.public_key, self.client_email = public_key, client_email
        self.list_page = list_page  # small, so clients must follow next_page_token
        self.lock = threading.Lock()
        self.registered = set()
        self.topics = {}  # token -> set of topics
        self.groups = {}  # name -> {"members": [...], "keys": set()}
        self.access_tokens = {}
        self.requests = []  # (method, path, headers)
        self.violations = []

    # --- helpers -------------------------------------------------------------------------------

    def violation(self, text):
        self.violations.append(text)

    def bearer_ok(self, headers):
        auth = headers.get("Authorization", "")
        if not auth.startswith("Bearer "):
            self.violation("no Bearer token")
            return False
        expires = self.access_tokens.get(auth[7:])
        if expires is None or expires < time.time():
            self.violation("unknown or expired access token")
            return False
        return True

    def token_endpoint(self, headers, body):
        if headers.get("Content-Type", "").split(";")[0] != "application/x-www-form-urlencoded":
            self.violation("token request is not form-encoded")
        form = urllib.parse.parse_qs(body.decode())
        if form.get("grant_type") != ["urn:ietf:params:oauth:grant-type:jwt-bearer"]:
            return 400, {"error": "unsupported_grant_type"}
        assertion = form.get("assertion", [""])[0]
        try:
            head, claims, signature = assertion.split(".")
            header = json.loads(b64url_decode(head))
            payload = json.loads(b64url_decode(claims))
            self.public_key.verify(b64url_decode(signature), (head + "." + claims).encode(), padding.PKCS1v15(),
                                   hashes.SHA256())
        except Exception:
            return 400, {"error": "invalid_grant", "error_description": "Invalid JWT Signature."}
        now = time.time()
        if header.get("alg") != "RS256" or payload.get("iss") != self.client_email:
            return 400, {"error": "invalid_grant", "error_description": "Invalid issuer or algorithm."}
        if SCOPE not in payload.get("scope", "").split():
            return 400, {"error": "invalid_scope"}
        if not (payload["iat"] - 300 <= now <= payload["exp"]) or payload["exp"] - payload["iat"] > 3600:
            return 400, {"error": "invalid_grant", "error_description": "Invalid JWT: iat/exp."}
        access = "ya29.fake-" + secrets.token_urlsafe(24)
        self.access_tokens[access] = now + 3599
        return 200, {"access_token": access, "expires_in": 3599, "token_type": "Bearer"}

    # --- v1 topic subscriptions (reference §8) --------------------------------------------------

    def v1(self, method, parts, query, headers):
        if not self.bearer_ok(headers):
            return 401, {"error": {"code": 401, "status": "UNAUTHENTICATED", "message": "Request had invalid credentials."}}
        # v1/projects/P/registrations/REG/topicSubscriptions[/T]
        if len(parts) < 6 or parts[3] != "registrations" or parts[5] != "topicSubscriptions":
            return 404, {"error": {"code": 404, "status": "NOT_FOUND", "message": "no such method"}}
        if parts[2] != self.project:
            return 403, {"error": {"code": 403, "status": "PERMISSION_DENIED", "message": "wrong project"}}
        reg = parts[4]
        if reg not in self.registered:
            return 404, {"error": {"code": 404, "status": "NOT_FOUND", "message": "Requested entity was not found."}}
        mine = self.topics.setdefault(reg, set())
        if method == "POST" and len(parts) == 6:
            topic = (query.get("topic_name") or query.get("topicName") or [""])[0]
            if headers.get("Content-Type", "").split(";")[0] != "application/json":
                self.violation("v1 create without Content-Type: application/json")
            if not topic:
                return 400, {"error": {"code": 400, "status": "INVALID_ARGUMENT", "message": "topic_name"}}
            if topic in mine:
                return 409, {"error": {"code": 409, "status": "ALREADY_EXISTS", "message": "exists"}}
            if len(mine) >= 2000:
                return 400, {"error": {"code": 400, "status": "FAILED_PRECONDITION", "message": "too many topics"}}
            mine.add(topic)
            return 200, {"name": "projects/%s/registrations/%s/topicSubscriptions/%s" % (self.project, reg, topic),
                         "topic_name": topic, "create_time": "2026-11-22T00:00:00Z"}
        if method == "DELETE" and len(parts) == 7:
            topic = parts[6]
            allow = (query.get("allow_missing") or query.get("allowMissing") or ["false"])[0] == "true"
            if topic not in mine and not allow:
                return 404, {"error": {"code": 404, "status": "NOT_FOUND", "message": "no subscription"}}
            mine.discard(topic)
            return 200, {}
        if method == "GET" and len(parts) == 6:
            size = int((query.get("pageSize") or query.get("page_size") or ["1000"])[0])
            if size > 2000:
                self.violation("list pageSize %d over 2000" % size)
            size = min(size, self.list_page)
            start = int((query.get("pageToken") or query.get("page_token") or ["0"])[0] or 0)
            ordered = sorted(mine)
            page = ordered[start:start + size]
            answer = {"topic_subscriptions": [{"name": "projects/%s/registrations/%s/topicSubscriptions/%s" % (
                self.project, reg, t), "topic_name": t, "create_time": "2026-11-22T00:00:00Z"} for t in page]}
            if start + size < len(ordered):
                answer["next_page_token"] = str(start + size)
            return 200, answer
        return 404, {"error": {"code": 404, "status": "NOT_FOUND", "message": "no such method"}}

    # --- Instance ID (reference §1) ---------------------------------------------------------------

    def iid(self, method, parts, query, headers, body):
        if not self.bearer_ok(headers) or headers.get("access_token_auth") != "true":
            self.violation("IID call without Bearer + access_token_auth: true")
            return 401, "<HTML><TITLE>Unauthorized</TITLE></HTML>"
        if method == "POST" and parts[1] in ("v1:batchAdd", "v1:batchRemove"):
            if headers.get("Content-Type", "").split(";")[0] != "application/json":
                self.violation("IID batch without Content-Type: application/json")
            request = json.loads(body)
            to, tokens = request.get("to", ""), request.get("registration_tokens", [])
            if not to.startswith("/topics/"):
                return 400, {"error": "Topic name format is invalid"}
            if not tokens:
                return 400, {"error": "MissingIIdToken"}
            if len(tokens) > 1000:
                self.violation("IID batch of %d tokens" % len(tokens))
                return 400, {"error": "TooManyTokens"}
            topic, results = to[len("/topics/"):], []
            for t in tokens:
                if t not in self.registered:
                    results.append({"error": "NOT_FOUND"})
                    continue
                mine = self.topics.setdefault(t, set())
                if parts[1] == "v1:batchAdd":
                    if topic not in mine and len(mine) >= 2000:
                        results.append({"error": "TOO_MANY_TOPICS"})
                        continue
                    mine.add(topic)
                else:
                    mine.discard(topic)
                results.append({})
            return 200, {"results": results}
        if method == "GET" and len(parts) == 3 and parts[1] == "info":
            if query.get("details") != ["true"]:
                self.violation("iid/info without details=true")
            t = parts[2]
            if t not in self.registered:
                return 404, {"error": "No information found about this instance id."}
            info = {"application": "com.example", "authorizedEntity": self.sender_id, "platform": "ANDROID"}
            mine = self.topics.get(t, set())
            if mine:
                info["rel"] = {"topics": {name: {"addDate": "2026-11-22"} for name in mine}}
            return 200, info
        return 404, {"error": "not found"}

    # --- device groups (reference §2) ---------------------------------------------------------------

    def groups_call(self, method, query, headers, body):
        if not self.bearer_ok(headers) or headers.get("access_token_auth") != "true":
            self.violation("group call without Bearer + access_token_auth: true")
            return 401, "<HTML><TITLE>Unauthorized</TITLE></HTML>"
        if headers.get("project_id") not in (self.sender_id,):
            self.violation("group call with project_id %r, not the sender ID" % headers.get("project_id"))
            return 400, {"error": "INVALID_PROJECT_ID"}
        if method == "GET":
            name = (query.get("notification_key_name") or [""])[0]
            group = self.groups.get(name)
            if not group:
                return 400, {"error": "notification_key not found"}
            key = "APA91b-%s-%s" % (name, secrets.token_hex(8))  # a new alias every time
            group["keys"].add(key)
            return 200, {"notification_key": key}
        request = json.loads(body)
        op, name = request.get("operation"), request.get("notification_key_name")
        ids = request.get("registration_ids", [])
        valid = [t for t in dict.fromkeys(ids) if t in self.registered]
        if op == "create":
            if name in self.groups:
                return 400, {"error": "notification_key already exists"}
            if not valid:
                return 400, {"error": "no valid registration ids"}
            if len(valid) > 20:
                return 400, {"error": "maximum number of members exceeded"}
            key = "APA91b-%s-%s" % (name, secrets.token_hex(8))
            self.groups[name] = {"members": valid, "keys": {key}}
            return 200, {"notification_key": key}
        key = request.get("notification_key")
        owner = next((n for n, g in self.groups.items() if key in g["keys"]), None)
        if owner is None:
            return 400, {"error": "notification_key not found"}
        if name is not None and name != owner:
            return 400, {"error": "notification_key_name doesn't match the group name of the notification_key"}
        group = self.groups[owner]
        if op == "add":
            if not valid:
                return 400, {"error": "no valid registration ids"}
            merged = group["members"] + [t for t in valid if t not in group["members"]]
            if len(merged) > 20:
                return 400, {"error": "maximum number of members exceeded"}
            group["members"] = merged
            return 200, {"notification_key": key}
        if op == "remove":
            group["members"] = [t for t in group["members"] if t not in ids]
            if not group["members"]:
                del self.groups[owner]
            return 200, {"notification_key": key}
        return 400, {"error": "InvalidOperation"}

    # --- dispatch --------------------------------------------------------------------------------------

    def handle(self, method, raw_path, headers, body):
        url = urllib.parse.urlsplit(raw_path)
        parts = [urllib.parse.unquote(p) for p in url.path.strip("/").split("/")]
        query = urllib.parse.parse_qs(url.query)
        with self.lock:
            self.requests.append((method, url.path, dict(headers)))
            if parts == ["token"]:
                return self.token_endpoint(headers, body)
            if parts[0] == "v1" and len(parts) > 2 and parts[1] == "projects":
                return self.v1(method, parts, query, headers)
            if parts[0] == "iid":
                return self.iid(method, parts, query, headers, body)
            if parts == ["fcm", "notification"]:
                return self.groups_call(method, query, headers, body)
            self.violation("unknown path %s %s" % (method, url.path))
            return 404, {"error": "not found"}


def serve(fake):
    """Starts `fake` on 127.0.0.1, port 0; returns (server, base URL)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def respond(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            status, answer = fake.handle(self.command, self.path, self.headers, body)
            data = answer.encode() if isinstance(answer, str) else json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/html" if isinstance(answer, str) else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = do_PATCH = respond

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, "http://127.0.0.1:%d" % server.server_address[1]
