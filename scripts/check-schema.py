#!/usr/bin/env python3
"""Checks the JSON Schema against the demo manifests (all must pass) and known-bad documents (all must fail)."""
import glob
import json
import os
import sys

import jsonschema
import yaml

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
schema = json.load(open(os.path.join(root, "schema", "tidemark-manifest.schema.json")))
jsonschema.Draft7Validator.check_schema(schema)
validator = jsonschema.Draft7Validator(schema)
failures = 0
for path in sorted(glob.glob(os.path.join(root, "manifests", "*.yaml"))):
    text = open(path).read()
    if "yaml-language-server: $schema=" not in text.splitlines()[0]:
        print(f"{path}: first line must point editors at the schema"); failures += 1
    errors = list(validator.iter_errors(yaml.safe_load(text) or {}))
    for error in errors:
        print(f"{path}: {error.message} at {list(error.path)}"); failures += 1
bad = [
    {"topics": [{"name": "a b"}]},
    {"topics": [{"name": "a", "mebmers": []}]},
    {"topics": [{"name": "a", "mode": "exclusive"}]},
    {"topics": [{"name": "a", "members": [{"device": "x", "token": "y"}]}]},
    {"groups": [{"notification_key_name": "g", "members": [{"device": str(i)} for i in range(21)]}]},
    {"inventory": {"devices": [{"id": "x"}]}},
    {"topcs": []},
    {"removed": [{"topic": "a"}]},
    {"removed": [{"topic": "a", "group": "b", "unsubscribe": False}]},
    {"removed": [{"unsubscribe": False}]},
]
good = [{"removed": [{"topic": "a", "unsubscribe": False}, {"audience": "b", "unsubscribe": True}]}]
for document in good:
    for error in validator.iter_errors(document):
        print(f"schema refused a good manifest {document}: {error.message}"); failures += 1
for document in bad:
    if validator.is_valid(document):
        print(f"schema accepted a bad manifest: {document}"); failures += 1
print("schema check:", "OK" if failures == 0 else f"{failures} problem(s)")
sys.exit(1 if failures else 0)
