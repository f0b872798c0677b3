#!/usr/bin/env python3
"""Marks the Firestore documents of dead tokens inactive: the `on_dead` hook of run_query.py's source.

tidemark's apply runs it once per batch of dead tokens with NDJSON on stdin, one line a device:
    {"device_id": "...", "token": "...", "token_redacted": "...", "source": "...", "reason": "..."}
It sets `active: false` on fcm_tokens/{device_id}, but only while the document still holds that
token (a precondition on a read), so a device that registered a new token meanwhile stays active.
Running it twice changes nothing the second time. Environment as for run_query.py.
"""
import json
import sys
import urllib.error
import urllib.request

from run_query import access_token, base_url, fail, value
import os


def main():
    project = os.environ.get("FIRESTORE_PROJECT") or fail("set FIRESTORE_PROJECT to the Google Cloud project")
    collection = os.environ.get("FIRESTORE_COLLECTION", "fcm_tokens")
    headers = {"Authorization": f"Bearer {access_token()}", "Content-Type": "application/json"}
    marked = 0
    for line in sys.stdin:
        if not line.strip():
            continue
        dead = json.loads(line)
        url = f"{base_url(project)}/{collection}/{dead['device_id']}"
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=60) as response:
                document = json.load(response)
        except urllib.error.HTTPError as error:
            if error.code == 404:
                continue  # already gone
            fail(f"reading {dead['device_id']} answered HTTP {error.code}")
        fields = document.get("fields", {})
        if value(fields.get("token")) != dead["token"]:
            continue  # the device has a new token since: leave it active
        if value(fields.get("active")) == "false":
            continue  # marked already (an earlier run)
        body = {"fields": {"active": {"booleanValue": False}}}
        patch = urllib.request.Request(
            f"{url}?updateMask.fieldPaths=active&currentDocument.updateTime={document['updateTime']}",
            json.dumps(body).encode(), headers, method="PATCH")
        try:
            urllib.request.urlopen(patch, timeout=60).read()
            marked += 1
        except urllib.error.HTTPError as error:
            if error.code in (400, 409, 412):
                continue  # changed since the read: the next apply reports it again if still dead
            fail(f"updating {dead['device_id']} answered HTTP {error.code}")
    print(f"marked {marked} document(s) inactive", file=sys.stderr)


if __name__ == "__main__":
    main()
