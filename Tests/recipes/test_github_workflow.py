"""The GitHub recipe (examples/github/tidemark.yml) run for real, job by job, against tidemark's
emulator as FCM, with a fake `gh` that records comments, issues, runs and artifacts:

- two pushes to a pull request leave one plan comment, updated in place, the older plan collapsed;
- merging applies exactly the reviewed plan; a pull request with no changes is saved and applied
  as a clean no-op;
- a pull request from a fork gets no comment, and its summary says it planned from the manifests alone;
- drift seeded through the emulator's admin API opens one issue, which the scheduled job's
  correction closes; past --max-unsubscribes it corrects nothing, fails, and keeps the issue open
  until a later run corrects it.

GitLabInstallTest runs the GitLab template's install script against the same local releases.

Run: python3 Tests/recipes/test_github_workflow.py   (TIDEMARK_BIN selects the binary;
TIDEMARK_TEST_POSTGRES_URL puts state in PostgreSQL, as the recipe recommends, else SQLite)
"""

import functools
import hashlib
import hmac
import base64
import json
import os
import platform
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import unittest
import uuid
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "scripts", "lib"))
import actions  # noqa: E402
from harness import Emulator  # noqa: E402

BIN = os.path.abspath(os.environ.get("TIDEMARK_BIN", os.path.join(ROOT, ".build", "debug", "tidemark")))
REPO = "acme/fcm-config"
PROJECT = "tidemark-demo"


