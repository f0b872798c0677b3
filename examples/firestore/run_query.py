#!/usr/bin/env python3
"""Prints the devices of a Firestore collection as tidemark inventory lines (JSON lines on stdout).

An `exec` inventory source for tidemark: tidemark runs it, reads its stdout, and shows its stderr
when it fails. It uses Firestore's REST `runQuery` (no SDK needed) and pages through the collection
ordered by document name, so a collection of any size streams out in pages of PAGE_SIZE documents.

    # tidemark.yaml
    inventory:
      - name: firestore
        exec:
          command: [python3, examples/firestore/run_query.py]
          format: jsonl
          timeout: 10m
        on_dead: {exec: [python3, examples/firestore/mark_dead.py]}

The collection holds one document per app installation, its id being the device id:

    fcm_tokens/{installationId}
      token:      string   the FCM registration token
      userId:     string
      platform:   string   android | ios | web
      locale:     string
      appVersion: string
      active:     boolean  false once tidemark reported the token dead
      lastSeen:   timestamp

Environment:
  FIRESTORE_PROJECT        the Google Cloud project (required)
  FIRESTORE_COLLECTION     the collection (default fcm_tokens)
  FIRESTORE_ACCESS_TOKEN   an OAuth2 access token with the datastore scope, e.g. from
                           `gcloud auth print-access-token`; without it, Application Default
                           Credentials are used when the google-auth package is installed
  FIRESTORE_EMULATOR_HOST  host:port of the Firestore emulator (no credentials needed)
"""
import json
import os
import sys
import urllib.error
import urllib.request

PAGE_SIZE = int(os.environ.get("FIRESTORE_PAGE_SIZE", "5000"))
LABELS = {"userId": "user", "platform": "platform", "locale": "locale", "appVersion": "app_version"}


def fail(message):
    print(f"run_query.py: {message}", file=sys.stderr)
    sys.exit(1)


def access_token():
    if os.environ.get("FIRESTORE_EMULATOR_HOST"):
        return "owner"  # the emulator accepts any bearer token
    token = os.environ.get("FIRESTORE_ACCESS_TOKEN")
    if token:
        return token
    try:
        import google.auth
        import google.auth.transport.requests
    except ImportError:
        fail("set FIRESTORE_ACCESS_TOKEN (gcloud auth print-access-token) or install google-auth")
    credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/datastore"])
    credentials.refresh(google.auth.transport.requests.Request())
    return credentials.token


def base_url(project):
    host = os.environ.get("FIRESTORE_EMULATOR_HOST")
    root = f"http://{host}" if host else "https://firestore.googleapis.com"
    return f"{root}/v1/projects/{project}/databases/(default)/documents"


def value(field):
    """A Firestore Value as text (strings, numbers, booleans, timestamps)."""
    if field is None:
        return None
    for kind in ("stringValue", "integerValue", "doubleValue", "timestampValue"):
        if kind in field:
            return str(field[kind])
    if "booleanValue" in field:
        return "true" if field["booleanValue"] else "false"
    return None


def main():
    project = os.environ.get("FIRESTORE_PROJECT") or fail("set FIRESTORE_PROJECT to the Google Cloud project")
    collection = os.environ.get("FIRESTORE_COLLECTION", "fcm_tokens")
    url = base_url(project) + ":runQuery"
    headers = {"Authorization": f"Bearer {access_token()}", "Content-Type": "application/json"}
    after = None
    while True:
        query = {
            "from": [{"collectionId": collection}],
            "where": {"fieldFilter": {"field": {"fieldPath": "active"}, "op": "EQUAL", "value": {"booleanValue": True}}},
            "orderBy": [{"field": {"fieldPath": "__name__"}, "direction": "ASCENDING"}],
            "limit": PAGE_SIZE,
        }
        if after:
            query["startAt"] = {"values": [{"referenceValue": after}], "before": False}
        request = urllib.request.Request(url, json.dumps({"structuredQuery": query}).encode(), headers)
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                results = json.load(response)
        except urllib.error.HTTPError as error:
            detail = error.read().decode(errors="replace")[:500]
            fail(f"runQuery answered HTTP {error.code}: {detail}")
        except urllib.error.URLError as error:
            fail(f"cannot reach Firestore at {url}: {error.reason}")
        if not isinstance(results, list):
            fail(f"runQuery answered something that is not a list of results: {str(results)[:200]}")
        documents = [r["document"] for r in results if "document" in r]
        for document in documents:
            fields = document.get("fields", {})
            device_id = document["name"].rsplit("/", 1)[-1]
            token = value(fields.get("token"))
            labels = {label: value(fields.get(name)) for name, label in LABELS.items() if value(fields.get(name))}
            seen = value(fields.get("lastSeen"))
            if seen:
                labels["last_seen"] = seen
            # A document without a token is printed as is: tidemark reports it with its row number.
            print(json.dumps({"id": device_id, "token": token, "labels": labels}, separators=(",", ":")))
        if len(documents) < PAGE_SIZE:
            break
        after = documents[-1]["name"]


if __name__ == "__main__":
    main()
