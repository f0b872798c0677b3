"""Keyless credentials end to end against tidemark's emulator, which serves the Security Token
Service, IAM credentials' generateAccessToken and a metadata server:

- an external_account file (workload identity federation) with a subject token from a file,
  exchanged at STS and used to impersonate the emulator's service account;
- the same with the subject token from a URL with a header and a JSON body (GitHub's OIDC shape),
  and the federated token used directly;
- a metadata server (GCE_METADATA_HOST) and no credentials file at all;
- HTTP_PROXY / NO_PROXY honoured, with proxy credentials never printed;
- every way it can be wrong gives one clear message and exit 1, never a token in the output.

Run: python3 Tests/compat/test_keyless.py   (TIDEMARK_BIN selects the binary)
"""

import base64
import json
import os
import select
import shutil
import socket
import socketserver
import sys
import tempfile
import threading
import time
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts", "lib"))
from harness import Emulator, make_project, tidemark  # noqa: E402

BIN = os.path.abspath(os.environ.get("TIDEMARK_BIN", os.path.join(ROOT, ".build", "debug", "tidemark")))
PROJECT = "keyless-demo"
PROVIDER = "//iam.googleapis.com/projects/123456/locations/global/workloadIdentityPools/ci/providers/github"


def b64(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def oidc_token(audience="https:" + PROVIDER, exp_in=600, sub="repo:acme/fcm-config:ref:refs/heads/main"):
    """A token shaped like GitHub's OIDC token (the emulator cannot check GitHub's signature)."""
    header = b64(json.dumps({"alg": "RS256", "typ": "JWT", "kid": "gh"}).encode())
    claims = {"iss": "https://token.actions.githubusercontent.com", "aud": audience, "sub": sub,
              "iat": int(time.time()), "exp": int(time.time()) + exp_in}
    return "%s.%s.%s" % (header, b64(json.dumps(claims).encode()), b64(b"signature"))


class TokenURL:
    """Serves a subject token as GitHub's ACTIONS_ID_TOKEN_REQUEST_URL does: JSON {"value": …}, only
    to a caller with the request token."""

    def __init__(self, token):
        outer = self
        self.calls = 0

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                outer.calls += 1
                if self.headers.get("Authorization") != "Bearer request-token":
                    self.send_response(401)
                    self.end_headers()
                    return
                body = json.dumps({"count": 1, "value": token}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = "http://127.0.0.1:%d/token?audience=x" % self.server.server_address[1]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class Proxy:
    """An HTTP proxy: CONNECT tunnels and absolute-form requests, counting what it carried, and
    refusing callers without the right Proxy-Authorization when it has a password."""

    def __init__(self, credentials=None):
        outer = self
        self.requests = []
        self.expected = None if credentials is None else "Basic " + base64.b64encode(credentials.encode()).decode()

        class Handler(socketserver.StreamRequestHandler):
            def handle(self):
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = self.connection.recv(65536)
                    if not chunk:
                        return
                    head += chunk
                header, rest = head.split(b"\r\n\r\n", 1)
                lines = header.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                fields = {l.split(":", 1)[0].lower(): l.split(":", 1)[1].strip() for l in lines[1:] if ":" in l}
                outer.requests.append((method, target))
                if outer.expected and fields.get("proxy-authorization") != outer.expected:
                    self.connection.sendall(b"HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n")
                    return
                if method == "CONNECT":
                    host, port = target.rsplit(":", 1)
                    upstream = socket.create_connection((host, int(port)))
                    self.connection.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    if rest:
                        upstream.sendall(rest)
                else:
                    hostport = target.split("/")[2]
                    host, port = hostport.rsplit(":", 1)
                    upstream = socket.create_connection((host, int(port)))
                    path = "/" + target.split("/", 3)[3] if target.count("/") >= 3 else "/"
                    kept = [l for l in lines[1:] if not l.lower().startswith("proxy-")]
                    upstream.sendall(("%s %s HTTP/1.1\r\n" % (method, path) + "\r\n".join(kept) + "\r\n\r\n").encode("latin-1") + rest)
                sockets = [self.connection, upstream]
                try:
                    while True:
                        readable, _, _ = select.select(sockets, [], [], 30)
                        if not readable:
                            break
                        for s in readable:
                            data = s.recv(65536)
                            if not data:
                                return
                            (upstream if s is self.connection else self.connection).sendall(data)
                finally:
                    upstream.close()

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.server = Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.port = self.server.server_address[1]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class KeylessTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.work = tempfile.mkdtemp(prefix="tm-keyless-")
        cls.tokens = make_project(cls.work, PROJECT, devices=20, topics=2)
        cls.emulator = Emulator(BIN, PROJECT, "--auto-register", "--rate-limit", "0").__enter__()
        with open(cls.emulator.key) as f:
            cls.service_account = json.load(f)["client_email"]

    @classmethod
    def tearDownClass(cls):
        cls.emulator.__exit__(None, None, None)
        shutil.rmtree(cls.work, ignore_errors=True)

    def env(self, **extra):
        env = {k: v for k, v in os.environ.items()
               if k not in ("GOOGLE_APPLICATION_CREDENTIALS", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy",
                            "https_proxy", "no_proxy", "GCE_METADATA_HOST")}
        env.update(FCM_EMULATOR_HOST=self.emulator.host, NO_GCE_CHECK="True")
        env.update(extra)
        return env

    def write(self, name, content):
        path = os.path.join(self.work, name)
        with open(path, "w") as f:
            f.write(content if isinstance(content, str) else json.dumps(content))
        return path

    def external(self, name, source, impersonate=True, audience=PROVIDER):
        config = {"type": "external_account", "audience": audience,
                  "subject_token_type": "urn:ietf:params:oauth:token-type:jwt",
                  "token_url": self.emulator.base + "/v1/token", "credential_source": source}
        if impersonate:
            config["service_account_impersonation_url"] = (
                self.emulator.base + "/v1/projects/-/serviceAccounts/%s:generateAccessToken" % self.service_account)
        return self.write(name, config)

    def plan(self, env):
        return tidemark(BIN, self.work, ["plan", "--refresh", "all"], env, check=False)

    def assertNoSecrets(self, output, *secrets):
        for secret in secrets:
            self.assertNotIn(secret, output)

    def test_file_subject_token_with_impersonation(self):
        subject = oidc_token()
        token_file = self.write("oidc-token", subject + "\n")
        creds = self.external("wif-file.json", {"file": token_file})
        status, out, err = tidemark(BIN, self.work, ["apply", "--auto-approve"], self.env(GOOGLE_APPLICATION_CREDENTIALS=creds), check=False)
        self.assertEqual(status, 0, err)
        self.assertIn("Apply complete", out)
        self.assertEqual(len(self.emulator.subscribers("bench-0")), 20)
        self.assertNoSecrets(out + err, subject)

    def test_url_subject_token_used_directly(self):
        server = TokenURL(oidc_token())
        try:
            creds = self.external("wif-url.json", {
                "url": server.url, "headers": {"Authorization": "Bearer request-token"},
                "format": {"type": "json", "subject_token_field_name": "value"}}, impersonate=False)
            status, out, err = self.plan(self.env(GOOGLE_APPLICATION_CREDENTIALS=creds))
            self.assertIn(status, (0, 2), err)
            self.assertGreaterEqual(server.calls, 1)
            # Without the request token, the URL refuses, and tidemark says where and why.
            creds = self.external("wif-url-bad.json", {
                "url": server.url, "format": {"type": "json", "subject_token_field_name": "value"}})
            status, out, err = self.plan(self.env(GOOGLE_APPLICATION_CREDENTIALS=creds))
            self.assertEqual(status, 1)
            # The query's names are shown, never its values (one redaction for every URL printed).
            self.assertIn("error: the subject token URL http://127.0.0.1:%d/token?audience=*** (credential_source.url) refused" % server.server.server_address[1], err)
            self.assertNotIn("audience=x", err, "the query's values are not shown")
        finally:
            server.close()

    def test_refusals_are_clear(self):
        cases = [
            ("wrong audience", {"file": self.write("t-aud", oidc_token(audience="https://github.com/acme"))}, {},
             "refused the subject token for %s: invalid_grant (The audience in the subject token" % PROVIDER),
            ("expired", {"file": self.write("t-exp", oidc_token(exp_in=-60))}, {}, "The subject token has expired"),
            ("missing file", {"file": os.path.join(self.work, "nope")}, {},
             "the subject token file %s (credential_source.file) does not exist" % os.path.join(self.work, "nope")),
            ("executable", {"executable": {"command": "/bin/true"}}, {}, "gets its subject token from an executable"),
        ]
        for name, source, _, expected in cases:
            creds = self.external("bad-%s.json" % name.replace(" ", "-"), source)
            status, out, err = self.plan(self.env(GOOGLE_APPLICATION_CREDENTIALS=creds))
            self.assertEqual(status, 1, name)
            self.assertIn(expected, err, name)
        # Impersonating a service account the federated identity may not use.
        with open(self.external("bad-sa.json", {"file": self.write("t-ok", oidc_token())})) as f:
            config = json.load(f)
        config["service_account_impersonation_url"] = config["service_account_impersonation_url"].replace(
            self.service_account, "stranger@other.iam.gserviceaccount.com")
        status, out, err = self.plan(self.env(GOOGLE_APPLICATION_CREDENTIALS=self.write("bad-sa.json", config)))
        self.assertEqual(status, 1)
        self.assertIn("IAM credentials refused to let the workload identity act as stranger@other.iam.gserviceaccount.com: NOT_FOUND", err)
        user = self.write("user.json", {"type": "authorized_user", "client_id": "x", "refresh_token": "secret-refresh"})
        status, out, err = self.plan(self.env(GOOGLE_APPLICATION_CREDENTIALS=user))
        self.assertEqual(status, 1)
        self.assertIn("authorized_user", err)
        self.assertNoSecrets(out + err, "secret-refresh")

    def test_metadata_server(self):
        status, out, err = self.plan(self.env(GCE_METADATA_HOST=self.emulator.host))
        self.assertIn(status, (0, 2), err)
        status, out, err = self.plan(self.env())
        self.assertEqual(status, 1)
        self.assertIn("GOOGLE_APPLICATION_CREDENTIALS is not set", err)

    def test_proxy_and_no_proxy(self):
        proxy = Proxy(credentials="corp:s3cret-pass")
        try:
            env = self.env(GOOGLE_APPLICATION_CREDENTIALS=self.emulator.key,
                           HTTP_PROXY="http://corp:s3cret-pass@127.0.0.1:%d" % proxy.port)
            status, out, err = self.plan(env)
            self.assertIn(status, (0, 2), err)
            carried = len(proxy.requests)
            self.assertGreater(carried, 0, "requests went through the proxy")
            self.assertNoSecrets(out + err, "s3cret-pass")
            env["NO_PROXY"] = "localhost,127.0.0.1"
            status, out, err = self.plan(env)
            self.assertIn(status, (0, 2), err)
            self.assertEqual(len(proxy.requests), carried, "NO_PROXY hosts are reached directly")
            # A wrong proxy password: the proxy's 407 fails the run, and the password is not shown.
            env = self.env(GOOGLE_APPLICATION_CREDENTIALS=self.emulator.key,
                           HTTP_PROXY="http://corp:wrong-pass@127.0.0.1:%d" % proxy.port)
            status, out, err = self.plan(env)
            self.assertEqual(status, 1)
            self.assertIn("error: the proxy http://127.0.0.1:%d refused tidemark (407" % proxy.port, err)
            self.assertNoSecrets(out + err, "wrong-pass")
            status, out, err = self.plan(self.env(GOOGLE_APPLICATION_CREDENTIALS=self.emulator.key, HTTP_PROXY="socks5://x:1"))
            self.assertEqual(status, 1)
            self.assertIn("HTTP_PROXY names a socks5 proxy", err)
        finally:
            proxy.close()


if __name__ == "__main__":
    unittest.main()
