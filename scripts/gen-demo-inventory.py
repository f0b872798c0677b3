#!/usr/bin/env python3
"""Generates the demo inventory (manifests/inventory/devices.csv) deterministically.

The demo app is "Tidewatch": tide alerts by coastal region, live scores for local teams and
weather warnings. Each device has a stable id, an FCM-shaped registration token and labels.
Run again with the same seed to get the same file: python3 scripts/gen-demo-inventory.py
"""
import argparse
import csv
import random
import string

ALPHABET = string.ascii_letters + string.digits + "-_"
REGIONS = ["north-sea", "baltic", "atlantic", "channel", "irish-sea"]
REGION_WEIGHTS = [30, 15, 25, 20, 10]
PLATFORMS = ["android", "ios", "web"]
PLATFORM_WEIGHTS = [55, 38, 7]
LOCALES = {"north-sea": ["en-GB", "nl-NL", "de-DE"], "baltic": ["de-DE", "sv-SE", "pl-PL"],
           "atlantic": ["en-GB", "fr-FR", "es-ES", "pt-PT"], "channel": ["en-GB", "fr-FR"],
           "irish-sea": ["en-GB", "en-IE"]}
TEAMS = {"north-sea": ["aberdeen-dons", "hull-tigers"], "baltic": ["kiel-storm", "gdansk-lions"],
         "atlantic": ["brest-corsairs", "porto-mariners"], "channel": ["dover-whites", "calais-canaries"],
         "irish-sea": ["dublin-harps", "liverpool-tide"]}
VERSIONS = ["4.2.0", "4.3.1", "5.0.0", "5.1.0"]
VERSION_WEIGHTS = [10, 25, 40, 25]


def token(rng):
    head = "".join(rng.choice(ALPHABET) for _ in range(11))
    body = "".join(rng.choice(ALPHABET) for _ in range(134))
    return f"{head}:APA91b{body}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=20261121)
    parser.add_argument("--out", default="manifests/inventory/devices.csv")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with open(args.out, "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["device_id", "token", "platform", "region", "locale", "app_version", "team", "plan", "user"])
        user = 1000
        for i in range(1, args.devices + 1):
            region = rng.choices(REGIONS, REGION_WEIGHTS)[0]
            platform = rng.choices(PLATFORMS, PLATFORM_WEIGHTS)[0]
            team = rng.choice(TEAMS[region]) if rng.random() < 0.6 else ""
            plan = "premium" if rng.random() < 0.18 else "free"
            # Some users own several devices: they get a user label (used by device groups).
            if rng.random() < 0.08:
                user += rng.choice([0, 1])
                owner = f"u{user}"
            else:
                owner = ""
            writer.writerow([f"dev-{i:05d}", token(rng), platform, region, rng.choice(LOCALES[region]),
                             rng.choices(VERSIONS, VERSION_WEIGHTS)[0], team, plan, owner])


if __name__ == "__main__":
    main()
