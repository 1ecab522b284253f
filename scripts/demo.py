#!/usr/bin/python3
"""make demo: the serving stack under a steady load, with two stages killed mid-generation.

On 127.0.0.1 only, on free ports: makes a small model (connex-mkmodel), starts a directory
(connex-directory), two replica chains of a 4-stage pipeline (connex-stage) and the resume proxy
(connex-proxy); streams /v1/completions (greedy and seeded sampling) from a few clients through
the proxy; SIGKILLs stage 2 of replica 0 mid-generation and restarts it under the same LID, then
SIGKILLs stage 0 of replica 1 and restarts it; prints progress, then a report: requests, tokens,
kill-to-next-token per kill, goodput, and whether every completion equals connex-generate on the
same prompt, max_tokens, temperature and seed. Exit 0 when every check passed, 1 when one
failed, 2 for bad usage, 130 on Ctrl-C. Stops everything it started in every case.

Standard library only (Debian's /usr/bin/python3). Flags: docs/configuration.md ("Demo").
"""

import argparse
import collections
import ctypes
import http.client
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HOST = "127.0.0.1"  # every address the demo binds or connects to
MODEL_NAME = "tiny"
STAGES = 4
REPLICAS = 2
EOS = 257  # the reference tokenizer: bytes 0..255, BOS 256, EOS 257
# The model: 8 layers of dim 256 (4.9 M parameters, 19 MB): two layers per stage, so that eight
# stage processes on two cores generate at a steady pace.
MKMODEL_FLAGS = ["--layers", "8", "--dim", "256", "--heads", "4", "--kv-heads", "2",
                 "--ffn", "512", "--seed", "7"]
# Set on every stage unless the caller's environment already sets them: one kernel thread per
# stage (eight stages share two cores).
STAGE_ENV = {"CONNEX_ENGINE_THREADS": "1"}

START_TIMEOUT_S = 30.0  # a process's ready line
RESUME_TIMEOUT_S = 30.0  # every stream in flight at a kill receives its next token
REQUEST_TIMEOUT_S = 120.0  # one socket read of a client

# The load: each client cycles through these; request i has prompt PROMPTS[i % len] + " #i".
PROMPTS = [
    "Endpoint mobility keeps in-flight work correct",
    "A logical identity outlives the process behind it",
    "The directory resolves a LID to its current address",
    "Pipeline stages hand their steps over when a peer dies",
    "Counter-based sampling makes a resumed request exact",
    "Once upon a time, in a data centre far away",
    "def fib(n): return n if n < 2 else",
    "Dear reader, this stream survives a SIGKILL",
]
MAX_TOKENS = [128, 192, 256]
PHASE_S = 10.0  # load before the first kill, between the kills, after the last restart
SEEDS = [7, 42, 1234]  # seeded requests use temperature 0.8 and one of these


def log(msg):
    with _print_lock:
        sys.stdout.write(msg + "\n")
        sys.stdout.flush()


_print_lock = threading.Lock()


class DemoError(Exception):
    """A failure that ends the demo; its message names what failed."""


class Interrupted(Exception):
    """SIGINT, SIGTERM or SIGHUP."""


def _on_signal(signum, frame):
    raise Interrupted(signal.Signals(signum).name)


# --- processes ---------------------------------------------------------------------------------

_libc = None
try:
    _libc = ctypes.CDLL("libc.so.6", use_errno=True)
except OSError:
    pass
_PR_SET_PDEATHSIG = 1


def _child_setup(parent_pid):
    # Dies with the demo even if the demo itself is SIGKILLed (every process is started from the
    # main thread, whose exit is what the kernel watches).
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(1)


