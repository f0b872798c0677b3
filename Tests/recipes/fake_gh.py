#!/usr/bin/env python3
"""A fake of the GitHub CLI (`gh`) for the recipe test: it keeps pull-request comments, issues,
workflow runs and their artifacts in a JSON file ($FAKE_GH_DB), logs every call, and answers only
the calls the recipe makes. Anything else fails loudly, as a mistake in the recipe would on GitHub.

`--jq` runs the real jq and prints like gh does (go-gh's jq.Evaluate): strings raw, null as an empty
line, objects and arrays as compact JSON.
"""

import json
import os
import re
import shutil
import subprocess
import sys

DB = os.environ["FAKE_GH_DB"]


def load():
    with open(DB) as f:
        return json.load(f)


def save(db):
    tmp = DB + ".tmp"
    with open(tmp, "w") as f:
        json.dump(db, f, indent=1)
    os.replace(tmp, DB)


def fail(message):
    sys.stderr.write("fake gh: %s\n" % message)
    sys.exit(1)


def emit(value, jq):
    if jq is None:
        print(json.dumps(value))
        return
    out = subprocess.run(["jq", "-c", jq], input=json.dumps(value), capture_output=True, text=True)
    if out.returncode != 0:
        fail("jq %r failed: %s" % (jq, out.stderr))
    for line in out.stdout.splitlines():
        item = json.loads(line)
        if item is None:
            print("")
        elif isinstance(item, str):
            print(item)
        elif isinstance(item, bool):
            print("true" if item else "false")
        elif isinstance(item, (int, float)):
            print(int(item) if float(item).is_integer() else "%.2f" % item)
        else:
            print(line)


def options(args, flags_with_values, switches=()):
    """(positional, {flag: [values]}) for a gh-style command line."""
    positional, values = [], {}
    i = 0
    while i < len(args):
        a = args[i]
        if a in switches:
            values.setdefault(a, []).append(True)
            i += 1
        elif a in flags_with_values:
            if i + 1 >= len(args):
                fail("%s needs a value" % a)
            values.setdefault(a, []).append(args[i + 1])
            i += 2
        elif a.startswith("-"):
            fail("unexpected flag %s in %s" % (a, " ".join(sys.argv[1:])))
        else:
            positional.append(a)
            i += 1
    return positional, values


def one(values, flag, default=None):
    return values.get(flag, [default])[-1]


def body_of(values):
    if "--body-file" in values:
        with open(one(values, "--body-file")) as f:
            return f.read()
    if "--body" in values:
        return one(values, "--body")
    fail("no --body or --body-file")


def api(db, args):
    positional, values = options(args, {"--method", "-X", "--jq", "-F", "-f"}, {"--paginate"})
    if len(positional) != 1:
        fail("api takes one path: %s" % args)
    path = positional[0]
    method = one(values, "--method") or one(values, "-X") or ("POST" if "-F" in values or "-f" in values else "GET")
    fields = {}
    for raw in values.get("-F", []) + values.get("-f", []):
        key, _, value = raw.partition("=")
        if value.startswith("@") and raw in values.get("-F", []):
            with open(value[1:]) as f:
                value = f.read()
        fields[key] = value
    repo = os.environ["GITHUB_REPOSITORY"]
    m = re.fullmatch(r"repos/%s/issues/(\d+)/comments" % re.escape(repo), path)
    if m and method == "GET":
        return emit(db["comments"].get(m.group(1), []), one(values, "--jq"))
    m = re.fullmatch(r"repos/%s/issues/comments/(\d+)" % re.escape(repo), path)
    if m and method == "PATCH":
        for comments in db["comments"].values():
            for comment in comments:
                if comment["id"] == int(m.group(1)):
                    comment["body"] = fields["body"]
                    comment["edits"] = comment.get("edits", 0) + 1
                    save(db)
                    return emit(comment, one(values, "--jq"))
        fail("no comment %s" % m.group(1))
    m = re.fullmatch(r"repos/%s/commits/(\w+)/pulls" % re.escape(repo), path)
    if m and method == "GET":
        merged = db["merges"].get(m.group(1))
        pulls = [{"number": merged["pr"], "head": {"sha": merged["head"]}}] if merged else []
        return emit(pulls, one(values, "--jq"))
    fail("unexpected api call: %s %s" % (method, path))


