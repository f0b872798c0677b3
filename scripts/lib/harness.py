"""Shared helpers for tidemark's benchmark and resilience scripts: start the emulator on a free
loopback port, talk to its admin API, generate projects, run the CLI."""

import csv
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request


class Emulator:
    """`tidemark emulator serve --port 0` in the background, stopped on exit."""

    def __init__(self, binary, project, *flags, data=None):
        self.binary, self.project, self.flags, self.data = binary, project, list(flags), data

    def __enter__(self):
        self.log = tempfile.NamedTemporaryFile("w+", prefix="tm-emulator-", suffix=".log", delete=False)
        args = [self.binary, "emulator", "serve", "--port", "0", "--project", self.project] + self.flags
        if self.data:
            args += ["--data", self.data]
        self.process = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        text = ""
        while time.monotonic() < deadline:
            with open(self.log.name) as f:
                text = f.read()
            if "Press Ctrl-C" in text:
                break
            if self.process.poll() is not None:
                raise RuntimeError("the emulator exited:\n" + text)
            time.sleep(0.05)
        else:
            raise RuntimeError("the emulator did not start:\n" + text)
        self.host = re.search(r"FCM_EMULATOR_HOST=(\S+)", text).group(1)
        self.key = re.search(r"GOOGLE_APPLICATION_CREDENTIALS=(\S+)", text).group(1)
        self.base = "http://" + self.host
        return self

    def __exit__(self, *exc):
        stop_process(self.process, 10)
        self.log.close()
        os.unlink(self.log.name)

    @property
    def env(self):
        """The environment a tidemark run needs to use this emulator."""
        return dict(os.environ, FCM_EMULATOR_HOST=self.host, GOOGLE_APPLICATION_CREDENTIALS=self.key)

    def admin(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + "/emulator/v1/" + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request) as response:
            return json.loads(response.read() or b"{}")

    def project_admin(self, method, path, body=None):
        return self.admin(method, "projects/%s/%s" % (self.project, path), body)

    def register(self, tokens):
        for start in range(0, len(tokens), 10000):
            chunk = [{"token": t} for t in tokens[start:start + 10000]]
            self.project_admin("POST", "registrations", {"registrations": chunk})

    def subscribers(self, topic):
        """Every subscriber of `topic`."""
        return self.project_admin("GET", "topics/%s/subscribers" % topic)["subscribers"]

    def traffic(self):
        return self.admin("GET", "traffic")


def stop_process(process, seconds):
    """SIGTERM to `process` if it still runs, SIGKILL after `seconds`; waits for it either way."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(seconds)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def token(i, prefix="bench"):
    """A well-formed registration token, unique per i."""
    return "%s%07d:APA91b%s" % (prefix, i, "T" * 140)


def make_project(directory, project, devices, topics, transport="v1", extra=""):
    """A project whose `topics` topics each hold every one of `devices` devices (an inventory CSV)."""
    os.makedirs(os.path.join(directory, "manifests"), exist_ok=True)
    with open(os.path.join(directory, "tidemark.yaml"), "w") as f:
        f.write("project: %s\nbackend: emulator\ntransport: %s\n%s" % (project, transport, extra))
    with open(os.path.join(directory, "manifests", "devices.csv"), "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["device_id", "token", "fleet"])
        for i in range(devices):
            writer.writerow(["d%07d" % i, token(i), "all"])
    with open(os.path.join(directory, "manifests", "topics.yaml"), "w") as f:
        f.write("inventory:\n  files: [devices.csv]\ntopics:\n")
        for t in range(topics):
            f.write("  - name: bench-%d\n    mode: authoritative\n    members: [{selector: {fleet: all}}]\n" % t)
    return [token(i) for i in range(devices)]


def tidemark(binary, directory, args, env, check=True, timeout=None):
    """Runs the CLI in `directory`; returns (exit status, stdout, stderr)."""
    proc = subprocess.run([binary] + args + ["-C", directory], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
    if check and proc.returncode not in (0, 2):
        raise RuntimeError("tidemark %s exited %d:\n%s%s" % (" ".join(args), proc.returncode, proc.stdout, proc.stderr))
    return proc.returncode, proc.stdout, proc.stderr


APPLY_LINE = re.compile(r"Apply complete: \+([\d,]+) subscribed, −([\d,]+) unsubscribed, ([\d,]+) group calls?(?:, [^;]*)?; "
                        r"([\d,]+) requests? in ([\d.]+) s")


def parse_apply(stdout):
    """(subscribed, unsubscribed, requests, seconds) from apply's summary line."""
    m = APPLY_LINE.search(stdout)
    if not m:
        raise RuntimeError("no apply summary in:\n" + stdout[-2000:])
    num = lambda s: int(s.replace(",", ""))
    return num(m.group(1)), num(m.group(2)), num(m.group(4)), float(m.group(5))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    """A real Prometheus (Debian's package) scraping `targets` every second."""

    def __init__(self, targets, rules=None):
        self.dir = tempfile.mkdtemp(prefix="tm-prometheus-")
        self.port = free_port()
        config = os.path.join(self.dir, "prometheus.yml")
        with open(config, "w") as f:
            f.write("global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
                    "scrape_configs:\n  - job_name: tidemark\n    static_configs:\n"
                    "      - targets: [%s]\n" % ", ".join("'127.0.0.1:%d'" % t for t in targets))
            if rules:
                f.write("rule_files: ['%s']\n" % os.path.abspath(rules))
        self.log = open(os.path.join(self.dir, "log"), "w")
        self.process = subprocess.Popen(["prometheus", "--config.file=" + config,
                                         "--storage.tsdb.path=" + os.path.join(self.dir, "data"),
                                         "--web.listen-address=127.0.0.1:%d" % self.port],
                                        stdout=self.log, stderr=subprocess.STDOUT)

    def query(self, expression):
        url = "http://127.0.0.1:%d/api/v1/query?query=%s" % (self.port, urllib.parse.quote(expression))
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.loads(response.read())["data"]["result"]

    def wait_for(self, expression, check, seconds=60):
        deadline = time.monotonic() + seconds
        last = None
        while time.monotonic() < deadline:
            try:
                last = self.query(expression)
                if check(last):
                    return last
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError("Prometheus: '%s' never as expected; last answer %s" % (expression, last))

    def alerts(self):
        """The alerts pending or firing now: {(alertname, state, workspace)}."""
        return {(r["metric"]["alertname"], r["metric"]["alertstate"], r["metric"].get("workspace", ""))
                for r in self.query("ALERTS")}

    def stop(self):
        stop_process(self.process, 20)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