class Proc:
    """One process the demo started: its own process group, stdout read line by line (kept, and
    copied to its log with stderr)."""

    def __init__(self, name, argv, env, log_dir):
        self.name = name
        self.argv = argv
        self.log_path = os.path.join(log_dir, re.sub(r"[^A-Za-z0-9.-]+", "-", name) + ".log")
        self._log = open(self.log_path, "ab", buffering=0)
        self._log.write(("$ " + " ".join(argv) + "\n").encode())
        self._cv = threading.Condition()
        self.lines = []  # stdout lines, in order
        self._eof = False
        parent = os.getpid()
        try:
            self.popen = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._log,
                env=env, start_new_session=True, preexec_fn=lambda: _child_setup(parent))
        except OSError as e:
            raise DemoError(f"{name}: cannot start {argv[0]}: {e}") from None
        self.pid = self.popen.pid
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for raw in self.popen.stdout:
            self._log.write(raw)
            with self._cv:
                self.lines.append(raw.decode(errors="replace").rstrip("\n"))
                self._cv.notify_all()
        with self._cv:
            self._eof = True
            self._cv.notify_all()

    def alive(self):
        return self.popen.poll() is None

    def wait_line(self, pattern, timeout_s, what):
        """The first stdout line matching `pattern` (a regex) as a match object; a DemoError
        naming the process if it exits or the deadline passes first."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout_s
        seen = 0
        with self._cv:
            while True:
                while seen < len(self.lines):
                    m = rx.search(self.lines[seen])
                    seen += 1
                    if m:
                        return m
                if self._eof:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cv.wait(min(left, 0.5))
        if self._eof or not self.alive():
            try:
                rc = self.popen.wait(5)
            except subprocess.TimeoutExpired:
                rc = "?"
            raise DemoError(f"{self.name} exited (code {rc}) before printing {what}\n"
                            + self.tail())
        raise DemoError(f"{self.name} did not print {what} within {timeout_s:.0f} s\n"
                        + self.tail())

    def tail(self, n=15):
        try:
            with open(self.log_path, "rb") as f:
                lines = f.read().decode(errors="replace").splitlines()[-n:]
        except OSError:
            lines = []
        return "".join(f"    | {line}\n" for line in lines) + f"    (log: {self.log_path})"

    def signal(self, sig):
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, grace_s):
        """SIGTERM (a stage leaves gracefully), SIGKILL after `grace_s`. Returns a problem (the
        process had exited already, or did not exit 0 on SIGTERM) or None."""
        problem = None
        if self.alive():
            self.signal(signal.SIGTERM)
            try:
                rc = self.popen.wait(grace_s)
                if rc != 0:
                    problem = f"{self.name} exited {rc} on SIGTERM\n" + self.tail(8)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.popen.wait(5)
                problem = f"{self.name} did not exit within {grace_s:.0f} s of SIGTERM"
        else:
            problem = f"{self.name} had exited by itself (code {self.popen.returncode})\n" + \
                self.tail(8)
        self.signal(signal.SIGKILL)  # anything left in its group
        self._reader.join(2)
        self._log.close()
        return problem


class Stack:
    """Every process of the demo; stop_all() in the reverse order of their start."""

    def __init__(self, bin_dir, work_dir, backend):
        self.bin = bin_dir
        self.work = work_dir
        self.logs = os.path.join(work_dir, "logs")
        os.makedirs(self.logs, exist_ok=True)
        self.backend = backend
        self.procs = []
        self.model_dir = os.path.join(work_dir, MODEL_NAME)
        self.directory = None
        self.stages = {}  # (stage, replica) -> Proc
        self.http = {}  # replica -> "HOST:PORT" of its stage 0
        self.lids = {}  # (stage, replica) -> LID
        self.epochs = {}
        self.proxy = None
        self.proxy_addr = None
        self.killed = set()  # processes the demo SIGKILLed on purpose
        self.generators = []  # connex-generate runs in progress
        self.load = None
        self.progress = None

    def exe(self, name):
        return os.path.join(self.bin, name)

    def start(self, name, argv, extra_env=None):
        env = dict(os.environ)
        for k, v in (extra_env or {}).items():
            env.setdefault(k, v)
        p = Proc(name, argv, env, self.logs)
        self.procs.append(p)
        return p

    def stop_all(self, grace_s):
        """Stops every process, the last started first; returns their problems."""
        problems = []
        while self.procs:
            p = self.procs.pop()
            try:
                problem = p.stop(grace_s)
            except Exception as e:  # keep stopping the others
                problem = f"stopping {p.name}: {e}"
            if problem:
                problems.append(problem)
        return problems

    def make_model(self):
        os.makedirs(self.model_dir, exist_ok=True)
        out = os.path.join(self.model_dir, "model.safetensors")
        p = self.start("connex-mkmodel", [self.exe("connex-mkmodel"), "--out", out]
                       + MKMODEL_FLAGS)
        m = p.wait_line(r"^wrote ", START_TIMEOUT_S, "'wrote ...'")
        if p.popen.wait(START_TIMEOUT_S) != 0:
            raise DemoError("connex-mkmodel failed\n" + p.tail())
        self.procs.remove(p)
        p.stop(1)
        return m.string

    def start_directory(self):
        p = self.start("connex-directory",
                       [self.exe("connex-directory"), "--bind", f"tcp://{HOST}:0",
                        "--pub", f"tcp://{HOST}:0"])
        m = p.wait_line(r"listening bind=(tcp://\S+) pub=(tcp://\S+)", START_TIMEOUT_S,
                        "'listening bind=... pub=...'")
        self.directory = p
        self.directory_addr = m.group(1)
        return m.group(0)

    def stage_argv(self, stage, replica):
        argv = [self.exe("connex-stage"), "--directory", self.directory_addr,
                "--model", self.model_dir, "--stage", str(stage), "--stages", str(STAGES),
                "--replica", str(replica), "--backend", self.backend]
        if stage == 0:
            argv += ["--http", f"{HOST}:0"]
        return argv

    def start_stage(self, stage, replica):
        """Starts (or restarts, with the same flags) one stage; returns once it printed ready."""
        name = f"stage {stage} of replica {replica}"
        p = self.start(name, self.stage_argv(stage, replica), STAGE_ENV)
        if stage == 0:
            m = p.wait_line(r"listening http=(\S+)", START_TIMEOUT_S, "'listening http=...'")
            self.http[replica] = m.group(1)
        m = p.wait_line(r"^ready (\S+) epoch=(\d+)", START_TIMEOUT_S, "'ready LID epoch=N'")
        self.stages[(stage, replica)] = p
        self.lids[(stage, replica)] = m.group(1)
        self.epochs[(stage, replica)] = int(m.group(2))
        return p

    def start_proxy(self):
        exe = self.exe("connex-proxy")
        if not os.access(exe, os.X_OK):
            raise DemoError(f"{exe} is missing: build it (make demo does), or run with --no-proxy")
        p = self.start("connex-proxy", [exe, "--directory", self.directory_addr,
                                        "--model", MODEL_NAME, "--listen", f"{HOST}:0"])
        m = p.wait_line(r"listening http=(\S+)", START_TIMEOUT_S, "'listening http=...'")
        self.proxy = p
        self.proxy_addr = m.group(1)
        return p


# --- HTTP ---------------------------------------------------------------------------------------

def split_addr(addr):
    host, _, port = addr.rpartition(":")
    if host != HOST:
        raise DemoError(f"refusing to talk to {addr}: the demo only uses {HOST}")
    return host, int(port)


def http_get(addr, path, timeout_s=5.0):
    """(status, body) of a GET; (0, error text) when the server does not answer."""
    host, port = split_addr(addr)
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read().decode(errors="replace")
    except (OSError, http.client.HTTPException) as e:
        return 0, str(e)
    finally:
        conn.close()


def wait_healthy(addr, what, timeout_s, procs):
    deadline = time.monotonic() + timeout_s
    status, body = 0, ""
    while time.monotonic() < deadline:
        for p in procs:
            if not p.alive():
                raise DemoError(f"{p.name} exited while waiting for {what} to be healthy\n"
                                + p.tail())
        status, body = http_get(addr, "/health")
        if status == 200:
            return
        time.sleep(0.1)
    raise DemoError(f"{what} ({addr}) /health is still {status} after {timeout_s:.0f} s: {body}")


def metric(text, name):
    """Sum of the samples of `name` (every label set) in a Prometheus text body; None if none."""
    total, found = 0.0, False
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = re.match(r"([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)", line)
        if m and m.group(1) == name:
            total += float(m.group(3))
            found = True
    return total if found else None


def scrape(addr, name):
    status, body = http_get(addr, "/metrics")
    return metric(body, name) if status == 200 else None


# --- the load -----------------------------------------------------------------------------------

class Completion:
    """One streamed request: what was asked, what came back, when each token arrived."""

    def __init__(self, index, client, prompt, max_tokens, temperature, seed, usage):
        self.index = index
        self.usage_asked = usage  # stream_options.include_usage
        self.usage = None  # the usage chunk's
        self.ids = set()  # the response ids of its chunks (one expected)
        self.client = client
        self.prompt = prompt
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.seed = seed
        self.token_ids = []
        self.text = ""
        self.times = []  # monotonic arrival time of each token (a chunk's tokens share one)
        self.finish = None
        self.error = None
        self.start = None
        self.end = None
        self.reference = None  # (token ids, text) of connex-generate

    def body(self):
        b = {"model": MODEL_NAME, "prompt": self.prompt, "max_tokens": self.max_tokens,
             "stream": True}
        if self.usage_asked:
            b["stream_options"] = {"include_usage": True}
        if self.temperature > 0:
            b["temperature"] = self.temperature
            b["seed"] = self.seed
        return b

    def sampling(self):
        return "greedy" if self.temperature == 0 else f"T={self.temperature} seed={self.seed}"

    def in_flight_at(self, t):
        return self.start <= t and (self.end is None or self.end > t)

    def next_token_after(self, t):
        for at in self.times:
            if at > t:
                return at
        return None


class Load:
    """`clients` threads, each streaming one completion after another to its target(s)."""

    def __init__(self, targets, clients):
        self.targets = targets  # function client -> address
        self.clients = clients
        self.lock = threading.Lock()
        self.completions = []
        self.next_index = 0
        self.stop = threading.Event()
        self.threads = []
        self.started = None

    def begin(self):
        self.started = time.monotonic()
        for c in range(self.clients):
            t = threading.Thread(target=self._client, args=(c,), daemon=True)
            t.start()
            self.threads.append(t)

    def end(self, timeout_s):
        self.stop.set()
        deadline = time.monotonic() + timeout_s
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return [t for t in self.threads if t.is_alive()]

    def _new(self, client):
        with self.lock:
            i = self.next_index
            self.next_index += 1
        prompt = f"{PROMPTS[i % len(PROMPTS)]} #{i}"
        max_tokens = MAX_TOKENS[(i // 2) % len(MAX_TOKENS)]
        if i % 2 == 0:
            temperature, seed = 0.0, None
        else:
            temperature, seed = 0.8, SEEDS[(i // 6) % len(SEEDS)]
        c = Completion(i, client, prompt, max_tokens, temperature, seed, usage=i % 3 == 0)
        with self.lock:
            self.completions.append(c)
        return c

    def _client(self, client):
        while not self.stop.is_set():
            c = self._new(client)
            self._run(c, self.targets(client))
            self.stop.wait(0.2)  # pacing between requests

    def _run(self, c, addr):
        host, port = split_addr(addr)
        conn = http.client.HTTPConnection(host, port, timeout=REQUEST_TIMEOUT_S)
        c.start = time.monotonic()
        done = False
        try:
            conn.request("POST", "/v1/completions", body=json.dumps(c.body()),
                         headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            if r.status != 200:
                c.error = f"HTTP {r.status}: {r.read().decode(errors='replace')[:300]}"
                return
            for raw in r:
                line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    done = True
                    break
                j = json.loads(data)
                if "error" in j:
                    c.error = f"error event: {json.dumps(j['error'])[:300]}"
                    return
                now = time.monotonic()
                c.ids.add(j.get("id"))
                if j.get("usage"):
                    c.usage = j["usage"]
                for ch in j.get("choices", []):
                    ids = ch.get("token_ids") or []
                    c.token_ids.extend(ids)
                    c.times.extend([now] * len(ids))
                    c.text += ch.get("text") or ""
                    if ch.get("finish_reason") is not None:
                        c.finish = ch["finish_reason"]
            if not done:
                c.error = (f"the stream ended without [DONE] after {len(c.token_ids)} tokens")
        except (OSError, http.client.HTTPException, ValueError) as e:
            c.error = f"{type(e).__name__}: {e} after {len(c.token_ids)} tokens"
        finally:
            c.end = time.monotonic()
            conn.close()

    def snapshot(self):
        with self.lock:
            cs = list(self.completions)
        done = [c for c in cs if c.end is not None and c.error is None]
        failed = [c for c in cs if c.error is not None]
        running = [c for c in cs if c.start is not None and c.end is None]
        tokens = sum(len(c.token_ids) for c in cs)
        return done, failed, running, tokens


class Progress:
    """Prints one line a second while the load runs."""

    def __init__(self, load):
        self.load = load
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.last_tokens = 0

    def _run(self):
        while not self.stop.wait(1.0):
            done, failed, running, tokens = self.load.snapshot()
            t = time.monotonic() - self.load.started
            log(f"  {t:5.1f} s  streaming {len(running)}  done {len(done):3d}  "
                f"failed {len(failed)}  tokens {tokens:5d}  ({tokens - self.last_tokens} tok/s)")
            self.last_tokens = tokens


# --- the scenario -------------------------------------------------------------------------------

class Kill:
    def __init__(self, stage, replica, lid):
        self.stage = stage
        self.replica = replica
        self.lid = lid
        self.at = None
        self.in_flight = []  # completions streaming at the kill, with a token already
        self.gaps = []  # per such stream: seconds from the kill to its next token
        self.noticed = None  # what shows the kill was felt, or None
        self.retries = None  # the proxy's retries from the kill to the restart (a stage 0)
        self.restart_s = None
        self.new_epoch = None


def t_rel(load, t):
    return t - load.started


def wait_for(cond, timeout_s, what, stack):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for p in stack.procs:
            if not p.alive() and p not in stack.killed:
                raise DemoError(f"{p.name} exited unexpectedly (code {p.popen.returncode})\n"
                                + p.tail())
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    raise DemoError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def failovers(stack):
    total = 0.0
    for r in range(REPLICAS):
        p = stack.stages.get((0, r))
        if p is not None and p.alive():
            total += scrape(stack.http[r], "connex_failovers_total") or 0.0
    return total


def kill_mid_generation(stack, load, stage, replica, settle_s):
    """SIGKILLs (stage, replica) once streams are mid-generation, measures each in-flight
    stream's kill-to-next-token, restarts it under the same LID and waits for its ready line."""
    k = Kill(stage, replica, stack.lids[(stage, replica)])
    victim = stack.stages[(stage, replica)]
    # Mid-generation: at least two streams have tokens and are far from their end, and the
    # stage 0 of the victim's replica owns a running request.
    def ready_to_kill():
        _, _, running, _ = load.snapshot()
        mid = [c for c in running if 8 <= len(c.token_ids) <= c.max_tokens - 40]
        if len(mid) < 2:
            return False
        # The victim's chain is generating (its stage 0 owns a running request).
        return (scrape(stack.http[replica], "connex_requests_running") or 0) >= 1

    time.sleep(settle_s)  # pacing: let the load run before the kill
    wait_for(ready_to_kill, 60, f"streams mid-generation before killing {k.lid}", stack)
    before = failovers(stack)
    proxy_resumes = proxy_resume_count(stack)
    proxy_retries = proxy_retry_count(stack)
    stack.killed.add(victim)
    k.at = time.monotonic()
    victim.signal(signal.SIGKILL)
    _, _, running, _ = load.snapshot()
    k.in_flight = [c for c in running if c.times and c.in_flight_at(k.at)]
    log(f"* {t_rel(load, k.at):5.1f} s  SIGKILL {k.lid} (pid {victim.pid}), "
        f"{len(k.in_flight)} streams in flight")

    def resumed():
        for c in k.in_flight:
            if c.next_token_after(k.at) is None and c.end is None:
                return False
        return True

    wait_for(resumed, RESUME_TIMEOUT_S, f"the streams in flight at the kill of {k.lid} to go on",
             stack)
    for c in k.in_flight:
        nt = c.next_token_after(k.at)
        if nt is not None:
            k.gaps.append(nt - k.at)
    worst = max(k.gaps) if k.gaps else float("nan")
    log(f"* {t_rel(load, time.monotonic()):5.1f} s  every stream in flight went on; "
        f"kill -> next token: worst {worst * 1000:.0f} ms")
    victim.popen.wait(10)
    # What shows the kill was felt: the owners' failovers (a middle stage) or the proxy's
    # resumes (a stage 0).
    if stage == 0:
        if proxy_resumes is not None:
            after = wait_until_increase(lambda: proxy_resume_count(stack), proxy_resumes, 10)
            if after is not None:
                k.noticed = f"connex_proxy_resumes_total {proxy_resumes:.0f} -> {after:.0f}"
    else:
        after = wait_until_increase(lambda: failovers(stack), before, 10)
        if after is not None:
            k.noticed = f"connex_failovers_total {before:.0f} -> {after:.0f}"
    t0 = time.monotonic()
    stack.procs.remove(victim)
    victim.stop(1)
    log(f"* {t_rel(load, t0):5.1f} s  restarting {k.lid} with the same flags")
    stack.start_stage(stage, replica)
    if stage == 0:
        wait_healthy(stack.http[replica], f"restarted {k.lid}", START_TIMEOUT_S, stack.procs)
    k.restart_s = time.monotonic() - t0
    if stage == 0 and proxy_retries is not None:
        retries = proxy_retry_count(stack)
        if retries is not None:
            k.retries = f"connex_proxy_retries_total {proxy_retries:.0f} -> {retries:.0f}"
    k.new_epoch = stack.epochs[(stage, replica)]
    log(f"* {t_rel(load, time.monotonic()):5.1f} s  {k.lid} ready again, epoch={k.new_epoch} "
        f"({k.restart_s:.1f} s after the restart)")
    return k


