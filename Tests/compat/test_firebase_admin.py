"""The official firebase-admin Python SDK, unmodified, against tidemark's emulator.

Starts `tidemark emulator serve --port 0`, gives the SDK the emulator's service-account key file
as its credential (so it signs a real RS256 JWT and exchanges it at the emulator's token
endpoint), points the SDK's FCM and IID base URLs at the emulator, and checks subscribe /
unsubscribe (v1 topic API), per-token errors, the legacy IID calls and sends.

Run: python3 Tests/compat/test_firebase_admin.py   (TIDEMARK_BIN selects the binary)
"""

import json
import os
import shutil
import sys
import tempfile
import unittest
import warnings

import firebase_admin
from firebase_admin import credentials, exceptions, messaging

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "lib"))
from harness import Emulator  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("TIDEMARK_BIN", os.path.join(ROOT, ".build", "debug", "tidemark"))
PROJECT = "compat-project"


def token(i):
    return f"compat{i:04d}:APA91bH{'x' * 40}{i:04d}"


def start_emulator():
    """The emulator with a data directory, so its key file stays at a known path; stop with `stop_emulator`."""
    emulator = Emulator(BIN, PROJECT, data=tempfile.mkdtemp(prefix="tidemark-compat-"))
    return emulator.__enter__()


def stop_emulator(emulator):
    emulator.__exit__(None, None, None)
    shutil.rmtree(emulator.data, ignore_errors=True)


class FirebaseAdminCompatTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.emulator = start_emulator()
        with open(cls.emulator.key) as f:
            key = json.load(f)
        assert key["token_uri"].startswith(cls.emulator.base), key["token_uri"]
        cls.app = firebase_admin.initialize_app(credentials.Certificate(cls.emulator.key), name="compat")
        # The SDK hard-codes Google's hosts; these are its own class/instance attributes.
        messaging._MessagingService.IID_URL = cls.emulator.base
        messaging._MessagingService.FCM_URL = cls.emulator.base + "/v1/projects/{0}/messages:send"
        service = messaging._get_messaging_service(cls.app)
        service._fcm_url = messaging._MessagingService.FCM_URL.format(PROJECT)
        service._fcm_topic_url = f"{cls.emulator.base}/v1/projects/{PROJECT}/registrations"
        cls.emulator.admin("POST", f"projects/{PROJECT}/registrations",
                           {"registrations": [{"token": token(i), "platform": "ANDROID", "app": "com.example.compat"}
                                              for i in range(10)]})

    @classmethod
    def tearDownClass(cls):
        firebase_admin.delete_app(cls.app)
        stop_emulator(cls.emulator)

    def subscribers(self, topic):
        return set(self.emulator.admin("GET", f"projects/{PROJECT}/topics/{topic}/subscribers")["subscribers"])

    def test_subscribe_and_unsubscribe_v1(self):
        response = messaging.subscribe_to_topic([token(0), token(1), token(2)], "news", app=self.app)
        self.assertEqual((response.success_count, response.failure_count), (3, 0))
        self.assertEqual(self.subscribers("news"), {token(0), token(1), token(2)})
        # Subscribing again is success (409 ALREADY_EXISTS counts as done).
        again = messaging.subscribe_to_topic([token(0)], "news", app=self.app)
        self.assertEqual((again.success_count, again.failure_count), (1, 0))
        response = messaging.unsubscribe_from_topic([token(1), token(3)], "news", app=self.app)
        self.assertEqual((response.success_count, response.failure_count), (2, 0))
        self.assertEqual(self.subscribers("news"), {token(0), token(2)})

    def test_per_token_errors_v1(self):
        unknown = "unknown0:APA91bH" + "y" * 40
        self.emulator.admin("DELETE", f"projects/{PROJECT}/registrations/{token(9)}")  # uninstalled
        response = messaging.subscribe_to_topic([token(4), unknown, token(5), token(9)], "sports", app=self.app)
        self.assertEqual((response.success_count, response.failure_count), (2, 2))
        self.assertEqual([(e.index, e.reason) for e in response.errors], [(1, "NOT_FOUND"), (3, "NOT_FOUND")])
        bad = messaging.subscribe_to_topic([token(4), "not a token!"], "sports", app=self.app)
        self.assertEqual([(e.index, e.reason) for e in bad.errors], [(1, "INVALID_ARGUMENT")])
        self.assertEqual(self.subscribers("sports"), {token(4), token(5)})

    def test_legacy_iid_calls(self):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            response = messaging.subscribe_to_topic_legacy([token(6), "gone0000:APA91bH" + "z" * 40, token(7)],
                                                           "legacy", app=self.app)
            self.assertEqual((response.success_count, response.failure_count), (2, 1))
            self.assertEqual([(e.index, e.reason) for e in response.errors], [(1, "NOT_FOUND")])
            self.assertEqual(self.subscribers("legacy"), {token(6), token(7)})
            response = messaging.unsubscribe_from_topic_legacy([token(6)], "/topics/legacy", app=self.app)
            self.assertEqual((response.success_count, response.failure_count), (1, 0))
            self.assertEqual(self.subscribers("legacy"), {token(7)})

    def test_send_to_topic_and_condition(self):
        messaging.subscribe_to_topic([token(0), token(1)], "weather", app=self.app)
        messaging.subscribe_to_topic([token(1), token(2)], "alerts", app=self.app)
        name = messaging.send(messaging.Message(topic="weather", data={"k": "v"}), app=self.app)
        self.assertRegex(name, rf"^projects/{PROJECT}/messages/.+")
        deliveries = self.emulator.admin("GET", f"projects/{PROJECT}/deliveries")["deliveries"]
        delivered = next(d for d in deliveries if d["name"] == name)
        self.assertEqual(set(delivered["recipients"]), {token(0), token(1)})

        condition = "'weather' in topics && ('alerts' in topics || 'nothing' in topics)"
        name = messaging.send(messaging.Message(condition=condition, notification=messaging.Notification(title="t")),
                              app=self.app)
        deliveries = self.emulator.admin("GET", f"projects/{PROJECT}/deliveries")["deliveries"]
        self.assertEqual(next(d for d in deliveries if d["name"] == name)["recipients"], [token(1)])

        dry = messaging.send(messaging.Message(topic="weather"), dry_run=True, app=self.app)
        self.assertEqual(dry, f"projects/{PROJECT}/messages/fake_message_id")
        self.assertEqual(len(self.emulator.admin("GET", f"projects/{PROJECT}/deliveries")["deliveries"]),
                         len(deliveries))

        with self.assertRaises(exceptions.InvalidArgumentError):
            messaging.send(messaging.Message(condition="\"weather\" in topics"), app=self.app)
        with self.assertRaises(messaging.UnregisteredError):
            messaging.send(messaging.Message(fid="nobody00:APA91bH" + "q" * 40), app=self.app)


if __name__ == "__main__":
    result = unittest.main(verbosity=2, exit=False).result
    sys.exit(0 if result.wasSuccessful() else 1)
