"""Hostile-input campaign (issue 36): runs the CLI on the inputs the second campaign found broken and
counts what still goes wrong. Each case is a small project on the embedded backend, or a command
line; a case fails on a crash (a signal), a hang (past 60 s), a blow-up (past 30 s or 2 GiB), a
raw dump (a Swift type, a decoding error or a stack trace in the output), a read outside the project
(a secret file's text in the output), or an outcome other than the one expected: refused with a
message naming the cause, or accepted. Prints one line per case and the counts.

usage: python3 scripts/hostile/campaign.py BINARY [--only SUBSTRING]"""

import argparse
import gzip
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
import zlib

parser = argparse.ArgumentParser()
parser.add_argument("binary")
parser.add_argument("--only", default="")
args = parser.parse_args()
BINARY = os.path.abspath(args.binary)

TOKEN = "aaaaaaaaaaa:APA91b" + "A" * 140
OTHER = "bbbbbbbbbbb:APA91b" + "B" * 140
SECRET = "campaign-secret-7f3a9c"
RAW = re.compile(r"DecodingError|dataCorrupted|Swift\.|Fatal error|Stack dump|SingleConnectionFailure|"
                 r"Optional\(|CodingKeys|\(target: |0x[0-9a-f]{12}")


def tok(i):
    return "t%07d:APA91b" % i + "x" * 140


class Case:
    def __init__(self, name, files, command, expect, pattern=None, setup=None, absent=None, project_flag=True):
        self.name, self.files, self.command, self.expect = name, files, command, expect
        self.pattern, self.setup, self.absent, self.project_flag = pattern, setup, absent, project_flag


CASES = []


def case(name, files, command, expect, pattern=None, setup=None, absent=None, project_flag=True):
    """`absent`: a pattern the output must not show (a duplicate, a secret); `project_flag`: pass -C."""
    CASES.append(Case(name, files, command, expect, pattern, setup, absent, project_flag))


SETTINGS = "project: tidemark-campaign\nbackend: embedded\n"
INV = {"manifests/inv.yaml": "inventory:\n  files: [devices.csv]\n",
       "manifests/devices.csv": "device_id,token,team\nd1,%s,a\nd2,%s,b\n" % (TOKEN, OTHER)}
TOPIC = "topics:\n  - name: news\n    members: [{selector: {team: a}}]\n"


def project(extra=None, settings=SETTINGS, topics=TOPIC):
    files = {"tidemark.yaml": settings, "manifests/topics.yaml": topics}
    files.update(INV)
    files.update(extra or {})
    return files


PLAN = ["plan"]

# --- Crashes and blow-ups -------------------------------------------------------------------------
case("fmt --check on CRLF manifest", project({"manifests/topics.yaml": TOPIC.replace("\n", "\r\n")}),
     ["fmt", "--check"], "any")
case("gzip inventory of 1 GiB of newlines", project({"manifests/inv.yaml": "inventory:\n  files: [devices.csv.gz]\n"}),
     PLAN, "refused", r"200 times its compressed size",
     setup=lambda d: gzip_file(os.path.join(d, "manifests/devices.csv.gz"), b"device_id,token\n", 1 << 30, b"\n"))
case("gzip bomb of 4 GiB", project({"manifests/inv.yaml": "inventory:\n  files: [devices.csv.gz]\n"}),
     PLAN, "refused", r"200 times its compressed size",
     setup=lambda d: gzip_file(os.path.join(d, "manifests/devices.csv.gz"), b"", 4 << 30, b"\0"))
case("manifest of a million member entries", project(), PLAN, "refused", r"limits\.manifest_bytes",
     setup=lambda d: write(os.path.join(d, "manifests/big.yaml"),
                           "topics:\n  - name: big\n    members:\n" +
                           "".join('      - token: "%s"\n' % tok(i) for i in range(1_000_000))))