def wait_until_increase(read, before, timeout_s):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = read()
        if v is not None and v > before:
            return v
        time.sleep(0.1)
    return None


def proxy_retry_count(stack):
    """connex-proxy's retries (attempts after a failure, resumes included)."""
    if stack.proxy is None or not stack.proxy.alive():
        return None
    return scrape(stack.proxy_addr, "connex_proxy_retries_total")


def proxy_resume_count(stack):
    """connex-proxy's resumes (retries that continued a response under way); None without it."""
    if stack.proxy is None or not stack.proxy.alive():
        return None
    return scrape(stack.proxy_addr, "connex_proxy_resumes_total")


# --- the reference ------------------------------------------------------------------------------

def references(stack, completions):
    """connex-generate on the same prompt, max_tokens, temperature and seed: one run per
    (max_tokens, temperature, seed) with its prompts as one batch (--prompts-file), two runs at
    a time. Sets each completion's `reference` to (token ids, text)."""
    groups = collections.defaultdict(list)
    for c in completions:
        groups[(c.max_tokens, c.temperature, c.seed)].append(c)
    model = os.path.join(stack.model_dir, "model.safetensors")
    todo = []
    for n, ((max_tokens, temperature, seed), cs) in enumerate(sorted(
            groups.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] or 0))):
        base = os.path.join(stack.work, f"reference-{n}")
        with open(base + ".prompts", "w") as f:
            for c in cs:
                f.write(c.prompt + "\n")
        argv = [stack.exe("connex-generate"), "--model", model, "--prompts-file",
                base + ".prompts", "--max-tokens", str(max_tokens), "--json", "--threads", "1"]
        if temperature > 0:
            argv += ["--temperature", str(temperature), "--seed", str(seed)]
        todo.append((argv, base, cs))
    running = []
    deadline = time.monotonic() + 600
    done_runs = 0
    last_print = time.monotonic()
    while todo or running:
        while todo and len(running) < 2:
            argv, base, cs = todo.pop(0)
            with open(base + ".out", "wb") as out, open(base + ".err", "wb") as err:
                p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                     start_new_session=True,
                                     preexec_fn=lambda pid=os.getpid(): _child_setup(pid))
            running.append((p, argv, base, cs))
            stack.generators.append(p)
        p, argv, base, cs = running[0]
        try:
            rc = p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise DemoError(f"connex-generate did not finish in time: {' '.join(argv)}")
        running.pop(0)
        stack.generators.remove(p)
        if rc != 0:
            with open(base + ".err", "rb") as f:
                err = f.read().decode(errors="replace")[-2000:]
            raise DemoError(f"connex-generate exited {rc}: {' '.join(argv)}\n{err}")
        with open(base + ".out", "rb") as f:
            lines = f.read().decode().splitlines()
        if len(lines) != len(cs):
            raise DemoError(f"connex-generate printed {len(lines)} lines for {len(cs)} prompts: "
                            + " ".join(argv))
        for c, line in zip(cs, lines):
            j = json.loads(line)
            c.reference = (j["tokens"], j["text"])
        done_runs += 1
        if time.monotonic() - last_print >= 1.0 or not (todo or running):
            last_print = time.monotonic()
            log(f"  connex-generate {done_runs}/{len(groups)} runs done")


