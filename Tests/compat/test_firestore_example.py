"""The Firestore example of docs/inventory.md (examples/firestore/) against a fake of Firestore's
REST API: run_query.py pages through a collection with runQuery, tidemark reads it as an `exec`
inventory source, and mark_dead.py marks dead tokens' documents inactive, only while they still
hold the dead token.

Run: python3 Tests/compat/test_firestore_example.py   (TIDEMARK_BIN selects the binary)
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlparse

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("TIDEMARK_BIN", os.path.join(ROOT, ".build", "debug", "tidemark"))
EXAMPLE = os.path.join(ROOT, "examples", "firestore")
PREFIX = "/v1/projects/fs-project/databases/(default)/documents"


def token(i):
    return "fs%05dxxxx:APA91b%s" % (i, "F" * 140)


class FakeFirestore:
    def __init__(self, count):
        self.documents = {}
        self.queries = 0
        self.patches = []
        for i in range(count):
            name = f"projects/fs-project/databases/(default)/documents/fcm_tokens/inst-{i:03d}"
            self.documents[name] = {
                "name": name,
                "updateTime": "2026-11-01T00:00:00.000000Z",
                "fields": {
                    "token": {"stringValue": token(i)},
                    "userId": {"stringValue": f"u{i // 2}"},
                    "platform": {"stringValue": "ios" if i % 2 else "android"},
                    "active": {"booleanValue": i % 5 != 4},
                    "lastSeen": {"timestampValue": "2026-11-20T10:00:00Z"},
                },
            }

    def handler(fake):
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def reply(self, status, body):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                if self.path != PREFIX + ":runQuery":
                    return self.reply(404, {"error": {"code": 404, "message": "not found"}})
                fake.queries += 1
                query = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["structuredQuery"]
                assert query["from"] == [{"collectionId": "fcm_tokens"}], query
                assert query["where"]["fieldFilter"]["field"]["fieldPath"] == "active"
                names = sorted(n for n, d in fake.documents.items() if d["fields"]["active"]["booleanValue"])
                if "startAt" in query:
                    after = query["startAt"]["values"][0]["referenceValue"]
                    names = [n for n in names if n > after]
                page = names[: query["limit"]]
                self.reply(200, [{"document": fake.documents[n], "readTime": "2026-11-22T00:00:00Z"} for n in page]
                           or [{"readTime": "2026-11-22T00:00:00Z"}])

            def document(self):
                path = urlparse(self.path).path
                return "projects/fs-project/databases/(default)/documents" + unquote(path[len(PREFIX):])

            def do_GET(self):
                name = self.document()
                if name not in fake.documents:
                    return self.reply(404, {"error": {"code": 404}})
                self.reply(200, fake.documents[name])

            def do_PATCH(self):
                name = self.document()
                query = parse_qs(urlparse(self.path).query)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                assert query["updateMask.fieldPaths"] == ["active"], query
                if query.get("currentDocument.updateTime") != [fake.documents[name]["updateTime"]]:
                    return self.reply(412, {"error": {"code": 412}})
                fake.documents[name]["fields"]["active"] = body["fields"]["active"]
                fake.documents[name]["updateTime"] = "2026-11-22T00:00:01.000000Z"
                fake.patches.append(name.rsplit("/", 1)[-1])
                self.reply(200, fake.documents[name])

        return Handler


class FirestoreExampleTest(unittest.TestCase):
    def setUp(self):
        self.fake = FakeFirestore(23)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self.fake.handler())
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.env = dict(os.environ, FIRESTORE_PROJECT="fs-project", FIRESTORE_PAGE_SIZE="5",
                        FIRESTORE_EMULATOR_HOST=f"127.0.0.1:{self.server.server_address[1]}")
        self.project = tempfile.mkdtemp(prefix="tm-firestore-")
        os.makedirs(os.path.join(self.project, "manifests"))
        shutil.copytree(EXAMPLE, os.path.join(self.project, "firestore"))
        with open(os.path.join(self.project, "tidemark.yaml"), "w") as f:
            f.write("inventory:\n  - name: firestore\n    exec:\n"
                    "      command: [python3, firestore/run_query.py]\n      format: jsonl\n      timeout: 60s\n"
                    "    on_dead: {exec: [python3, firestore/mark_dead.py]}\n"
                    "    exclude_if: {last_seen_older_than: 270d}\n")
        with open(os.path.join(self.project, "manifests", "topics.yaml"), "w") as f:
            f.write("topics:\n  - name: ios-news\n    members: [{selector: {platform: ios}}]\n")

    def tearDown(self):
        self.server.shutdown()
        shutil.rmtree(self.project, ignore_errors=True)

    def test_pages_through_the_collection(self):
        out = subprocess.run([sys.executable, os.path.join(EXAMPLE, "run_query.py")], env=self.env,
                             capture_output=True, text=True, check=True).stdout
        devices = [json.loads(line) for line in out.splitlines()]
        active = [i for i in range(23) if i % 5 != 4]
        self.assertEqual([d["id"] for d in devices], [f"inst-{i:03d}" for i in active])
        self.assertEqual(devices[1]["labels"], {"user": "u0", "platform": "ios", "last_seen": "2026-11-20T10:00:00Z"})
        self.assertEqual(self.fake.queries, 4)  # 19 documents in pages of 5

    def test_tidemark_reads_it_and_marks_dead_tokens(self):
        result = subprocess.run([BIN, "validate", "-C", self.project], env=self.env, capture_output=True, text=True)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("19 devices", result.stdout)
        # The hook marks inst-001 inactive; inst-003 rotated its token meanwhile and stays active.
        rotated = "projects/fs-project/databases/(default)/documents/fcm_tokens/inst-003"
        self.fake.documents[rotated]["fields"]["token"] = {"stringValue": token(999)}
        lines = "".join(json.dumps({"device_id": f"inst-{i:03d}", "token": token(i), "token_redacted": "x",
                                    "source": "inventory source 'firestore'", "reason": "unregistered"}) + "\n"
                        for i in (1, 3))
        hook = subprocess.run([sys.executable, os.path.join(EXAMPLE, "mark_dead.py")], input=lines, env=self.env,
                              capture_output=True, text=True)
        self.assertEqual(hook.returncode, 0, hook.stderr)
        self.assertEqual(self.fake.patches, ["inst-001"])
        again = subprocess.run([sys.executable, os.path.join(EXAMPLE, "mark_dead.py")], input=lines, env=self.env,
                               capture_output=True, text=True)
        self.assertEqual(again.returncode, 0, again.stderr)
        self.assertEqual(self.fake.patches, ["inst-001"], "idempotent")

    def test_a_failing_query_is_one_line(self):
        env = dict(self.env, FIRESTORE_PROJECT="other-project")
        result = subprocess.run([BIN, "validate", "-C", self.project], env=env, capture_output=True, text=True)
        self.assertEqual(result.returncode, 1)
        errors = [line for line in result.stderr.splitlines() if "error:" in line]
        self.assertEqual(len(errors), 1, result.stderr)
        self.assertIn("tidemark.yaml:2:5: error: inventory source 'firestore' failed", errors[0])
        self.assertIn("runQuery answered HTTP 404", errors[0])


if __name__ == "__main__":
    unittest.main(verbosity=2)