case("token file of a million tokens", project({"manifests/topics.yaml":
                                                "topics:\n  - name: news\n    members: [{file: tokens.txt}]\n"}),
     PLAN, "refused", r"token_file_bytes",
     setup=lambda d: write(os.path.join(d, "manifests/tokens.txt"), "".join(tok(i) + "\n" for i in range(1_000_000))))
case("show of a plan with 3,000,000 operations", project(), ["show", "PLAN"], "refused", r"plan_operations",
     setup=lambda d: write(os.path.join(d, "plan.json"), forged_plan(d, 3_000_000)))
case("apply of a forged plan with 1,000,000 operations", project(), ["apply", "PLAN"], "refused",
     r"neither the inventory, the manifests nor state know",
     setup=lambda d: write(os.path.join(d, "plan.json"), forged_plan(d, 1_000_000)))
for newline in (True, False):
    for fmt in ("jsonl", "csv"):
        filler = "'\\\\n'" if newline else "x"
        case("exec source printing 1 GB (%s, %s)" % (fmt, "newlines" if newline else "one line"),
             project(settings=SETTINGS + "inventory:\n  - name: flood\n    exec:\n      command: [sh, -c, "
                     "\"head -c 1000000000 /dev/zero | tr '\\\\0' %s\"]\n      format: %s\n" % (filler, fmt)),
             PLAN, "refused", r"flood")

# --- Reads outside the project --------------------------------------------------------------------
for target in ("../../../../../../../../%s" % "SECRETFILE", "SECRETFILE_ABS"):
    case("token file naming %s" % ("a relative path out" if target.startswith("..") else "an absolute path"),
         project({"manifests/topics.yaml": "topics:\n  - name: news\n    members: [{file: %s}]\n" % target}),
         PLAN, "refused", r"outside the project|outside|not inside")
case("token file that is a symlink out", project({"manifests/topics.yaml":
                                                  "topics:\n  - name: news\n    members: [{file: link.txt}]\n"}),
     PLAN, "refused", r"outside", setup=lambda d: os.symlink(SECRET_PATH, os.path.join(d, "manifests/link.txt")))
case("manifest that is a symlink out", project(), PLAN, "refused", r"outside",
     setup=lambda d: os.symlink(SECRET_PATH, os.path.join(d, "manifests/evil.yaml")))
case("manifest that is a FIFO", project(), PLAN, "refused", r"not a regular file|FIFO|fifo",
     setup=lambda d: os.mkfifo(os.path.join(d, "manifests/pipe.yaml")))
case("inventory file outside", project({"manifests/inv.yaml": "inventory:\n  files: [SECRETCSV]\n"}),
     PLAN, "refused", r"outside")

# --- Wrongly accepted -----------------------------------------------------------------------------
for label, topics in [
    ("name: null", "topics:\n  - name: null\n    members: [{selector: {team: a}}]\n"),
    ("a 10,000-character group name", "groups:\n  - notification_key_name: %s\n    members: [{devices: [d1]}]\n"
     % ("g" * 10000)),
    ("an integer device id", "inventory:\n  devices:\n    - {id: 12, token: \"%s\"}\n" % TOKEN.replace("a", "c", 3)
     + TOPIC),
    ("a custom YAML tag", "topics:\n  - name: !evil news\n    members: [{selector: {team: a}}]\n"),
    ("a numeric YAML tag", "topics:\n  - name: !!int 3\n    members: [{selector: {team: a}}]\n"),
    ("a .nan name", "topics:\n  - name: .nan\n    members: [{selector: {team: a}}]\n"),
    ("an audience with no members", TOPIC + "audiences:\n  - name: empty\n"),
]:
    case(label, project(topics=topics), PLAN, "refused", r"error")
for label, settings in [("project with a newline", 'project: "tidemark-x\\nevil"\nbackend: embedded\n'),
                        ("project with ../", "project: ../tidemark-x\nbackend: embedded\n"),
                        ("sender id with letters", SETTINGS + "sender_id: 12ab\n")]:
    case(label, project(settings=settings), PLAN, "refused", r"tidemark\.yaml")