# --- main ---------------------------------------------------------------------------------------

def parse_args(argv):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(
        description="The serving stack under load, with a middle stage and a stage 0 "
                    "SIGKILLed mid-generation (docs/configuration.md, 'Demo').")
    ap.add_argument("--bin", default=os.path.join(root, "build", "bin"),
                    help="directory of the Connex binaries (default: build/bin of this checkout)")
    ap.add_argument("--clients", type=int, default=4,
                    help="concurrent streaming clients (1 .. 64, default 4)")
    ap.add_argument("--backend", default="tcp", choices=["auto", "tcp", "shm"],
                    help="data plane between the stages (default tcp)")
    ap.add_argument("--no-proxy", action="store_true",
                    help="debugging: clients talk to the stage-0 replicas directly, and no "
                         "stage 0 is killed")
    ap.add_argument("--keep", action="store_true",
                    help="keep the work directory (model, logs) also when every check passed")
    a = ap.parse_args(argv)
    if not 1 <= a.clients <= 64:
        ap.error(f"--clients must be in 1 .. 64, got {a.clients}")
    for b in ["connex-mkmodel", "connex-directory", "connex-stage", "connex-generate"] + \
            ([] if a.no_proxy else ["connex-proxy"]):
        if not os.access(os.path.join(a.bin, b), os.X_OK):
            ap.error(f"--bin {a.bin}: no executable {b} (build it: make demo builds what it runs)")
    return a