class Releases:
    """A local stand-in for the project's release downloads: VERSION/NAME.tar.gz and its .sha256,
    packed as scripts/release.sh packs them (here from the binary under test), under three
    prefixes: good/, tampered/ (a checksum that does not match) and empty/ (no release)."""

    def __init__(self, version):
        self.root = tempfile.mkdtemp(prefix="tm-releases-")
        arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(platform.machine(), platform.machine())
        name = "tidemark-%s-linux-%s" % (version, arch)
        for prefix in ("good", "tampered"):
            folder = os.path.join(self.root, prefix, "v" + version)
            os.makedirs(folder)
            archive = os.path.join(folder, name + ".tar.gz")
            with tarfile.open(archive, "w:gz", compresslevel=1) as tar:
                tar.add(BIN, arcname=name + "/tidemark")
            with open(archive, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            if prefix == "tampered":
                digest = digest[::-1]
            with open(archive + ".sha256", "w") as f:
                f.write("%s  %s.tar.gz\n" % (digest, name))
        os.makedirs(os.path.join(self.root, "empty"))
        handler = functools.partial(Quiet, directory=self.root)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base = "http://127.0.0.1:%d" % self.server.server_address[1]

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        shutil.rmtree(self.root, ignore_errors=True)


class Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


PROVIDER = "projects/123456/locations/global/workloadIdentityPools/ci/providers/github"


def oidc_token(audience):
    """A token shaped like GitHub's OIDC token (the emulator cannot check GitHub's signature)."""
    def b64(data):
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()
    claims = {"iss": "https://token.actions.githubusercontent.com", "aud": audience,
              "sub": "repo:%s:ref:refs/heads/main" % REPO, "iat": int(time.time()), "exp": int(time.time()) + 600}
    return "%s.%s.%s" % (b64(json.dumps({"alg": "RS256", "typ": "JWT"}).encode()), b64(json.dumps(claims).encode()),
                         b64(b"signature"))


class Webhook:
    """A webhook receiver: keeps each delivery whose X-Tidemark-Signature verifies under SECRET."""
    SECRET = "recipe-webhook-secret"

    def __init__(self):
        outer = self
        self.events = []
        self.rejected = 0

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                signed = self.headers.get("X-Tidemark-Timestamp", "").encode() + b"." + body
                want = "sha256=" + hmac.new(Webhook.SECRET.encode(), signed, hashlib.sha256).hexdigest()
                if hmac.compare_digest(want, self.headers.get("X-Tidemark-Signature", "")):
                    outer.events.append(json.loads(body))
                else:
                    outer.rejected += 1
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = "http://127.0.0.1:%d/hooks/tidemark" % self.server.server_address[1]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class Hub:
    """GitHub, as far as the recipe sees it: the repository's files, events, runs and the fake gh."""

    def __init__(self, emulator, state_url):
        self.root = tempfile.mkdtemp(prefix="tm-recipe-")
        self.repo = os.path.join(self.root, "repo")
        shutil.copytree(os.path.join(ROOT, "manifests"), os.path.join(self.repo, "manifests"))
        with open(os.path.join(self.repo, "tidemark.yaml"), "w") as f:
            f.write("project: %s\n" % PROJECT)
        self.db = os.path.join(self.root, "gh.json")
        with open(self.db, "w") as f:
            json.dump({"comments": {}, "issues": [], "runs": [], "merges": {}, "next_id": 100, "log": []}, f)
        self.bin = os.path.join(self.root, "bin")
        os.makedirs(self.bin)
        # curl, recorded: every download the recipe makes is logged, then made by the real curl.
        self.curl_log = os.path.join(self.root, "curl.log")
        curl = os.path.join(self.bin, "curl")
        with open(curl, "w") as f:
            f.write("#!/bin/sh\nprintf '%%s\\n' \"$*\" >> '%s'\nexec %s \"$@\"\n" % (self.curl_log, shutil.which("curl")))
        os.chmod(curl, 0o755)
        gh = os.path.join(self.bin, "gh")
        with open(gh, "w") as f:
            f.write("#!/bin/sh\nFAKE_GH_DB='%s' exec %s %s \"$@\"\n" % (self.db, sys.executable, os.path.join(HERE, "fake_gh.py")))
        os.chmod(gh, os.stat(gh).st_mode | stat.S_IEXEC)
        self.emulator = emulator
        self.workflow = actions.load(os.path.join(ROOT, "examples", "github", "tidemark.yml"))
        with open(emulator.key) as f:
            service_account = json.load(f)["client_email"]
        # No key anywhere: the jobs that reach FCM sign in with an OIDC token (workload identity federation).
        self.webhook = Webhook()
        self.secrets = {"TIDEMARK_STATE_URL": state_url, "TIDEMARK_STATE_URL_READONLY": state_url,
                        "TIDEMARK_PLAN_KEY": base64.b64encode(os.urandom(32)).decode(),
                        "TIDEMARK_WEBHOOK_URL": self.webhook.url, "TIDEMARK_WEBHOOK_SECRET": Webhook.SECRET}
        self.vars = {"TIDEMARK_WORKSPACE": "recipe-" + uuid.uuid4().hex[:8],
                     "GCP_WORKLOAD_IDENTITY_PROVIDER": PROVIDER, "GCP_SERVICE_ACCOUNT": service_account}
        self.run_id = 0
        self.jobs = []
        self.fallbacks = []

    def gh(self):
        with open(self.db) as f:
            return json.load(f)

    def edit(self, update):
        db = self.gh()
        update(db)
        with open(self.db, "w") as f:
            json.dump(db, f)

    def uses(self, action, with_, job):
        """The `uses:` steps of the recipe, stood in for."""
        if action.startswith("actions/checkout@"):
            return True
        if action == "./.github/actions/install-tidemark":
            return job.composite(os.path.join(ROOT, "examples", "github", "actions", "install-tidemark", "action.yml"),
                                 with_)
        if action.startswith("actions/cache@"):
            # Building from source is the fallback; it is asked for, and not available here.
            self.fallbacks.append(action)
            return False
        if action.startswith("google-github-actions/auth@"):
            # As the action does with workload identity federation: GitHub's OIDC token (only for a job
            # granted id-token: write) in an external_account file that tidemark exchanges at STS and
            # uses to impersonate the service account; the emulator serves both.
            if "credentials_json" in with_:
                raise AssertionError("the recipe signs in with a service-account key")
            if (job.spec.get("permissions") or {}).get("id-token") != "write":
                job.log.append(("auth", 1, "", "no id-token: write permission, so no OIDC token"))
                return False
            provider = with_["workload_identity_provider"]
            token = os.path.join(job.temp, "oidc-token")
            with open(token, "w") as f:
                f.write(oidc_token("https://iam.googleapis.com/" + provider))
            path = os.path.join(job.workdir, "gha-creds-%s.json" % uuid.uuid4().hex[:16])
            with open(path, "w") as f:
                json.dump({"type": "external_account", "audience": "//iam.googleapis.com/" + provider,
                           "subject_token_type": "urn:ietf:params:oauth:token-type:jwt",
                           "token_url": self.emulator.base + "/v1/token", "credential_source": {"file": token},
                           "service_account_impersonation_url": self.emulator.base
                           + "/v1/projects/-/serviceAccounts/%s:generateAccessToken" % with_["service_account"]}, f)
            job.exports["GOOGLE_APPLICATION_CREDENTIALS"] = path
            return True
        if action.startswith("actions/upload-artifact@"):
            store = os.path.join(self.root, "artifacts", str(self.run_id), with_["name"])
            os.makedirs(store, exist_ok=True)
            source = os.path.join(job.workdir, with_["path"])
            if not os.path.exists(source):
                return False
            shutil.copy(source, store)
            self.edit(lambda db: next(r for r in db["runs"] if r["id"] == self.run_id)["artifacts"].update(
                {with_["name"]: store}))
            return True
        raise AssertionError("the recipe uses an action the test does not stand in for: " + action)

    def trigger(self, event_name, sha, event=None, event_vars=None):
        """Runs every job of the workflow for one event, as a fresh checkout; returns {job: status}."""
        self.run_id += 1
        self.edit(lambda db: db["runs"].append({"id": self.run_id, "workflow": "tidemark.yml",
                                                "head_sha": (event or {}).get("pull_request", {}).get("head", {}).get("sha", sha),
                                                "event": event_name, "status": "in_progress", "artifacts": {}}))
        context = {"github": {"event_name": event_name, "sha": sha, "repository": REPO, "token": "ghs_fake",
                              "event": event or {}},
                   "secrets": self.secrets, "vars": dict(self.vars, **(event_vars or {}))}
        statuses = {}
        for name in self.workflow["jobs"]:
            workdir = os.path.join(self.root, "run-%d-%s" % (self.run_id, name))
            shutil.copytree(self.repo, workdir)
            env = {"TIDEMARK_FCM_URL": self.emulator.base, "TIDEMARK_IID_URL": self.emulator.base,
                   "PATH": os.environ["PATH"]}
            job = actions.Job(self.workflow, name, context, workdir, self.uses, path=[self.bin])
            saved = dict(os.environ)
            os.environ.update(env)
            os.environ.pop("GOOGLE_APPLICATION_CREDENTIALS", None)
            os.environ.pop("FCM_EMULATOR_HOST", None)
            try:
                statuses[name] = job.run()
            finally:
                os.environ.clear()
                os.environ.update(saved)
                # A runner empties RUNNER_TEMP when its job ends (each holds an installed binary); the
                # step summary is kept beside the job's workspace for the checks.
                kept = os.path.join(self.root, "summary-%d-%s.md" % (self.run_id, name))
                if os.path.exists(job.summary):
                    shutil.move(job.summary, kept)
                    job.summary = kept
                shutil.rmtree(job.temp, ignore_errors=True)
            self.jobs.append(job)
        final = "failure" if "failure" in statuses.values() else "success"
        self.edit(lambda db: next(r for r in db["runs"] if r["id"] == self.run_id).update(status=final))
        return statuses

    def pull_request(self, number, head, fork=False):
        full_name = ("someone/fcm-config" if fork else REPO)
        return self.trigger("pull_request", head, {"pull_request": {"number": number, "head": {
            "sha": head, "repo": {"full_name": full_name}}}})

    def merge(self, number, head, merge_sha):
        self.edit(lambda db: db["merges"].update({merge_sha: {"pr": number, "head": head}}))
        return self.trigger("push", merge_sha, {"ref": "refs/heads/main"})

    def transcript(self):
        return "\n".join(job.name + ":\n" + job.transcript() for job in self.jobs[-4:])


class GitHubRecipeTest(unittest.TestCase):
    def test_recipe(self):
        releases = Releases(self.version())
        with Emulator(BIN, PROJECT, "--auto-register", "--rate-limit", "0") as emulator:
            root = tempfile.mkdtemp(prefix="tm-recipe-state-")
            state = os.environ.get("TIDEMARK_TEST_POSTGRES_URL") or os.path.join(root, "state.db")
            hub = Hub(emulator, state)
            hub.vars["TIDEMARK_RELEASES_URL"] = releases.base + "/good"
            try:
                self.installs(hub, releases)
                self.scenario(hub, emulator)
            except BaseException:
                print(hub.transcript())
                raise
            finally:
                releases.close()
                hub.webhook.close()
                shutil.rmtree(root, ignore_errors=True)
                shutil.rmtree(hub.root, ignore_errors=True)

    @staticmethod
    def version():
        with open(os.path.join(ROOT, "examples", "github", "tidemark.yml")) as f:
            for line in f:
                if line.strip().startswith("TIDEMARK_REF:"):
                    return line.split(":", 1)[1].strip().lstrip("v")
        raise AssertionError("no TIDEMARK_REF in the workflow")

    def installs(self, hub, releases):
        """The install action downloads the release binary by version and verifies it; a checksum
        that does not match fails the job without building; no release falls back to a build."""
        hub.vars["TIDEMARK_RELEASES_URL"] = releases.base + "/tampered"
        self.assertEqual(hub.pull_request(1, "t1")["plan"], "failure")
        install = hub.jobs[-3].log[0]
        self.assertIn("FAILED", install[2] + install[3], install)
        self.assertEqual(hub.fallbacks, [], "a bad checksum must never fall back to building")
        self.assertEqual(len(hub.jobs[-3].log), 1, "nothing runs after a failed install")
        hub.vars["TIDEMARK_RELEASES_URL"] = releases.base + "/empty"
        self.assertEqual(hub.pull_request(1, "t2")["plan"], "failure")
        self.assertIn("No tidemark release binary for v%s" % self.version(), hub.jobs[-3].log[0][2])
        # Building from source is tried: with the runner's Swift 6 (the cache stand-in then declines), or
        # it stops saying that no toolchain is there.
        log = hub.jobs[-3].log
        self.assertTrue(hub.fallbacks[:1] == ["actions/cache@5a3ec84eff668545956fd18022155c47e93e2684"]
                        or "no Swift 6 toolchain" in str(log), log)
        hub.vars["TIDEMARK_RELEASES_URL"] = releases.base + "/good"
        os.unlink(hub.curl_log)

    def scenario(self, hub, emulator):
        # A pull request, pushed twice: one comment, updated, with the earlier plan collapsed under it.
        self.assertEqual(hub.pull_request(7, "a1")["plan"], "success", hub.transcript())
        with open(hub.curl_log) as f:
            downloads = f.read()
        version = self.version()
        self.assertIn("/good/v%s/tidemark-%s-linux-" % (version, version), downloads)
        self.assertIn(".tar.gz.sha256", downloads)
        self.assertEqual(hub.jobs[-3].log[0][2].strip().splitlines()[-1].split()[0], version, "the release binary ran")
        comments = hub.gh()["comments"]["7"]
        self.assertEqual(len(comments), 1)
        self.assertTrue(comments[0]["body"].startswith("<!-- tidemark-plan workspace="), comments[0]["body"][:200])
        self.assertIn("tidemark: Plan:", comments[0]["body"])
        self.assertIn("Plan of a1.", comments[0]["body"])
        with open(os.path.join(hub.repo, "manifests", "lifeboats.yaml"), "w") as f:
            f.write("topics:\n  - name: lifeboat-news\n    members: [{selector: {region: baltic}}]\n")
        self.assertEqual(hub.pull_request(7, "a2")["plan"], "success", hub.transcript())
        comments = hub.gh()["comments"]["7"]
        self.assertEqual(len(comments), 1, "a second push must update the comment, not add one")
        body = comments[0]["body"]
        self.assertEqual(comments[0].get("edits"), 1)
        self.assertIn("Plan of a2.", body)
        self.assertIn("lifeboat-news", body.split("<!-- tidemark-previous -->")[0])
        self.assertIn("<details><summary>Previous plan</summary>", body)
        self.assertIn("Plan of a1.", body.split("<!-- tidemark-previous -->")[1])
        self.assertEqual(body.count("<details><summary>Previous plan</summary>"), 1)
        for job in hub.jobs[-3:]:
            self.assertNotIn("GOOGLE_APPLICATION_CREDENTIALS", job.env, "pull-request jobs hold no credential")

        # The saved plan, uploaded as an artifact, is sealed: no registration token in the clear.
        tokens = []
        with open(os.path.join(hub.repo, "manifests", "inventory", "devices.csv")) as f:
            tokens = [line.split(",")[1] for line in f.read().splitlines()[1:]]
        artifacts = os.path.join(hub.root, "artifacts")
        saved = [os.path.join(d, n) for d, _, names in os.walk(artifacts) for n in names if n == "plan.json"]
        self.assertTrue(saved, "the plan job uploads the saved plan")
        for path in saved:
            with open(path) as f:
                text = f.read()
            self.assertIn('"tidemark_sealed_plan"', text)
            self.assertEqual([t for t in tokens if t in text], [], "tokens in the clear in " + path)

        # Merged: the apply job fetches the reviewed plan of a2 and applies it.
        statuses = hub.merge(7, "a2", "m1")
        self.assertEqual(statuses, {"plan": "skipped", "apply": "success", "drift": "skipped"}, hub.transcript())
        self.assertTrue(emulator.subscribers("lifeboat-news"))
        self.assertIn("Apply complete:", hub.jobs[-2].transcript())
        # Keyless: the apply signed in through an external_account file; no key file exists in the run.
        with open(hub.jobs[-2].exports["GOOGLE_APPLICATION_CREDENTIALS"]) as f:
            self.assertEqual(json.load(f)["type"], "external_account")
        def holds_key(path):
            with open(path, errors="replace") as f:
                return "private_key" in f.read()
        keys = [os.path.join(d, n) for d, _, names in os.walk(hub.root) for n in names
                if n.endswith(".json") and holds_key(os.path.join(d, n))]
        self.assertEqual(keys, [], "a service-account key in the run")

        # Pushed to main without a pull request: no reviewed plan to fetch, so a fresh plan is applied.
        with open(os.path.join(hub.repo, "manifests", "direct.yaml"), "w") as f:
            f.write("topics:\n  - name: direct-news\n    members: [{selector: {region: baltic}}]\n")
        self.assertEqual(hub.trigger("push", "d1", {"ref": "refs/heads/main"})["apply"], "success", hub.transcript())
        self.assertIn("without a pull request", hub.jobs[-2].transcript())
        self.assertTrue(emulator.subscribers("direct-news"))

        # A pull request that changes nothing: its plan is still saved, and applying it is a clean no-op.
        with open(os.path.join(hub.repo, "manifests", "weather.yaml"), "a") as f:
            f.write("# a comment only\n")
        self.assertEqual(hub.pull_request(8, "b1")["plan"], "success", hub.transcript())
        self.assertIn("No changes", hub.gh()["comments"]["8"][0]["body"])
        self.assertEqual(hub.merge(8, "b1", "m2")["apply"], "success", hub.transcript())
        self.assertIn("The plan has no changes; nothing to apply.", hub.jobs[-2].transcript())

        # A fork: no secrets, no comment, and the summary says the plan came from the manifests alone.
        secrets = hub.secrets
        hub.secrets = {}
        self.assertEqual(hub.pull_request(9, "f1", fork=True)["plan"], "success", hub.transcript())
        hub.secrets = secrets
        self.assertNotIn("9", hub.gh()["comments"])
        with open(hub.jobs[-3].summary) as f:
            self.assertIn("Planned from the manifests alone", f.read())

        # Drift, seeded through the emulator's admin API, opens one issue; the scheduled correction closes it.
        devices = {}
        with open(os.path.join(hub.repo, "manifests", "inventory", "devices.csv")) as f:
            for line in f.read().splitlines()[1:]:
                fields = line.split(",")
                devices[fields[0]] = (fields[1], fields[3])
        outsider = next(t for t, region in devices.values() if region == "irish-sea")
        north = sorted(t for t, region in devices.values() if region == "north-sea")
        topic = "topics/weather-severe-north-sea/subscribers"
        emulator.project_admin("POST", topic, {"tokens": [outsider]})
        emulator.project_admin("DELETE", topic, {"tokens": [north[0]]})
        self.assertEqual(hub.trigger("workflow_dispatch", "m2")["drift"], "success", hub.transcript())
        issues = hub.gh()["issues"]
        self.assertEqual(len(issues), 1, issues)
        self.assertEqual(issues[0]["state"], "closed")
        self.assertIn("Drift:", issues[0]["body"])
        self.assertIn("**Corrected on", issues[0]["body"])
        self.assertIn("Corrected on", issues[0]["comments"][-1])
        self.assertNotIn(outsider, emulator.subscribers("weather-severe-north-sea"))
        self.assertIn(north[0], emulator.subscribers("weather-severe-north-sea"))

        # Past the rail: nothing corrected, the job fails, the issue stays open; a later run closes it.
        emulator.project_admin("POST", topic, {"tokens": [outsider]})
        strict = {"TIDEMARK_MAX_UNSUBSCRIBES": "0"}
        self.assertEqual(hub.trigger("workflow_dispatch", "m2", event_vars=strict)["drift"], "failure")
        self.assertIn(outsider, emulator.subscribers("weather-severe-north-sea"))
        # The failed job told the webhook, signed as serve signs its events.
        self.assertEqual(hub.webhook.rejected, 0)
        self.assertEqual([e["event"] for e in hub.webhook.events], ["apply_failed"], hub.webhook.events)
        self.assertEqual(hub.webhook.events[0]["dedupe_key"], hub.vars["TIDEMARK_WORKSPACE"] + "/apply_failed/ci_drift")
        issues = hub.gh()["issues"]
        self.assertEqual([i["state"] for i in issues], ["closed", "open"], issues)
        self.assertIn("**Not corrected on", issues[1]["body"])
        self.assertIn("more than --max-unsubscribes 0 allows", issues[1]["body"])
        self.assertEqual(hub.trigger("workflow_dispatch", "m2", event_vars=strict)["drift"], "failure")
        self.assertEqual(len(hub.gh()["issues"]), 2, "one issue while the drift lasts")
        self.assertEqual(hub.gh()["issues"][1]["edits"], 1)
        self.assertEqual(
            hub.trigger("workflow_dispatch", "m2", event_vars={"TIDEMARK_DRIFT_CORRECTION": "drift-only"})["drift"],
            "success", hub.transcript())
        issues = hub.gh()["issues"]
        self.assertEqual([i["state"] for i in issues], ["closed", "closed"], issues)
        self.assertIn("by the scheduled apply (drift-only, --refresh all", issues[1]["body"])
        self.assertNotIn(outsider, emulator.subscribers("weather-severe-north-sea"))
        # A clean full read with nothing open changes no issue.
        self.assertEqual(hub.trigger("workflow_dispatch", "m2")["drift"], "success")
        self.assertEqual(len(hub.gh()["issues"]), 2)


class RecipeHygieneTest(unittest.TestCase):
    """What a security review checks before anything runs: no permission by default, each job's own
    permissions and timeout, every action pinned by a full commit SHA, no key in the live YAML, and
    the scheduled job in an environment of its own."""

    def test_github(self):
        path = os.path.join(ROOT, "examples", "github", "tidemark.yml")
        workflow = actions.load(path)
        self.assertEqual(workflow["permissions"], {})
        for name, job in workflow["jobs"].items():
            self.assertIn("timeout-minutes", job, name)
            self.assertIn("permissions", job, name)
            self.assertNotIn("write-all", str(job["permissions"]), name)
        self.assertEqual(workflow["jobs"]["plan"]["permissions"].get("id-token"), None, "plans never sign in")
        self.assertNotEqual(workflow["jobs"]["apply"]["environment"], workflow["jobs"]["drift"]["environment"])
        action = os.path.join(ROOT, "examples", "github", "actions", "install-tidemark", "action.yml")
        for source in (path, action):
            with open(source) as f:
                live = [line for line in f.read().splitlines() if not line.strip().startswith("#")]
            for line in live:
                self.assertNotIn("credentials_json", line, source)
                if "uses:" in line and "./" not in line:
                    self.assertRegex(line, r"uses: [\w.-]+/[\w.-]+@[0-9a-f]{40} # v\d", source)

    def test_gitlab(self):
        with open(os.path.join(ROOT, "examples", "gitlab", ".gitlab-ci.yml")) as f:
            text = f.read()
        template = yaml.safe_load(text)
        jobs = {name: job for name, job in template.items() if isinstance(job, dict) and "script" in job}
        self.assertTrue(jobs)
        for name, job in jobs.items():
            self.assertIn("timeout", job, name)
        live = "\n".join(line for line in text.splitlines() if not line.strip().startswith("#"))
        self.assertNotIn("FCM_SERVICE_ACCOUNT", live)
        self.assertIn("id_tokens", live)


class GitLabInstallTest(unittest.TestCase):
    """The GitLab template's install script (`.install-tidemark`), run as a job's before_script runs
    it: the release binary by version from TIDEMARK_RELEASES_URL, checked against its SHA-256; a
    mismatch fails; no release and no Swift fails with what to do."""

    def run_install(self, releases_url, workdir):
        with open(os.path.join(ROOT, "examples", "gitlab", ".gitlab-ci.yml")) as f:
            template = yaml.safe_load(f)
        bin_dir = os.path.join(workdir, "fake-bin")
        os.makedirs(bin_dir, exist_ok=True)
        # The image's package manager is not what is tested: a stand-in that installs nothing.
        with open(os.path.join(bin_dir, "apt-get"), "w") as f:
            f.write("#!/bin/sh\nexit 0\n")
        os.chmod(os.path.join(bin_dir, "apt-get"), 0o755)
        script = "\n".join(template[".install-tidemark"])
        env = dict(os.environ, TIDEMARK_RELEASES_URL=releases_url, PATH=bin_dir + os.pathsep + "/usr/bin:/bin",
                   TIDEMARK_REF=template["variables"]["TIDEMARK_REF"])
        return subprocess.run(["bash", "-e", "-c", script], cwd=workdir, env=env, capture_output=True, text=True,
                              timeout=300)

    def test_install(self):
        version = GitHubRecipeTest.version()
        releases = Releases(version)
        try:
            good = tempfile.mkdtemp(prefix="tm-gitlab-")
            result = self.run_install(releases.base + "/good", good)
            self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
            self.assertEqual(result.stdout.strip().splitlines()[-1].split()[0], version)
            tampered = tempfile.mkdtemp(prefix="tm-gitlab-")
            result = self.run_install(releases.base + "/tampered", tampered)
            self.assertNotEqual(result.returncode, 0)
            self.assertIn("FAILED", result.stdout + result.stderr)
            empty = tempfile.mkdtemp(prefix="tm-gitlab-")
            result = self.run_install(releases.base + "/empty", empty)
            self.assertNotEqual(result.returncode, 0)
            self.assertIn("no Swift in this image to build one: use image swift:6.0-jammy", result.stderr)
        finally:
            releases.close()
            for folder in (good, tampered, empty):
                shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