case("CSV field with garbage after its quote",
     project({"manifests/devices.csv": 'device_id,token,team\nd1,"%s"x,a\nd2,%s,b\n' % (TOKEN, OTHER)}),
     PLAN, "refused", r"after its closing")
case("JSON lines with a trailing comma",
     project({"manifests/inv.yaml": "inventory:\n  files: [devices.jsonl]\n",
              "manifests/devices.jsonl": '{"id": "d1", "token": "%s", "labels": {"team": "a"},}\n' % TOKEN}),
     PLAN, "refused", r"comma")
for label, edit, cause in [("negative format version", {"format_version": -1}, r"plan format -1"),
                           ("negative serial", {"serial": -5}, r"state serial -5")]:
    case("saved plan with a " + label, project(), ["apply", "PLAN"], "refused", cause,
         setup=lambda d, edit=edit: write(os.path.join(d, "plan.json"), forged_plan(d, 0, edit)))
case("saved plan in UTF-16", project(), ["apply", "PLAN"], "refused", r"not UTF-8",
     setup=lambda d: open(os.path.join(d, "plan.json"), "wb").write(forged_plan(d, 0).encode("utf-16")))
case("--qps inf", project(), ["apply", "--qps", "inf"], "refused", r"qps")
case("--read-qps 1e400", project(), ["plan", "--read-qps", "1e400"], "refused", r"qps")
case("device ''", project(), ["device", ""], "refused", r"device")
case("help nosuchcommand", project(), ["help", "nosuchcommand"], "refused", r"nosuchcommand")

# --- Wrongly refused ------------------------------------------------------------------------------
case("token file with CRLF", project({"manifests/topics.yaml":
                                      "topics:\n  - name: news\n    members: [{file: tokens.txt}]\n",
                                      "manifests/tokens.txt": TOKEN + "\r\n" + OTHER + "\r\n"}), PLAN, "accepted")
case("CSV with a UTF-8 BOM", project({"manifests/devices.csv": "\ufeffdevice_id,token,team\nd1,%s,a\n" % TOKEN}),
     PLAN, "accepted")
case("1,000,000-row CSV", project(), PLAN, "accepted",
     setup=lambda d: write(os.path.join(d, "manifests/devices.csv"),
                           "device_id,token,team\n" + "".join("d%d,%s,a\n" % (i, tok(i)) for i in range(1_000_000))))

# --- Broken sources -------------------------------------------------------------------------------
EXEC_SEEN = (SETTINGS + "inventory:\n  - name: app\n    exec:\n      command: [cat, seen.csv]\n      format: csv\n"
             "    exclude_if: {last_seen_older_than: 7d, column: seen}\n")


def seen_csv(directory, seconds_ago, scale):
    now = time.time()
    write(os.path.join(directory, "seen.csv"), "device_id,token,team,seen\n" +
          "".join("s%d,%s,a,%d\n" % (i, tok(i), int((now - seconds_ago) * scale)) for i in range(300)))


case("exclude_if that leaves out every device", project(settings=EXEC_SEEN), PLAN, "refused", r"exclude_if",
     setup=lambda d: seen_csv(d, 30 * 86400, 1))
case("exclude_if over a last_seen in epoch milliseconds", project(settings=EXEC_SEEN), PLAN, "accepted",
     setup=lambda d: seen_csv(d, 3600, 1000))
case("exclude_if over a 1970 placeholder", project(settings=EXEC_SEEN), PLAN, "refused", r"before 2008|1970",
     setup=lambda d: seen_csv(d, time.time(), 1))


EXEC_EXPORT = (SETTINGS + "inventory:\n  - name: export\n    exec:\n      command: [cat, export.csv]\n"
               "      format: csv\n")


