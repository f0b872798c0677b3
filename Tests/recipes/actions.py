"""Runs a GitHub Actions workflow's jobs here, step by step, the way a runner does: `${{ }}`
expressions (contexts, operators, functions the recipes use), `if:` conditions, env layering,
$GITHUB_OUTPUT, $GITHUB_STEP_SUMMARY and $GITHUB_PATH, `run:` steps under bash -eo pipefail.
`uses:` steps are stood in for by the handlers the caller passes.
"""

import hashlib
import glob
import os
import re
import subprocess
import tempfile

import yaml


class Expression:
    """GitHub's expression language, as far as the recipes use it: literals, contexts with dotted
    access, ! == != < <= > >= && || and parentheses, and the functions success(), failure(),
    always(), cancelled(), hashFiles(), contains(), startsWith(), format()."""

    TOKEN = re.compile(r"\s*(?:('(?:[^']|'')*')|(\d+(?:\.\d+)?)|(&&|\|\||==|!=|<=|>=|[!<>(),])|([A-Za-z_][\w.\-*]*))")

    def __init__(self, text, context, functions):
        self.tokens = []
        pos = 0
        text = text.strip()
        while pos < len(text):
            m = self.TOKEN.match(text, pos)
            if not m or m.end() == pos:
                raise ValueError("cannot read expression %r at %d" % (text, pos))
            string, number, op, name = m.groups()
            if string is not None:
                self.tokens.append(("lit", string[1:-1].replace("''", "'")))
            elif number is not None:
                self.tokens.append(("lit", float(number)))
            elif op is not None:
                self.tokens.append(("op", op))
            else:
                self.tokens.append(("name", name))
            pos = m.end()
        self.i = 0
        self.context, self.functions = context, functions

    def value(self):
        result = self.or_()
        if self.i != len(self.tokens):
            raise ValueError("unexpected %r" % (self.tokens[self.i],))
        return result

    def peek(self, op):
        return self.i < len(self.tokens) and self.tokens[self.i] == ("op", op)

    def or_(self):
        left = self.and_()
        while self.peek("||"):
            self.i += 1
            right = self.and_()
            left = left if truthy(left) else right
        return left

    def and_(self):
        left = self.compare()
        while self.peek("&&"):
            self.i += 1
            right = self.compare()
            left = right if truthy(left) else left
        return left

    def compare(self):
        left = self.unary()
        for op in ("==", "!=", "<=", ">=", "<", ">"):
            if self.peek(op):
                self.i += 1
                right = self.unary()
                a, b = coerce(left, right)
                return {"==": a == b, "!=": a != b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]
        return left

    def unary(self):
        if self.peek("!"):
            self.i += 1
            return not truthy(self.unary())
        return self.primary()

    def primary(self):
        kind, token = self.tokens[self.i]
        self.i += 1
        if kind == "lit":
            return token
        if (kind, token) == ("op", "("):
            result = self.or_()
            self.i += 1
            return result
        if token in ("true", "false"):
            return token == "true"
        if token == "null":
            return None
        if self.peek("("):
            self.i += 1
            args = []
            while not self.peek(")"):
                args.append(self.or_())
                if self.peek(","):
                    self.i += 1
            self.i += 1
            return self.functions[token.lower()](*args)
        value = self.context
        for part in token.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        return value


def truthy(value):
    return value not in (None, False, 0, "") and value == value


def coerce(a, b):
    """GitHub compares strings case-insensitively and otherwise as numbers."""
    if isinstance(a, str) and isinstance(b, str):
        return a.lower(), b.lower()
    def number(v):
        if v is None:
            return 0
        if isinstance(v, bool):
            return int(v)
        if isinstance(v, str):
            try:
                return float(v) if v.strip() else 0
            except ValueError:
                return float("nan")
        return v
    return number(a), number(b)


def text(value):
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