def main(argv):
    args = parse_args(argv)
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, _on_signal)
    work = tempfile.mkdtemp(prefix="connex-demo-")
    stack = Stack(os.path.abspath(args.bin), work, args.backend)
    ok = False
    try:
        code = run(args, stack)
        ok = code == 0
        return code
    except DemoError as e:
        log(f"\ndemo FAILED: {e}")
        return 1
    except Interrupted as e:
        log(f"\ndemo interrupted ({e}); stopping everything it started")
        return 130
    finally:
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)
        if stack.load is not None:
            stack.load.stop.set()
        if stack.progress is not None:
            stack.progress.stop.set()
        for p in stack.generators:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        stack.stop_all(grace_s=3)
        if ok and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            log(f"work directory (model, logs): {work}")


def run(args, stack):
    t_start = time.monotonic()
    log(f"connex demo: {REPLICAS} replicas x {STAGES} stages of '{MODEL_NAME}', "
        + ("NO proxy (the clients use the stage-0 replicas directly)" if args.no_proxy
           else "connex-proxy")
        + f", {args.clients} streaming clients, {HOST} only")
    log("- " + stack.make_model())
    log("- connex-directory " + stack.start_directory())
    for r in range(REPLICAS):
        for s in reversed(range(STAGES)):
            stack.start_stage(s, r)
        log(f"- replica {r}: " + ", ".join(stack.lids[(s, r)] for s in range(STAGES))
            + f" ready; its stage 0 serves http={stack.http[r]}")
    for r in range(REPLICAS):
        wait_healthy(stack.http[r], f"stage 0 of replica {r}", START_TIMEOUT_S, stack.procs)
    if args.no_proxy:
        targets = lambda client: stack.http[client % REPLICAS]
    else:
        stack.start_proxy()
        wait_healthy(stack.proxy_addr, "connex-proxy", START_TIMEOUT_S, stack.procs)
        log(f"- connex-proxy listening http={stack.proxy_addr}")
        targets = lambda client: stack.proxy_addr
    log(f"- ready in {time.monotonic() - t_start:.1f} s; streaming /v1/completions "
        "(greedy and seeded sampling)")

    load = Load(targets, args.clients)
    stack.load = load
    load.begin()
    stack.progress = Progress(load)
    stack.progress.thread.start()
    kills = [kill_mid_generation(stack, load, 2, 0, settle_s=PHASE_S)]
    if not args.no_proxy:
        kills.append(kill_mid_generation(stack, load, 0, 1, settle_s=PHASE_S))
    time.sleep(PHASE_S)  # pacing: the restarted stages take traffic
    restarted = None
    if not args.no_proxy:
        restarted = scrape(stack.http[1], "connex_request_success_total")
    stragglers = load.end(REQUEST_TIMEOUT_S)
    load_s = time.monotonic() - load.started
    stack.progress.stop.set()
    if stragglers:
        raise DemoError(f"{len(stragglers)} clients did not finish their request within "
                        f"{REQUEST_TIMEOUT_S:.0f} s after the load stopped")
    shutdown = stack.stop_all(grace_s=10)
    log(f"- load stopped after {load_s:.1f} s, every process stopped (SIGTERM); "
        "connex-generate on every prompt:")
    done, _, _, _ = load.snapshot()
    t_ref = time.monotonic()
    references(stack, done)
    ref_s = time.monotonic() - t_ref
    return report(args, stack, load, kills, load_s, ref_s, restarted, shutdown)


