"""The judge's side of one kernel: start it in the sandbox, run cells, call student code.

A :class:`Session` owns one kernel process (:mod:`.student_side`, started by :mod:`.sandbox`) and
its two pipes. Every request has a deadline; a kernel that does not answer by then, dies,
or sends something that is not a well-formed frame is killed, and the session says why
(:attr:`Session.lost`): the judge then starts a fresh one and replays the notebook.

While the kernel runs a call, it may ask for the judge's objects that the call was given
(``cb`` requests); :class:`~.exposure.Exposed` decides what it may do with them.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from ..student_side import wire
from . import sandbox, withheld
from .context import wall_backstop
from .exposure import MAX_REQUESTS_PER_CHECK, Exposed
from .interrupts import KernelLost

__all__ = ["KernelGone", "RemoteTimeout", "Session"]

_GRACE_S = 5.0  # how long past its own time limit a kernel may take to answer
_START_S = 90.0  # kernel start-up (imports torch and IPython) on a busy machine


class KernelGone(KernelLost):
    """The kernel died, hung past its deadline or broke the channel; it has been killed.

    A BaseException, so that a check's ``except Exception:`` does not take it for the
    student's error."""

    def __init__(self, why: str, status: str = "crashed", limit: str = ""):
        BaseException.__init__(self, why)
        self.why = why
        self.status = status  # "crashed" or "timeout"
        self.limit = limit  # "memory": the memory cap killed it


class RemoteTimeout(Exception):
    """The kernel stopped the call at its time limit (the kernel itself is fine)."""


