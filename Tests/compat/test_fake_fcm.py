"""`tidemark plan` and `apply --backend fcm` against an independent fake of FCM (fake_fcm.py, not
tidemark's emulator), over both topic transports, with a real service-account key: the fake
verifies the RS256 assertion, the headers and the body shapes, and records every request.

Run: python3 Tests/compat/test_fake_fcm.py   (TIDEMARK_BIN selects the binary)
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fake_fcm import FakeFCM, make_key, serve  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("TIDEMARK_BIN", os.path.join(ROOT, ".build", "debug", "tidemark"))
PROJECT = "fake-project"
SENDER_ID = "987654321012"


def token(i):
    return "fake%04d:APA91bF%s" % (i, "f" * 60)


class FakeFCMTest(unittest.TestCase):
    def setUp(self):
        self.work = tempfile.mkdtemp(prefix="tidemark-fake-")
        self.fake = None
        self.server = None

    def tearDown(self):
        if self.server:
            self.server.shutdown()
            self.server.server_close()
        shutil.rmtree(self.work, ignore_errors=True)

    def start(self, transport):
        # The key's token_uri must point at the fake, so the port comes first.
        placeholder, public = make_key(PROJECT, "http://127.0.0.1:1/token")
        self.fake = FakeFCM(PROJECT, SENDER_ID, public, placeholder["client_email"])
        self.server, base = serve(self.fake)
        placeholder["token_uri"] = base + "/token"
        self.key = placeholder
        key_path = os.path.join(self.work, "key.json")
        with open(key_path, "w") as f:
            json.dump(self.key, f)
        os.chmod(key_path, 0o600)
        for i in range(30):
            self.fake.registered.add(token(i))
        # Drift the fake starts with: device 1 subscribed itself to the authoritative topic.
        self.fake.topics[token(1)] = {"alerts", "chosen-by-the-app"}
        os.makedirs(os.path.join(self.work, "manifests"))
        with open(os.path.join(self.work, "tidemark.yaml"), "w") as f:
            f.write("project: %s\nbackend: fcm\ntransport: %s\nsender_id: \"%s\"\ncredentials: key.json\n"
                    "fcm_url: %s\niid_url: %s\n" % (PROJECT, transport, SENDER_ID, base, base))
        with open(os.path.join(self.work, "manifests", "devices.csv"), "w") as f:
            f.write("device_id,token,tier\n")
            for i in range(30):
                f.write("d%d,%s,%s\n" % (i, token(i), "gold" if i % 3 == 0 else "basic"))
            f.write("gone,%s,gold\n" % token(999))  # not registered in FCM: a dead token
        with open(os.path.join(self.work, "manifests", "topics.yaml"), "w") as f:
            f.write("inventory:\n  files: [devices.csv]\n"
                    "topics:\n"
                    "  - name: news\n    members: [{selector: {tier: [gold, basic]}}]\n"
                    "  - name: alerts\n    mode: authoritative\n    members: [{selector: {tier: gold}}]\n"
                    "groups:\n"
                    "  - notification_key_name: family\n    members: [{device: d2}, {device: d3}, {device: d4}]\n")
        return base

    def tidemark(self, *args):
        env = {k: v for k, v in os.environ.items()
               if k not in ("GOOGLE_APPLICATION_CREDENTIALS", "TIDEMARK_FCM_URL", "TIDEMARK_IID_URL")}
        proc = subprocess.run([BIN] + list(args) + ["-C", self.work], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=300)
        output = proc.stdout + proc.stderr
        # Credentials never appear in any output.
        self.assertNotIn(self.key["private_key"].splitlines()[1], output)
        for access in self.fake.access_tokens:
            self.assertNotIn(access, output)
        return proc.returncode, output

    def converge(self, transport):
        self.start(transport)
        status, output = self.tidemark("plan", "--detailed-exitcode")
        self.assertEqual(status, 2, output)
        status, output = self.tidemark("apply", "--auto-approve")
        self.assertEqual(status, 0, output)
        gold = {token(i) for i in range(30) if i % 3 == 0}
        news = {t for t, topics in self.fake.topics.items() if "news" in topics}
        alerts = {t for t, topics in self.fake.topics.items() if "alerts" in topics}
        self.assertEqual(news, {token(i) for i in range(30)})
        self.assertEqual(alerts, gold, "authoritative: device 1's own subscription is removed")
        self.assertIn("chosen-by-the-app", self.fake.topics[token(1)], "topics tidemark does not manage are left alone")
        self.assertEqual(self.fake.groups["family"]["members"], [token(2), token(3), token(4)])
        status, output = self.tidemark("plan", "--detailed-exitcode")
        self.assertEqual(status, 0, output)
        self.assertEqual(self.fake.violations, [])
        return self.fake.requests

    def test_v1_transport(self):
        requests = self.converge("v1")
        changes = [(m, p) for m, p, _ in requests if "topicSubscriptions" in p and m in ("POST", "DELETE")]
        # One request per membership change: 30 news + 10 alerts subscribes, one alerts unsubscribe.
        self.assertEqual(sum(1 for m, _ in changes if m == "POST"), 40)
        self.assertEqual(sum(1 for m, _ in changes if m == "DELETE"), 1)
        headers = next(h for m, p, h in requests if m == "POST" and "topicSubscriptions" in p)
        self.assertTrue(headers["Authorization"].startswith("Bearer "))
        self.assertFalse(any("/iid/" in p for _, p, _ in requests), "the v1 transport never calls IID")
        # Lists of 3 per page: device 1 had 2 topics, then 3 after the apply: paging was followed.
        self.assertTrue(any(m == "GET" and "topicSubscriptions" in p for m, p, _ in requests))

    def test_iid_transport(self):
        requests = self.converge("iid")
        batches = [p for m, p, _ in requests if m == "POST" and p.startswith("/iid/v1:batch")]
        self.assertEqual(sorted(batches), ["/iid/v1:batchAdd", "/iid/v1:batchAdd", "/iid/v1:batchRemove"])
        self.assertFalse(any("topicSubscriptions" in p for _, p, _ in requests), "the iid transport never calls v1")
        group = next(h for m, p, h in requests if p == "/fcm/notification" and m == "POST")
        self.assertEqual(group["project_id"], SENDER_ID)
        self.assertEqual(group["access_token_auth"], "true")

    def full_device(self, transport):
        # Device 5 already holds FCM's 2000 topics, which a plan from state alone cannot know:
        # subscribing it fails for that device alone (v1 FAILED_PRECONDITION, IID TOO_MANY_TOPICS),
        # the run ends in exit 1, and the device stays alive.
        self.start(transport)
        self.fake.topics[token(5)] = {"t%d" % i for i in range(2000)}
        status, output = self.tidemark("apply", "--auto-approve", "--no-refresh")
        self.assertEqual(status, 1, output)
        self.assertIn("TOO_MANY_TOPICS", output)
        status, listing = self.tidemark("state", "list", "--format", "json")
        self.assertEqual(status, 0, listing)
        self.assertEqual(json.loads(listing)["dead"], 1, "only the unregistered token is dead: " + listing)
        self.assertNotIn("news", self.fake.topics[token(5)])
        self.assertIn("news", self.fake.topics[token(6)])

    def test_full_device_v1(self):
        self.full_device("v1")

    def test_full_device_iid(self):
        self.full_device("iid")

    def test_bad_key_is_one_clear_line(self):
        self.start("v1")
        with open(os.path.join(self.work, "key.json"), "w") as f:
            f.write('{"type": "service_account", "project_id": "%s"}' % PROJECT)
        status, output = self.tidemark("plan")
        self.assertEqual(status, 1)
        self.assertIn("key.json has no \"private_key", output)
        self.assertEqual(len([l for l in output.splitlines() if l.strip()]), 1, output)


if __name__ == "__main__":
    unittest.main(verbosity=2)