def ms(seconds):
    return f"{seconds * 1000:.0f} ms"


def report(args, stack, load, kills, load_s, ref_s, restarted, shutdown):
    done, failed, _, tokens = load.snapshot()
    problems = []
    mismatched = []
    for c in done:
        ref_ids, ref_text = c.reference
        why = []
        if c.token_ids != ref_ids:
            first = next((i for i, (a, b) in enumerate(zip(c.token_ids, ref_ids)) if a != b),
                         min(len(c.token_ids), len(ref_ids)))
            why.append(f"token ids differ from index {first} on ({len(c.token_ids)} streamed, "
                       f"{len(ref_ids)} from connex-generate)")
        if c.text != ref_text:
            why.append(f"text differs (streamed {c.text[:40]!r}..., connex-generate "
                       f"{ref_text[:40]!r}...)")
        want_finish = "stop" if c.token_ids and c.token_ids[-1] == EOS else "length"
        if c.finish != want_finish:
            why.append(f"finish_reason {c.finish}, expected {want_finish}")
        if len(c.ids) != 1:
            why.append(f"{len(c.ids)} response ids in one stream: {sorted(map(str, c.ids))}")
        if c.usage_asked:
            want = {"prompt_tokens": len(c.prompt.encode()) + 1,  # BOS + bytes
                    "completion_tokens": len(c.token_ids)}
            want["total_tokens"] = want["prompt_tokens"] + want["completion_tokens"]
            got = {k: (c.usage or {}).get(k) for k in want}
            if got != want:
                why.append(f"usage {got}, expected {want}")
        if why:
            mismatched.append((c, why))
    bad = {id(c) for c, _ in mismatched}
    good_tokens = sum(len(c.token_ids) for c in done if id(c) not in bad)
    greedy = sum(1 for c in done if c.temperature == 0)
    # The inter-token gap outside the kills, for scale.
    gaps = []
    for c in done:
        for a, b in zip(c.times, c.times[1:]):
            if b > a and not any(k.at is not None and a <= k.at <= b for k in kills):
                gaps.append(b - a)
    itl = statistics.median(gaps) if gaps else float("nan")

    log("")
    log("=== connex demo report ===")
    log(f"deployment   {REPLICAS} replicas x {STAGES} stages of '{MODEL_NAME}', backend "
        f"{stack.backend}, "
        + ("through connex-proxy" if not args.no_proxy else "stage 0 directly (--no-proxy)"))
    log(f"model        connex-mkmodel {' '.join(MKMODEL_FLAGS)}")
    log(f"requests     {len(done)} done ({greedy} greedy, {len(done) - greedy} seeded T=0.8), "
        f"{len(failed)} failed; {args.clients} streaming clients")
    log(f"tokens       {tokens} streamed in {load_s:.1f} s; a stream's median gap between two "
        f"tokens {ms(itl)}")
    log(f"goodput      {good_tokens / load_s:.1f} tokens/s (of completions identical to "
        "connex-generate)")
    for k in kills:
        what = "a middle stage" if 0 < k.stage < STAGES - 1 else (
            "a stage 0" if k.stage == 0 else "the last stage")
        log(f"kill         {k.lid} ({what}): SIGKILL at {t_rel(load, k.at):.1f} s, "
            f"{len(k.in_flight)} streams in flight")
        if k.gaps:
            g = sorted(k.gaps)
            log(f"             kill -> next token {ms(g[-1])} (the last of them to get one; "
                f"first {ms(g[0])}, median {ms(statistics.median(g))})")
        log(f"             noticed: {k.noticed or 'NOT NOTICED'}")
        log(f"             restarted under the same LID: ready in {k.restart_s:.1f} s "
            f"(epoch {k.new_epoch})")
        if k.retries:
            log(f"             {k.retries} from the kill to the restart (resumes included)")
        if not k.in_flight:
            problems.append(f"the kill of {k.lid} found no stream in flight")
        if not k.noticed:
            problems.append(f"the kill of {k.lid} was not noticed (no failover, no resume)")
    if restarted is not None:
        log(f"             then completed {restarted:.0f} requests")
        if restarted < 1:
            problems.append(f"the restarted {stack.lids[(0, 1)]} took no traffic in the "
                            f"{PHASE_S:.0f} s after its restart")
    log(f"exactness    {len(done) - len(mismatched)}/{len(done)} completions identical to "
        "connex-generate (token ids and text), with")
    log(f"             the right finish_reason, usage and one response id ({ref_s:.1f} s to "
        "compute)")
    log("shutdown     " + ("every process exited 0 on SIGTERM" if not shutdown else
                           f"{len(shutdown)} problems"))
    for c, why in mismatched[:10]:
        problems.append(f"request #{c.index} ({c.sampling()}, max_tokens {c.max_tokens}, "
                        f"prompt {c.prompt!r}): " + "; ".join(why))
    if len(mismatched) > 10:
        problems.append(f"... and {len(mismatched) - 10} more mismatches")
    if mismatched:
        c = mismatched[0][0]
        model = os.path.join(stack.model_dir, "model.safetensors")
        flags = "" if c.temperature == 0 else f" --temperature {c.temperature} --seed {c.seed}"
        problems.append(
            f"to reproduce request #{c.index} (the work directory below is kept): "
            f"{stack.exe('connex-generate')} --model {model} --prompt {shlex.quote(c.prompt)} "
            f"--max-tokens {c.max_tokens}{flags} --json; and the same POST /v1/completions "
            f"{json.dumps(c.body())} to a stage 0 or the proxy")
    for c in failed[:10]:
        problems.append(f"request #{c.index} ({c.sampling()}, prompt {c.prompt!r}) failed: "
                        f"{c.error}")
    if len(failed) > 10:
        problems.append(f"... and {len(failed) - 10} more failed requests")
    problems += shutdown
    if not done:
        problems.append("no request completed")
    if problems:
        log("result       FAILED")
        for p in problems:
            log("  - " + p)
        return 1
    log("result       PASSED: every request completed, equal to connex-generate; every kill "
        "ridden out")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