def applied_then_shrunk(directory):
    """Applies an export of 300 devices, then leaves 3 of them in it (a program that printed 1%)."""
    rows = ["s%d,%s,a\n" % (i, tok(i)) for i in range(300)]
    write(os.path.join(directory, "export.csv"), "device_id,token,team\n" + "".join(rows))
    subprocess.run([BINARY, "apply", "--auto-approve", "-C", directory], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=True)
    write(os.path.join(directory, "export.csv"), "device_id,token,team\n" + "".join(rows[:3]))


case("exec source printing 1% of its devices", project(settings=EXEC_EXPORT), PLAN, "refused",
     r"(?s)shrank.*export.*read 3 devices", setup=applied_then_shrunk)
case("exec source whose grandchild holds its stdout",
     project(settings=SETTINGS + "inventory:\n  - name: slow\n    exec:\n      command: [sh, -c, "
             "\"cat export.csv; sleep 100 &\"]\n      format: csv\n"), PLAN, "accepted",
     setup=lambda d: write(os.path.join(d, "export.csv"), "device_id,token,team\ns1,%s,a\n" % tok(1)))


# --- Third round (issue 53) -----------------------------------------------------------------------
case("validate of 100,000 invalid topic names", project(), ["validate"], "refused", r"more like",
     setup=lambda d: write(os.path.join(d, "manifests/topics.yaml"), "topics:\n" + "".join(
         '  - {name: "bad name %d!", members: [{selector: {team: a}}]}\n' % i for i in range(100_000))))
case("a topic repeated through an alias 1,000 times",
     project(topics="topics:\n  - &t {name: news, members: [{selector: {team: a}}]}\n" + "  - *t\n" * 1000),
     ["validate"], "refused", r"defined twice")
for label, topics in [
    ("a YAML tag on a mapping", "topics:\n  - !evil {name: news, members: [{selector: {team: a}}]}\n"),
    ("a YAML tag on a list", "topics: !evil\n  - {name: news, members: [{selector: {team: a}}]}\n"),
    ("a YAML tag on a key", "topics:\n  - {!evil name: news, members: [{selector: {team: a}}]}\n"),
    ("a YAML tag on a boolean", "topics:\n  - {name: news, allow_empty: !evil true, members: [{selector: {team: a}}]}\n"),
]:
    case(label, project(topics=topics), PLAN, "refused", r"YAML tag")
case("an unknown value under unregistered:", project(settings=SETTINGS + "unregistered: {v1: [NOT_FUOND]}\n"),
     PLAN, "refused", r"tidemark\.yaml:3.*NOT_FUOND")
case("a state file holding a malformed token", project(), PLAN, "refused", r"not a registration token",
     setup=lambda d: applied_then_edited(d, "UPDATE tokens SET token = 'not a token' WHERE id = 0"))
case("emulator serve --project with path characters", project(), ["emulator", "serve", "--project", "../../etc"],
     "refused", r"project", project_flag=False)
case("saved plan with a batch of 1,001 tokens", project(), ["apply", "PLAN"], "refused", r"could have written",
     setup=lambda d: write(os.path.join(d, "plan.json"), forged_plan(d, 0, batch=1001)))
case("saved plan with a target pattern that is none", project(), ["show", "PLAN"], "refused", r"selector",
     setup=lambda d: write(os.path.join(d, "plan.json"), forged_plan(d, 0, {"targets": ["topic:news\nevil"]})))
case("saved plan with a token that is none", project(), ["show", "PLAN"], "refused", r"could have written",
     setup=lambda d: write(os.path.join(d, "plan.json"), forged_plan(d, 0, batch=1, token="abc")))
case("a UTF-16 CSV", project(), PLAN, "refused", r"UTF-16",
     setup=lambda d: open(os.path.join(d, "manifests/devices.csv"), "wb").write(
         ("device_id,token,team\nd1,%s,a\n" % TOKEN).encode("utf-16")))