class Session:
    """One kernel for one submission (restartable: :meth:`start` again after a loss)."""

    def __init__(
        self,
        plan: sandbox.Plan,
        *,
        tag: str,
        memory_mb: int,
        limits: dict[str, int],
        notebook_name: str,
        notebook_text: str,
        withhold: tuple[str, tuple[str, ...]] = ("", ()),
    ):
        self.plan = plan
        self.tag = tag
        self.memory_mb = memory_mb
        self.limits = limits
        self.notebook = (notebook_name, notebook_text)
        self.proc: sandbox.Started | None = None
        self.lost: KernelGone | None = None
        self.exposed = Exposed()
        self.starts = 0
        self.withhold = withhold  # (exercise, the package's functions its sandbox lacks)
        self.withheld_called: set[str] = set()  # those a call or a cell raised from
        self.judge_memory = False  # the judge's work for it passed the judge's memory cap

    # ---- life

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.lost is None

    def start(self) -> None:
        """Start a fresh kernel (killing the old one). Raises :class:`KernelGone`."""
        self.stop()
        self.lost = None
        self.starts += 1
        try:
            self.proc = sandbox.start(
                self.plan,
                f"{self.tag}-{self.starts}",
                self.memory_mb,
                pids_max=256,
                withhold=self.withhold,
            )
        except OSError as e:
            raise self._gone(f"the kernel could not start: {e}") from e
        reply, _ = self._request(
            {
                "op": "hello",
                "sandboxed": self.plan.mode == "bwrap",
                "limits": self.limits,
                "notebook_name": self.notebook[0],
                "notebook": self.notebook[1],
            },
            [],
            _START_S,
        )
        if not reply.get("ok"):
            raise self._gone("the kernel did not start")
        if self.plan.own_uid and reply.get("uid") in (0, None):
            # (Said before any student code ran: the kernel's word is still its own.)
            raise self._gone("the kernel did not leave root, so its process limit would not bind")

    def stop(self) -> None:
        """Kill the kernel and everything it started (idempotent)."""
        if self.proc is not None:
            self.proc.stop()
            self.proc = None
        self.exposed.clear()

    def _gone(self, why: str, status: str = "crashed", limit: str = "") -> KernelGone:
        self.lost = KernelGone(why, status, limit)
        self.stop()
        return self.lost

    # ---- the channel

    def cpu_seconds(self) -> float | None:
        """CPU seconds used by the kernel and everything it started (its cgroup's count),
        ``None`` where that cannot be read (no cgroup, no kernel)."""
        if self.proc is None or self.proc.cgroup is None:
            return None
        return self.proc.cgroup.cpu_seconds()

    def _request(self, header: dict, blobs: list[bytes], seconds: float) -> tuple[dict, Any]:
        if not self.alive:
            raise self.lost or KernelGone("no kernel")
        deadline = time.monotonic() + seconds
        # Every answer must carry this request's token: a frame that student code wrote into
        # the channel (without it, or with an old one) is dropped, not taken as an answer.
        header["t"] = token = secrets.token_hex(8)
        dropped = 0
        try:
            wire.write_frame(self.proc.to_kernel, header, blobs, deadline)
            while True:
                reply, blob = wire.read_frame(self.proc.from_kernel, deadline)
                if reply.get("t") != token:
                    dropped += 1
                    if dropped > 1000:
                        raise wire.WireError("flooded")
                    continue
                if reply.get("op") != "cb":
                    return reply, blob
                self._serve(reply, blob, deadline)
        except TimeoutError:
            raise self._gone(
                "it did not answer in time (it ignored its time limit)", "timeout"
            ) from None
        except (EOFError, OSError):
            cg = self.proc.cgroup if self.proc is not None else None
            why = self._death()
            if cg is not None and cg.oom_kills() > 0:  # (read before stop removes it)
                raise self._gone(
                    f"the memory cap ({self.memory_mb} MiB) killed it", limit="memory"
                ) from None
            raise self._gone(why) from None
        except (wire.WireError, KeyError, TypeError, ValueError, ReferenceError) as e:
            raise self._gone(f"it garbled the grader's channel ({type(e).__name__})") from None

    def _death(self) -> str:
        code = None
        if self.proc is not None:
            try:
                code = self.proc.proc.wait(timeout=2)
            except Exception:  # noqa: BLE001 - still running: it closed its pipes
                code = None
        # A signal shows as -N from the kernel itself, as 128 + N through bubblewrap.
        if code is not None and (code < 0 or code > 128):
            return f"it was killed by signal {-code if code < 0 else code - 128} (out of memory?)"
        return "it died (out of memory, os._exit or a crash)"

    def _serve(self, h: dict, blob, deadline: float) -> None:
        # A request from the kernel about one of the judge's objects. Errors that the judge's
        # object raises (a ValueError from KVCache.crop, say) go back to the student's code.
        live_off = h.get("live_offset", 0)
        if h.get("live"):
            items, _ = wire.decode(h["live"], blob[live_off:], ref=self._resolve_ref)
            self.exposed.write_back(items)
        ref_id = h.get("ref")
        what, name = h.get("what"), h.get("name")
        track = False
        try:
            self.exposed.charge("requests", 1, MAX_REQUESTS_PER_CHECK)
            self.exposed.resolve({"$ref": [ref_id]})
            value, _ = wire.decode(h.get("value"), blob[:live_off], ref=self._resolve_ref)
            if what == "call":
                if not (isinstance(value, tuple) and len(value) == 2):
                    raise TypeError("malformed call")
                result = self.exposed.call(ref_id, tuple(value[0]), value[1])
            elif what == "getattr":
                result, track = self.exposed.getattr(ref_id, str(name))
            elif what == "setattr":
                self.exposed.setattr(ref_id, str(name), value)
                result = None
            else:
                raise TypeError(f"unknown request {what!r}")
            enc, blobs, _ = wire.encode(result, ref=self.exposed.for_results)
            reply = {"op": "cbdone", "value": enc, "track": track}
        except Exception as e:  # noqa: BLE001 - goes back to the student's code
            if isinstance(e, MemoryError):  # the judge's own cap, which the kernel drove to
                self.judge_memory = True
            blobs, reply = [], {"op": "cbdone", "error": wire.error_info(e)}
        live = self.exposed.live_values()
        if live:
            lenc, lblobs, _ = wire.encode(live)
            reply["live"], reply["live_offset"] = lenc, sum(len(b) for b in blobs)
            blobs = blobs + lblobs
        wire.write_frame(self.proc.to_kernel, reply, blobs, deadline)

    def _resolve_ref(self, tag: dict) -> Any:
        return self.exposed.resolve(tag)

    # ---- what the judge asks

    def run_cell(self, source: str, timeout: float, wall: float | None = None) -> dict:
        """Run one cell: ``{"ok", "error", "timeout"}``, stopped after ``timeout`` seconds of
        the kernel's CPU time or ``wall`` seconds (default: :func:`.context.wall_backstop`).
        Raises :class:`KernelGone`."""
        # (A cell that calls a withheld function is only noted: the lessons' demos call the
        # package's tools, some of which use it; a graded call that reaches one is flagged.)
        wall = wall_backstop(timeout) if wall is None else max(float(wall), 0.01)
        reply, _ = self._request(
            {"op": "cell", "source": source, "timeout": timeout, "wall": wall},
            [],
            wall + _GRACE_S,
        )
        return reply

    def _note_withheld(self, error) -> None:
        # The kernel's error text only flags (a student can write it too, and flag only
        # themselves); the points never depend on it.
        found = withheld.named_in(error)
        if found and len(self.withheld_called) < 20:
            self.withheld_called.add(found[0])

    def describe(self, names: list[str]) -> dict[str, dict]:
        """What each name is in the kernel's namespace. Raises :class:`KernelGone`."""
        reply, _ = self._request({"op": "describe", "names": list(names)}, [], 30.0)
        out = reply.get("names")
        return out if isinstance(out, dict) else {}

    def call(
        self,
        target: dict,
        args: tuple,
        kwargs: dict,
        *,
        timeout: float,
        wall: float | None = None,
        seed: tuple[int, int] | None = None,
        repeat: int | None = None,
        student: Any = None,
        inplace: bool = False,
        cache_writes: bool = False,
    ) -> Any:
        """Call a student object (``{"name": n}``) or a probe (``{"probe": name}``) in the
        kernel and return what it returned, as plain data.

        The kernel gets copies: nothing it does to them, or to a generator, reaches the
        judge's objects. ``inplace`` returns ``(value, args)``, the positional arguments as
        the call left them, as new objects (output, for a function whose API writes into its
        arguments). ``student(obj)`` gives the tag for a student object among the arguments.
        Raises the rebuilt student exception, :class:`RemoteTimeout` (the call used
        ``timeout`` seconds of the kernel's CPU, or ``wall`` seconds: by default
        :func:`.context.wall_backstop`) or :class:`KernelGone`. ``cache_writes``: what the
        call writes into the ``k`` and ``v`` of the judge's caches among the arguments comes
        back (:func:`.context.cache_writes`); otherwise it gets copies, and nothing back.
        """

        def ref(obj):
            tag = student(obj) if student is not None else None
            return tag if tag is not None else self.exposed.for_arguments(obj)

        self.exposed.live.clear()
        self.exposed.cache_writes = bool(cache_writes)
        enc, blobs, _ = wire.encode((tuple(args), dict(kwargs)), ref=ref)
        header = {
            "op": "call",
            "target": target,
            "value": enc,
            "timeout": max(0.01, timeout),
            "wall": wall_backstop(timeout) if wall is None else max(0.01, wall),
            "seed": list(seed) if seed else None,
            "repeat": repeat,
            "inplace": bool(inplace),
        }
        reply, blob = self._request(header, blobs, header["wall"] + _GRACE_S)
        if reply.get("timeout"):
            raise RemoteTimeout()
        if "error" in reply:
            self._note_withheld(reply["error"])
            raise wire.rebuild_error(reply["error"])
        try:
            live_off = reply.get("live_offset", 0)
            if reply.get("live"):
                items, _ = wire.decode(reply["live"], blob[live_off:], ref=self._resolve_ref)
                self.exposed.write_back(items)
            got, _ = wire.decode(reply.get("value"), blob[:live_off], ref=self._resolve_ref)
            value, after = got
            if inplace:
                if not (isinstance(after, list) and len(after) == len(args)):
                    raise TypeError("malformed arguments")
                return value, tuple(after)
        except MemoryError:
            self.judge_memory = True
            raise self._gone("what it sent passed the judge's memory cap") from None
        except (wire.WireError, KeyError, TypeError, ValueError, RuntimeError) as e:
            raise self._gone(f"it garbled the grader's channel ({type(e).__name__})") from None
        return value

    def close(self) -> None:
        """Say goodbye and kill the kernel and everything it started."""
        if self.alive:
            try:
                wire.write_frame(self.proc.to_kernel, {"op": "bye"}, [], time.monotonic() + 1)
            except (OSError, wire.WireError, TimeoutError):
                pass
        self.stop()