def main():
    args = sys.argv[1:]
    if not os.environ.get("GH_TOKEN"):
        fail("GH_TOKEN is not set: gh cannot authenticate in a workflow without it")
    db = load()
    db["log"].append(args)
    save(db)
    db = load()
    if not args:
        fail("no command")
    command, rest = args[0], args[1:]
    if command == "api":
        return api(db, rest)
    sub = rest[0] if rest else ""
    rest = rest[1:]
    if (command, sub) == ("pr", "comment"):
        positional, values = options(rest, {"--body", "--body-file"})
        pr = positional[0]
        db["next_id"] += 1
        db["comments"].setdefault(pr, []).append({"id": db["next_id"], "body": body_of(values)})
        save(db)
        print("https://github.com/%s/pull/%s#issuecomment-%d" % (os.environ["GITHUB_REPOSITORY"], pr, db["next_id"]))
        return
    if (command, sub) == ("run", "list"):
        _, values = options(rest, {"--workflow", "--commit", "--event", "--status", "--json", "--jq", "--limit"})
        runs = [r for r in db["runs"]
                if r["workflow"] == one(values, "--workflow", r["workflow"])
                and r["head_sha"] == one(values, "--commit", r["head_sha"])
                and r["event"] == one(values, "--event", r["event"])
                and r["status"] == one(values, "--status", r["status"])]
        runs.sort(key=lambda r: -r["id"])
        fields = (one(values, "--json") or "databaseId").split(",")
        rows = [{f: {"databaseId": r["id"], "headSha": r["head_sha"], "status": r["status"]}[f] for f in fields}
                for r in runs]
        return emit(rows, one(values, "--jq"))
    if (command, sub) == ("run", "download"):
        positional, values = options(rest, {"--name", "--dir", "-n", "-D"})
        run = next((r for r in db["runs"] if str(r["id"]) == positional[0]), None)
        name = one(values, "--name") or one(values, "-n")
        if run is None or name not in run["artifacts"]:
            fail("no artifact %r in run %s" % (name, positional[0] if positional else "?"))
        target = one(values, "--dir") or one(values, "-D") or "."
        os.makedirs(target, exist_ok=True)
        source = run["artifacts"][name]
        for entry in os.listdir(source):
            shutil.copy(os.path.join(source, entry), os.path.join(target, entry))
        return
    if command == "issue":
        if sub == "list":
            _, values = options(rest, {"--label", "--state", "--search", "--json", "--jq", "--limit"})
            label, state = one(values, "--label"), one(values, "--state", "open")
            title = re.search(r'in:title "([^"]*)"', one(values, "--search", "") or "")
            found = [i for i in db["issues"]
                     if (label is None or label in i["labels"]) and (state == "all" or i["state"] == state)
                     and (title is None or title.group(1) in i["title"])]
            fields = (one(values, "--json") or "number").split(",")
            return emit([{f: i[f] for f in fields} for i in found], one(values, "--jq"))
        if sub == "create":
            _, values = options(rest, {"--title", "--label", "--body", "--body-file"})
            number = len(db["issues"]) + 1
            db["issues"].append({"number": number, "title": one(values, "--title"), "labels": values.get("--label", []),
                                 "state": "open", "body": body_of(values), "comments": [], "edits": 0})
            save(db)
            print("https://github.com/%s/issues/%d" % (os.environ["GITHUB_REPOSITORY"], number))
            return
        positional, values = options(rest, {"--body", "--body-file", "--comment", "--title"})
        issue = next((i for i in db["issues"] if positional and str(i["number"]) == positional[0]), None)
        if issue is None:
            fail("no issue %s" % positional)
        if sub == "edit":
            issue["body"] = body_of(values)
            issue["edits"] += 1
        elif sub == "comment":
            issue["comments"].append(body_of(values))
        elif sub == "close":
            if "--comment" in values:
                issue["comments"].append(one(values, "--comment"))
            issue["state"] = "closed"
        else:
            fail("unexpected issue command %s" % sub)
        save(db)
        return
    fail("unexpected command: %s" % " ".join(args))


main()