case("a gzip inside a gzip", project({"manifests/inv.yaml": "inventory:\n  files: [devices.csv.gz]\n"}), PLAN,
     "refused", r"compressed twice",
     setup=lambda d: open(os.path.join(d, "manifests/devices.csv.gz"), "wb").write(
         gzip.compress(gzip.compress(("device_id,token,team\nd1,%s,a\n" % TOKEN).encode()))))
case("a binary token file", project({"manifests/topics.yaml": "topics:\n  - name: news\n    members: [{file: tokens.txt}]\n"}),
     PLAN, "refused", r"binary",
     setup=lambda d: open(os.path.join(d, "manifests/tokens.txt"), "wb").write(bytes(range(256)) * 64))
case("an inventory file named by two declarations",
     project({"manifests/inv2.yaml": "inventory:\n  files: [\"dev*.csv\"]\n"}), PLAN, "accepted",
     absent=r"duplicate")
case("a token_uri with a password, unreachable", project(settings="project: tidemark-campaign\nbackend: fcm\n"
                                                             "credentials: key.json\n"), PLAN, "refused",
     r"robot:\*\*\*@127\.0\.0\.1:1", setup=lambda d: key_with_secret_uri(d))


def applied_then_edited(directory, statement):
    """Applies the project, then edits its SQLite state file as a person (or damage) would."""
    import sqlite3
    subprocess.run([BINARY, "apply", "--auto-approve", "-C", directory], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=True)
    db = sqlite3.connect(os.path.join(directory, ".tidemark/state.db"))
    db.execute(statement)
    db.commit()
    db.close()