class Job:
    """One job of a workflow, run in `workdir`."""

    def __init__(self, workflow, name, context, workdir, uses, path=()):
        self.spec = workflow["jobs"][name]
        self.workflow = workflow
        self.name = name
        self.context = dict(context)
        self.workdir = workdir
        self.uses = uses
        self.path = list(path)
        self.temp = tempfile.mkdtemp(prefix="tm-runner-")
        self.summary = os.path.join(self.temp, "step-summary.md")
        open(self.summary, "w").close()
        self.steps = {}
        self.status = "success"
        self.log = []
        self.env = {}
        # What steps export for the steps after them ($GITHUB_ENV, or an action such as auth).
        self.exports = {}

    def functions(self):
        return {
            "success": lambda: self.status == "success",
            "failure": lambda: self.status == "failure",
            "always": lambda: True,
            "cancelled": lambda: False,
            "hashfiles": lambda *patterns: self.hash_files(patterns),
            "contains": lambda a, b: text(b).lower() in text(a).lower(),
            "startswith": lambda a, b: text(a).lower().startswith(text(b).lower()),
            "format": lambda f, *args: re.sub(r"\{(\d+)\}", lambda m: text(args[int(m.group(1))]), f),
        }

    def hash_files(self, patterns):
        files = sorted(f for p in patterns for f in glob.glob(os.path.join(self.workdir, p)) if os.path.isfile(f))
        if not files:
            return ""
        digest = hashlib.sha256()
        for f in files:
            with open(f, "rb") as handle:
                digest.update(hashlib.sha256(handle.read()).digest())
        return digest.hexdigest()

    def evaluate(self, expression):
        context = dict(self.context, env=self.env, steps=self.steps, runner={"temp": self.temp, "os": "Linux"})
        return Expression(expression, context, self.functions()).value()

    def interpolate(self, value):
        if not isinstance(value, str):
            return text(value)
        return re.sub(r"\$\{\{(.*?)\}\}", lambda m: text(self.evaluate(m.group(1))), value, flags=re.S)

    def condition(self, spec):
        raw = spec.get("if")
        if raw is None:
            return self.status == "success"
        raw = raw.strip()
        if raw.startswith("${{") and raw.endswith("}}"):
            raw = raw[3:-2]
        if not re.search(r"\b(success|failure|always|cancelled)\(", raw):
            raw = "success() && (%s)" % raw
        return truthy(self.evaluate(raw))

    def layer(self, env):
        for key, value in (env or {}).items():
            self.env[key] = self.interpolate(value)

    def run(self):
        """Runs the job when its `if:` holds; returns its status ("skipped", "success", "failure")."""
        self.layer(self.workflow.get("env"))
        if "if" in self.spec and not truthy(self.evaluate(self.spec["if"])):
            return "skipped"
        self.layer(self.spec.get("env"))
        for index, step in enumerate(self.spec["steps"]):
            step_id = step.get("id", "step%d" % index)
            saved = dict(self.env)
            self.layer(step.get("env"))
            if not self.condition(step):
                self.steps[step_id] = {"outputs": {}, "outcome": "skipped", "conclusion": "skipped"}
                self.env = saved
                continue
            outputs = {}
            if "uses" in step:
                with_ = {k: self.interpolate(v) for k, v in (step.get("with") or {}).items()}
                ok = self.uses(step["uses"], with_, self)
            else:
                ok, outputs = self.shell(self.interpolate(step["run"]), step.get("name", step_id))
            self.steps[step_id] = {"outputs": outputs, "outcome": "success" if ok else "failure",
                                   "conclusion": "success" if ok else "failure"}
            self.env = dict(saved, **self.exports)
            if not ok:
                self.status = "failure"
        return self.status

    def composite(self, path, with_):
        """Runs a composite action's steps (an action.yml with `runs.using: composite`) for a step of
        this job: its `inputs` context, its own step outputs, its `run:` steps under their `shell`;
        its `uses:` steps go to the same handlers. Returns whether every step succeeded."""
        with open(path) as f:
            action = yaml.safe_load(f)
        assert action["runs"]["using"] == "composite", path
        inputs = {}
        for name, spec in (action.get("inputs") or {}).items():
            inputs[name] = with_.get(name, self.interpolate((spec or {}).get("default", "")))
        outer = (self.context, self.steps, self.status)
        self.context = dict(self.context, inputs=inputs)
        self.steps = {}
        try:
            for index, step in enumerate(action["runs"]["steps"]):
                step_id = step.get("id", "composite%d" % index)
                saved = dict(self.env)
                self.layer(step.get("env"))
                if not self.condition(step):
                    self.steps[step_id] = {"outputs": {}, "outcome": "skipped", "conclusion": "skipped"}
                    self.env = saved
                    continue
                outputs = {}
                if "uses" in step:
                    ok = self.uses(step["uses"], {k: self.interpolate(v) for k, v in (step.get("with") or {}).items()}, self)
                else:
                    assert step.get("shell") == "bash", "a composite run step needs shell: bash"
                    ok, outputs = self.shell(self.interpolate(step["run"]), step.get("name", step_id))
                self.steps[step_id] = {"outputs": outputs, "outcome": "success" if ok else "failure"}
                self.env = dict(saved, **self.exports)
                if not ok:
                    self.status = "failure"
            return self.status == "success"
        finally:
            self.context, self.steps, status = outer
            self.status = status

    def shell(self, script, name):
        output = os.path.join(self.temp, "output")
        open(output, "w").close()
        path_file = os.path.join(self.temp, "path")
        open(path_file, "w").close()
        env_file = os.path.join(self.temp, "env")
        open(env_file, "w").close()
        env = dict(os.environ, **self.env)
        env.update(GITHUB_OUTPUT=output, GITHUB_STEP_SUMMARY=self.summary, GITHUB_PATH=path_file, GITHUB_ENV=env_file,
                   RUNNER_TEMP=self.temp, GITHUB_WORKSPACE=self.workdir, CI="true", GITHUB_ACTIONS="true",
                   GITHUB_REPOSITORY=self.context["github"]["repository"],
                   GITHUB_SHA=self.context["github"]["sha"], GITHUB_EVENT_NAME=self.context["github"]["event_name"])
        env["PATH"] = os.pathsep.join(self.path + [os.environ["PATH"]])
        script_file = os.path.join(self.temp, "step.sh")
        with open(script_file, "w") as f:
            f.write(script)
        proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", script_file], cwd=self.workdir,
                              env=env, capture_output=True, text=True, timeout=600)
        self.log.append((name, proc.returncode, proc.stdout, proc.stderr))
        outputs = {}
        with open(output) as f:
            lines = f.read().splitlines()
        with open(path_file) as f:
            self.path = [p for p in f.read().splitlines() if p] + self.path
        with open(env_file) as f:
            for line in f.read().splitlines():
                key, sep, value = line.partition("=")
                if sep:
                    self.exports[key] = value
        for line in lines:
            key, sep, value = line.partition("=")
            if sep:
                outputs[key] = value
        return proc.returncode == 0, outputs

    def transcript(self):
        return "\n".join("--- %s (exit %d)\n%s%s" % entry for entry in self.log)


def load(path):
    with open(path) as f:
        workflow = yaml.safe_load(f)
    # YAML 1.1 reads the key `on` as True.
    if True in workflow:
        workflow["on"] = workflow.pop(True)
    return workflow
