"""The kernel: runs one submission's cells inside the sandbox and answers the judge's calls.

Started by the judge as ``python -I -m specdec_grader.student_side`` with two pipes whose
numbers ``SPECDEC_KERNEL_FDS`` gives (requests in, answers out); stdout and stderr go
nowhere. Everything here runs beside student code and is trusted by nobody: the judge treats
every answer as something the student's code produced, validates it, and decides every
verdict itself.

Requests (:mod:`.wire` frames): ``hello`` (limits), ``cell`` (run code with a time limit),
``describe`` (what the needed names are), ``call`` (a student function, or a probe of
:mod:`.probes` applied to student objects, on arguments the judge chose), ``bye``. Nothing
the call does to its arguments goes back, unless the judge asks for them as output.
While a call runs, the judge's objects that it passed (models, caches, callbacks) are
:class:`JudgeRef` stand-ins whose use goes back to the judge as a ``cb`` request.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import sys
import time
from typing import Any

import numpy as np
import torch

from . import wire
from .probes import PROBES


class _Timeout(BaseException):
    # BaseException, so that a student's `except Exception:` does not swallow it.
    pass


def _on_alarm(signum, frame):
    raise _Timeout()


@contextlib.contextmanager
def _no_alarm():
    # The channel is never left half-read: an alarm waits until the frame is through.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM, signal.SIGPROF})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGALRM, signal.SIGPROF})


def _arm(h: dict) -> None:
    # The time limit counts this process's CPU time (``timeout``: a busy machine slows the
    # call, it does not use its time up); ``wall`` is the backstop for code that waits.
    cpu = max(0.01, float(h.get("timeout", 60)))
    wall = max(cpu, float(h.get("wall") or cpu))
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.signal(signal.SIGPROF, _on_alarm)
    signal.setitimer(signal.ITIMER_PROF, cpu)
    signal.setitimer(signal.ITIMER_REAL, wall)


def _disarm() -> None:
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.setitimer(signal.ITIMER_PROF, 0)


def _raise_from_judge(info: dict) -> None:
    # An error the judge's object raised (KVCache.crop's ValueError, say), raised here again
    # for the student's code to see: a builtin type if it was one, else RuntimeError.
    import builtins

    name = info.get("type", "RuntimeError")
    cls = getattr(builtins, name, None) if isinstance(name, str) else None
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        cls = RuntimeError
    raise cls(str(info.get("message", "")))


# --------------------------------------------------------------------------- stand-ins


class JudgeRef:
    """An object of the judge's (a model, a cache, a callback), used through the channel.

    Calls, attribute reads and ``cache.length = n`` go to the judge, which does them on its
    own object and answers; tensors come back as copies (a cache's ``k`` and ``v`` are kept
    in step both ways).
    """

    __slots__ = ("_sd_id", "_sd_type", "_sd_agent")

    def __init__(self, agent: _Agent, ref_id: int, type_name: str):
        object.__setattr__(self, "_sd_id", ref_id)
        object.__setattr__(self, "_sd_type", type_name)
        object.__setattr__(self, "_sd_agent", agent)

    def __call__(self, *args, **kwargs):
        return self._sd_agent.callback(self._sd_id, "call", "", (args, kwargs))

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._sd_agent.callback(self._sd_id, "getattr", name, None)

    def __setattr__(self, name: str, value) -> None:
        self._sd_agent.callback(self._sd_id, "setattr", name, value)

    def __repr__(self) -> str:
        return f"<the grader's {self._sd_type}>"


# --------------------------------------------------------------------------- the agent


class _Agent:
    def __init__(self, in_fd: int, out_fd: int):
        self.in_fd, self.out_fd = in_fd, out_fd
        self.token = None
        self.pid = os.getpid()
        self.sandboxed = False
        self.refs: dict[int, JudgeRef] = {}
        self.live: dict[tuple[int, str], list] = {}  # (ref, attr) -> [tensor, snapshot]
        self.seed_block: Any = None
        self.shell = None
        self.last_error: dict | None = None

    # ---- channel

    def send(self, header: dict, blobs: list[bytes] = ()) -> None:
        header["t"] = self.token  # the request this belongs to (the judge drops the rest)
        with _no_alarm():
            wire.write_frame(self.out_fd, header, blobs)

    def recv(self) -> tuple[dict, memoryview]:
        with _no_alarm():
            return wire.read_frame(self.in_fd)

    def encode(self, value) -> tuple[Any, list[bytes], list]:
        try:
            return wire.encode(value, ref=self._ref_id)
        except wire.WireError as e:
            return wire.encode(wire.Opaque(f"value the grader cannot receive ({e})"))

    def _ref_id(self, obj):
        if type(obj) is JudgeRef:
            return {"$ref": [object.__getattribute__(obj, "_sd_id"), "object"]}
        return None

    def decode(self, value, blob):
        def resolve(tag):
            if "$ref" in tag:
                ref_id, type_name = tag["$ref"]
                if not isinstance(ref_id, int):
                    raise wire.WireError("bad reference")
                if ref_id not in self.refs:
                    self.refs[ref_id] = JudgeRef(self, ref_id, str(type_name))
                return self.refs[ref_id]
            return self.shell.user_ns[tag["$student"]]

        return wire.decode(value, blob, ref=resolve)

    # ---- live tensors of the judge's caches

    def _live_out(self) -> tuple[list, list[bytes]]:
        changed = []
        for (ref_id, name), entry in self.live.items():
            t, snap = entry
            if t.shape != snap.shape or not torch.equal(t, snap):
                changed.append([ref_id, name, t])
                entry[1] = t.clone()
        if not changed:
            return [], []
        enc, blobs, _ = wire.encode(changed)
        return enc, blobs

    def _live_in(self, items) -> None:
        for ref_id, name, value in items or ():
            entry = self.live.get((ref_id, name))
            if entry is None:
                self.live[(ref_id, name)] = [value, value.clone()]
                continue
            t = entry[0]
            with torch.no_grad():
                if t.shape == value.shape and t.dtype == value.dtype:
                    t.copy_(value)
                else:
                    t.set_(value)
            entry[1] = value.clone()

    def callback(self, ref_id: int, what: str, name: str, value):
        live, live_blobs = self._live_out()
        enc, blobs, _ = self.encode(value)
        blob_off = sum(len(b) for b in blobs)
        # Two values share one frame: the live tensors' blobs follow the argument's.
        self.send(
            {
                "op": "cb",
                "ref": ref_id,
                "what": what,
                "name": name,
                "value": enc,
                "live": live,
                "live_offset": blob_off,
            },
            blobs + live_blobs,
        )
        header, blob = self.recv()
        if header.get("op") != "cbdone":
            raise RuntimeError("the grader's channel is out of step")
        if header.get("live"):
            items, _ = self.decode(header["live"], blob[header.get("live_offset", 0) :])
            self._live_in(items)
        if "error" in header:
            _raise_from_judge(header["error"])
        result, _ = self.decode(header.get("value"), blob)
        if header.get("track"):
            self.live[(ref_id, name)] = [result, result.clone()]
        return result

    # ---- requests

    def hello(self, h: dict) -> dict:
        self.sandboxed = bool(h.get("sandboxed"))
        limits = dict(h.get("limits") or {})
        if not self.sandboxed and isinstance(limits.get("nproc"), int):
            # Without a user namespace of its own, RLIMIT_NPROC counts every process of this
            # user, the grader's included: allow that many more.
            limits["nproc"] += _tasks_of_this_user()
        _set_limits(limits)
        name = h.get("notebook_name")
        if isinstance(name, str) and re.fullmatch(r"[\w.-]{1,100}", name):
            with contextlib.suppress(OSError), open(name, "w", encoding="utf-8") as f:
                f.write(str(h.get("notebook", "")))
        # Before any student code: the judge checks that a kernel meant to leave root did.
        return {"ok": True, "uid": os.getuid()}

    def cell(self, h: dict) -> dict:
        self.last_error = None
        timed_out = False
        _arm(h)
        try:
            self.shell.run_cell(str(h.get("source", "")), store_history=False)
        except _Timeout:
            timed_out = True
        finally:
            _disarm()
        self._after()
        err = self.last_error
        self.last_error = None
        if err is not None and err["type"] == "_Timeout":
            timed_out, err = True, None
        return {"ok": err is None and not timed_out, "error": err, "timeout": timed_out}

    def describe(self, h: dict) -> dict:
        out = {}
        ns = self.shell.user_ns
        for name in h.get("names", []):
            if not isinstance(name, str) or name not in ns:
                out[str(name)] = {"defined": False}
                continue
            obj = ns[name]
            info: dict[str, Any] = {"defined": True}
            with contextlib.suppress(Exception):
                info["callable"] = bool(callable(obj))
            with contextlib.suppress(Exception):
                info["type"] = str(type(obj).__name__)[:80]
            with contextlib.suppress(Exception):
                info["module"] = str(getattr(obj, "__module__", "") or "")[:200]
            with contextlib.suppress(Exception):
                info["file"] = str(obj.__code__.co_filename)[:300]
            out[name] = info
        return {"names": out}

    def call(self, h: dict, blob) -> tuple[dict, list[bytes]]:
        target = h.get("target", {})
        seed = h.get("seed")
        if seed and seed != self.seed_block:
            self.seed_block = seed
            torch.manual_seed(int(seed[0]))
            np.random.seed(int(seed[0]) % 2**32)
            random.seed(int(seed[0]))
        _arm(h)
        try:
            (args, kwargs), _ = self.decode(h.get("value"), blob)
            if "probe" in target:
                fn = PROBES[str(target["probe"])]
            else:
                fn = self.shell.user_ns[target["name"]]
            repeat = h.get("repeat")
            if repeat is None:
                value = fn(*args, **kwargs)
            else:
                value = [fn(*args, **kwargs) for _ in range(int(repeat))]
            # The arguments as the call left them, only where the check reads in-place output
            # (ex03's K and V): the judge takes them as output, never into its own values.
            reply_value = [value, list(args) if h.get("inplace") else None]
        except _Timeout:
            _disarm()
            self._after()
            return {"op": "done", "timeout": True}, []
        except BaseException as e:  # noqa: BLE001 - the student's exception, for the judge
            _disarm()
            info = wire.error_info(e)
            self._after()
            return {"op": "done", "error": info}, []
        finally:
            _disarm()
        live, live_blobs = self._live_out()
        enc, blobs, _ = self.encode(reply_value)
        self._after()
        off = sum(len(b) for b in blobs)
        return {"op": "done", "value": enc, "live": live, "live_offset": off}, blobs + live_blobs

    def _after(self) -> None:
        if os.getpid() != self.pid:
            os._exit(0)  # a process the student forked, back in the kernel's loop
        if self.sandboxed:
            _kill_the_rest()

    def serve(self) -> None:
        while True:
            try:
                header, blob = self.recv()
            except (EOFError, OSError, wire.WireError):
                return
            op = header.get("op")
            self.token = header.get("t")
            self.live.clear()  # the judge's caches are kept in step within one call only
            try:
                if op == "hello":
                    self.send(self.hello(header))
                elif op == "cell":
                    self.send(self.cell(header))
                elif op == "describe":
                    self.send(self.describe(header))
                elif op == "call":
                    self.send(*self.call(header, blob))
                elif op == "bye":
                    return
                else:
                    self.send({"op": "done", "error": {"type": "ValueError", "message": op}})
            except (OSError, wire.WireError):
                return


def _kill_the_rest() -> None:
    # In the sandbox's own PID namespace, kill(-1) reaches every process but this one and
    # the namespace's init: whatever a cell started (daemons, a fork bomb) ends with it.
    for _ in range(50):
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            return
        except OSError:
            return
        with contextlib.suppress(ChildProcessError, OSError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        time.sleep(0.002)


def _tasks_of_this_user() -> int:
    uid, n = os.getuid(), 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    n += len(os.listdir(f"/proc/{entry}/task"))
    return n


def _set_limits(limits: dict) -> None:
    import resource

    table = {
        "as": resource.RLIMIT_AS,
        "nproc": resource.RLIMIT_NPROC,
        "fsize": resource.RLIMIT_FSIZE,
        "nofile": resource.RLIMIT_NOFILE,
    }
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    for key, res in table.items():
        v = limits.get(key)
        if isinstance(v, int) and v > 0:
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(res, (v, v))
    cpu = limits.get("cpu")
    if isinstance(cpu, int) and cpu > 0:
        # SIGXCPU at the soft limit, SIGKILL at the hard one.
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))


def _make_shell(agent: _Agent):
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    cfg = Config()
    cfg.HistoryManager.enabled = False
    cfg.InteractiveShell.colors = "nocolor"
    shell = InteractiveShell.instance(config=cfg)

    def record(*args, **kwargs):
        # Instead of IPython's traceback formatting: a runaway recursion's traceback would
        # take minutes to format. The error, its message and the cell line are enough.
        etype, value, tb = sys.exc_info()
        if value is not None:
            value.__traceback__ = tb
            agent.last_error = wire.error_info(value)
        sys.last_type = sys.last_value = sys.last_traceback = None

    shell.ask_exit = lambda: None  # exit() in a cell: the notebook goes on, as graded
    shell.showtraceback = record
    shell.showsyntaxerror = record
    shell.showindentationerror = record
    return shell


def main() -> None:
    """Serve the judge on the two pipes until it says ``bye`` or closes the channel."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    in_fd, out_fd = (int(x) for x in os.environ.pop("SPECDEC_KERNEL_FDS").split(","))
    agent = _Agent(in_fd, out_fd)
    agent.shell = _make_shell(agent)
    agent.serve()
    os._exit(0)


if __name__ == "__main__":
    main()