def key_with_secret_uri(directory):
    """A service-account key file whose token_uri carries the campaign's secret as a password and a
    query value, pointing at a closed port."""
    key = subprocess.run(["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
                         check=True, capture_output=True, text=True).stdout
    write(os.path.join(directory, "key.json"), json.dumps({
        "type": "service_account", "project_id": "tidemark-campaign", "private_key_id": "k1",
        "private_key": key, "client_email": "ci@tidemark-campaign.iam.gserviceaccount.com",
        "token_uri": "http://robot:%s@127.0.0.1:1/token?sig=%s" % (SECRET, SECRET)}))
    os.chmod(os.path.join(directory, "key.json"), 0o600)


# --- Helpers -------------------------------------------------------------------------------------
def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def gzip_file(path, head, size, byte):
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = byte * (1 << 24)
    with open(path, "wb") as f:
        f.write(compressor.compress(head))
        for _ in range(size // len(chunk)):
            f.write(compressor.compress(chunk))
        f.write(compressor.flush())


def forged_plan(directory, operations, edit=None, batch=None, token=None):
    """A plan tidemark made for `directory`, edited: `operations` one-token subscribes of tokens nobody
    declared, or one subscribe of `batch` tokens (each `token` when given) (with a digest recomputed,
    as a hostile editor would), and `edit`'s fields."""
    subprocess.run([BINARY, "plan", "--out", os.path.join(directory, "made.json"), "-C", directory],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    with open(os.path.join(directory, "made.json")) as f:
        plan = json.load(f)
    if batch:
        plan["operations"] = [{"kind": "subscribe", "target": "news", "tokens": [token or tok(i) for i in range(batch)]}]
    elif operations:
        plan["operations"] = [{"kind": "subscribe", "target": "news", "tokens": [tok(i)]} for i in range(operations)]
    if operations or batch:
        digest = hashlib.sha256()
        for op in plan["operations"]:
            digest.update(op["kind"].encode() + b"\0" + op["target"].encode())
            for t in op["tokens"]:
                digest.update(b"\0" + t.encode())
            digest.update(b"\1")
        plan["operations_digest_when_made"] = digest.hexdigest()
    plan.update(edit or {})
    return json.dumps(plan)


def run(directory, command, project_flag=True):
    command = [os.path.join(directory, "plan.json") if c == "PLAN" else c for c in command]
    started = time.monotonic()
    proc = subprocess.Popen([BINARY] + command + (["-C", directory] if project_flag else []), cwd=directory, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=dict(os.environ, NO_COLOR="1"))
    chunks = {"out": b"", "err": b""}

    def drain(stream, key):
        data = stream.read(1 << 20)
        chunks[key] = data
        while stream.read(1 << 20):
            pass

    readers = [threading.Thread(target=drain, args=(proc.stdout, "out")),
               threading.Thread(target=drain, args=(proc.stderr, "err"))]
    for reader in readers:
        reader.start()
    timer = threading.Timer(60, proc.kill)
    timer.start()
    _, status, usage = os.wait4(proc.pid, 0)
    timer.cancel()
    for reader in readers:
        reader.join()
    return (os.waitstatus_to_exitcode(status), (chunks["out"] + chunks["err"]).decode(errors="replace"),
            time.monotonic() - started, usage.ru_maxrss / 1024)


outside = tempfile.mkdtemp(prefix="tm-campaign-outside-")
SECRET_PATH = os.path.join(outside, "secret.txt")
write(SECRET_PATH, SECRET + "\n")
SECRET_CSV = os.path.join(outside, "secret.csv")
write(SECRET_CSV, "device_id,token\n%s,%s\n" % (SECRET, TOKEN))
counts = {}
failures = 0
ran = 0
for c in CASES:
    if args.only and args.only not in c.name:
        continue
    ran += 1
    directory = tempfile.mkdtemp(prefix="tm-campaign-")
    try:
        for path, text in c.files.items():
            text = text.replace("SECRETCSV", SECRET_CSV).replace("SECRETFILE_ABS", SECRET_PATH).replace("SECRETFILE", SECRET_PATH.lstrip("/"))
            write(os.path.join(directory, path), text)
        if c.setup:
            # Large inputs are made in a child process: a forked command inherits this process's peak
            # memory in its own (ru_maxrss), which would be counted as the command's.
            child = os.fork()
            if child == 0:
                try:
                    c.setup(directory)
                finally:
                    os._exit(0)
            os.waitpid(child, 0)
        code, output, seconds, rss = run(directory, c.command, c.project_flag)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    problems = []
    if code < 0 or code >= 128:
        problems.append("crash (%d)" % code)
    if seconds >= 60:
        problems.append("hang")
    elif seconds > 30 or rss > 2048:
        problems.append("blow-up")
    if RAW.search(output):
        problems.append("raw dump: " + RAW.search(output).group(0))
    if SECRET in output:
        problems.append("read outside the project")
    if c.expect == "refused" and code in (0, 2):
        problems.append("wrongly accepted")
    if c.expect == "refused" and code not in (0, 2) and c.pattern and not re.search(c.pattern, output):
        problems.append("refused without naming the cause")
    if c.expect == "accepted" and code not in (0, 2):
        problems.append("wrongly refused")
    if c.absent and re.search(c.absent, output):
        problems.append("shows what it must not: " + re.search(c.absent, output).group(0))
    # A refusal is read by a person: a thousand lines of one problem is a flood, not a message.
    if c.expect == "refused" and len(output.splitlines()) > 100:
        problems.append("flood of %d lines" % len(output.splitlines()))
    for p in problems:
        key = p.split(":")[0].split(" (")[0]
        counts[key] = counts.get(key, 0) + 1
    failures += bool(problems)
    first = next((line for line in output.splitlines() if line.strip()), "")[:150]
    print("%-4s %-52s exit %3d %6.1f s %6.0f MB  %s" % ("ok" if not problems else "FAIL", c.name, code, seconds, rss,
                                                       "; ".join(problems + ([first] if problems else [])) or first), flush=True)
shutil.rmtree(outside, ignore_errors=True)
print()
kinds = ["crash", "hang", "blow-up", "read outside the project", "wrongly accepted", "wrongly refused",
         "raw dump", "refused without naming the cause", "shows what it must not", "flood"]
print("%d cases: %s" % (ran, ", ".join("%d %s" % (counts.get(k, 0), k) for k in kinds)))
sys.exit(1 if failures else 0)
