"""Where the work units of a ``dyntc reproduce`` run execute: :class:`LocalExecutor` (this process, or
``--jobs N`` local worker processes) or :class:`RayExecutor` (tasks on a Ray cluster, ``--executor ray``).

The driver (:mod:`dyntc.protocol.reproduce`) calls one interface, :class:`Executor`: ``slots`` (how many units run
at once, for the ETA) and ``run`` (every unit, each event reported through :class:`Events`), inside
``with executor:`` (a Ray executor connects there and lets go at the end). :func:`make_executor` is
the one place that maps a name to an executor.

Whatever the executor, the results are those of ``--jobs 1``: a unit takes every seed from
``derive_seed`` and featurizes the texts itself. Local workers merge their cells into ``results.json``
under a file lock. A Ray task runs its unit in a temporary directory on its node and streams back
every finished cell, pretraining record and pretrained weights file; the driver merges them with
:meth:`ProtocolRun.merge_output` (the same merge as a local run's saves), so no shared file system
is needed and results stay on the driver.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue as queue_mod
import re
import signal
import socket
import tempfile
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from dyntc._version import __version__
from dyntc.errors import DyntcError
from dyntc.protocol.plan import RunPlan, cell_key
from dyntc.protocol.run import ProtocolRun, Unit

RAY_INSTALL = "pip install 'dyntc[ray]'"
REMOTE_TRACEBACK_LINES = 12  # of a failed remote unit's traceback, in the driver's error


@dataclass
class Events:
    """What an executor tells the driver (:mod:`dyntc.protocol.reproduce`), always in the driver process."""

    work: Callable[[tuple, float, bool], None]  # (stage, sequences, stage finished): see ProtocolRun.run_unit
    started: Callable[[Unit, str], None]  # a unit began, and where
    done: Callable[[Unit, float, float], None]  # a unit finished: wall and CPU seconds (its results are saved)
    log: Callable[[str], None]  # a line from a worker


class Executor:
    """Runs a run's units. Use as ``with executor:``; then :meth:`slots`, then :meth:`run`."""

    name = "?"
    runs_here = True  # the units run on this machine (so its --device must exist here)

    def header(self, slots: int | None = None) -> dict[str, Any]:
        """Run-level fields for ``results.json``: how this invocation runs its units (`slots` at once,
        once known)."""
        return {"executor": self.name}

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc) -> None:
        return None

    def slots(self, run: ProtocolRun, units: list[Unit]) -> int:
        """How many of `units` run at once (at least 1)."""
        raise NotImplementedError

    def describe(self, slots: int) -> str:
        """Where the units run, for the run's log."""
        raise NotImplementedError

    def run(self, run: ProtocolRun, units: list[Unit], events: Events) -> None:
        """Run `units` (in about this order), their cells saved in `run`'s ``results.json``; raises
        on the first failed unit, naming it (the finished cells stay)."""
        raise NotImplementedError


def make_executor(name: str, *, jobs: int = 1, threads: int = 1, address: str | None = None) -> Executor:
    """The executor `name` (``local`` or ``ray``), checked before any work."""
    kinds: dict[str, Callable[[], Executor]] = {
        "local": lambda: LocalExecutor(jobs, threads),
        "ray": lambda: RayExecutor(threads, address),
    }
    if name not in kinds:
        raise DyntcError(f"unknown --executor {name!r}: choose from {', '.join(kinds)}")
    if address is not None and name != "ray":
        raise DyntcError("--address is the address of a Ray cluster: give it with --executor ray")
    return kinds[name]()


@contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """`kill PID` ends the run as Ctrl-C does (the executor's cleanup runs), where the default action
    would leave its workers running on, orphaned."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _set_threads(threads: int) -> None:
    torch.set_num_threads(threads)  # before any heavy work; the SRU kernels use as many Python threads
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set in this process
        pass


def _batched(send: Callable[[tuple], None], check: Callable[[], None] = lambda: None) -> Callable[[tuple, int, bool], None]:
    """A `report` for :meth:`ProtocolRun.run_unit` that sends ``("work", stage, n, finished)`` at most
    every half second (and at each stage's end); `check` runs before each send (it may stop the unit)."""
    pending: dict[tuple, float] = {}
    last = time.perf_counter()

    def report(stage: tuple, n: int, finished: bool) -> None:
        nonlocal last
        pending[stage] = pending.get(stage, 0.0) + n
        if finished or time.perf_counter() - last > 0.5:
            check()
            for key, value in pending.items():
                send(("work", key, value, finished and key == stage))
            pending.clear()
            last = time.perf_counter()

    return report


# ---- local: this process, or worker processes ------------------------------------------------------


class LocalExecutor(Executor):
    """``--jobs N``: one unit at a time in this process (N = 1), else N spawned worker processes with
    `threads` torch threads each, which merge their cells into ``results.json`` themselves."""

    name = "local"

    def __init__(self, jobs: int = 1, threads: int = 1):
        self.jobs, self.threads = jobs, threads

    def header(self, slots: int | None = None) -> dict[str, Any]:
        return {"executor": self.name, "jobs": self.jobs}

    def slots(self, run: ProtocolRun, units: list[Unit]) -> int:
        return max(1, min(self.jobs, len(units)))

    def describe(self, slots: int) -> str:
        return f"{slots} process(es)"

    def run(self, run: ProtocolRun, units: list[Unit], events: Events) -> None:
        if self.slots(run, units) == 1:
            for unit in units:
                t0, c0 = time.perf_counter(), time.process_time()
                events.started(unit, "this process")
                run.run_unit(unit, events.work)
                events.done(unit, time.perf_counter() - t0, time.process_time() - c0)
        else:
            _run_processes(run, units, self.slots(run, units), self.threads, events)


def _worker_main(plan: RunPlan, out: str, threads: int, setup, tasks, messages) -> None:
    """A worker process: its dataset from `setup`, then units from `tasks` until a None, each run and
    reported to the parent on `messages`."""
    _set_threads(threads)
    who = mp.current_process().name
    parent = os.getppid()
    data = setup.get()
    run = ProtocolRun(data, plan, Path(out), progress=False, worker=True, log=lambda msg: messages.put(("log", f"[{who}] {msg}")))

    def parent_alive() -> None:
        if os.getppid() != parent:  # the parent was killed: stop as a killed run would (snapshot kept)
            os._exit(1)

    while (unit := tasks.get()) is not None:
        messages.put(("start", unit.name, who))
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            run.run_unit(unit, _batched(messages.put, parent_alive))
        except BaseException as exc:  # noqa: BLE001 - every failure goes to the parent, named
            messages.put(("error", unit.name, isinstance(exc, DyntcError), f"{type(exc).__name__}: {exc}", traceback.format_exc()))
            return
        messages.put(("done", unit.name, time.perf_counter() - t0, time.process_time() - c0))


def _run_processes(run: ProtocolRun, units: list[Unit], jobs: int, threads: int, events: Events) -> None:
    """`units` in `jobs` spawned processes (fork would copy torch's thread pools and locks mid-use).

    Plain processes and queues rather than a Pool: a worker killed outright (out of memory) is seen
    here and named, where a Pool would wait for its result forever."""
    ctx = mp.get_context("spawn")
    setup, tasks, messages = ctx.Queue(), ctx.Queue(), ctx.Queue()
    # The dataset goes through a queue, not the process arguments: spawn writes those into a pipe and
    # waits while the child imports torch (and forever if the child is killed meanwhile).
    for _ in range(jobs):
        setup.put(run.data)
    for unit in units:
        tasks.put(unit)
    for _ in range(jobs):
        tasks.put(None)
    procs = [ctx.Process(target=_worker_main, name=f"worker {i + 1}", daemon=True,
                         args=(run.plan, str(run.out), threads, setup, tasks, messages)) for i in range(jobs)]
    by_name = {u.name: u for u in units}
    running: dict[str, str] = {}  # worker -> unit
    n_done = 0
    try:
        with _sigterm_interrupts():
            for p in procs:
                p.start()
            while n_done < len(units):
                try:
                    item = messages.get(timeout=0.5)
                except queue_mod.Empty:
                    dead = [p for p in procs if p.exitcode not in (None, 0)]
                    if dead:
                        p = dead[0]
                        unit = running.get(p.name, "no unit yet")
                        raise RuntimeError(f"{p.name} died (exit code {p.exitcode}; a negative code is a signal, -9 often means "
                                           f"out of memory) while running {unit}; finished cells are kept in {run.results_path}: "
                                           f"rerun to resume")
                    if all(p.exitcode is not None for p in procs):
                        raise RuntimeError(f"every worker exited with {len(units) - n_done} unit(s) not done")
                    continue
                kind = item[0]
                if kind == "log":
                    events.log(item[1])
                elif kind == "work":
                    events.work(item[1], item[2], item[3])
                elif kind == "start":
                    running[item[2]] = item[1]
                    events.started(by_name[item[1]], item[2])
                elif kind == "error":
                    _, name, user_error, message, tb = item
                    if user_error:
                        raise DyntcError(f"{name}: {message.split(': ', 1)[-1]}")
                    raise RuntimeError(f"work unit {name} failed in its worker process: {message} (finished cells are kept "
                                       f"in {run.results_path}; rerun to resume)\n\nWorker traceback:\n{tb}")
                elif kind == "done":
                    n_done += 1
                    run.save(header_only=True)  # fetch the workers' rows
                    events.done(by_name[item[1]], item[2], item[3])
            for p in procs:
                p.join(timeout=30)
    finally:
        for p in procs:  # on an error or Ctrl-C: stop the other units now (their finished cells are saved)
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=10)


# ---- Ray: tasks on a cluster -------------------------------------------------------------------------


def _import_ray():
    try:
        import ray
    except ImportError as exc:
        raise DyntcError(f"--executor ray needs Ray, which is not installed here ({exc}): {RAY_INSTALL} "
                         f"(on every machine of the cluster)") from None
    return ray


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _last_lines(text: str, n: int = REMOTE_TRACEBACK_LINES) -> str:
    return "\n".join(_ANSI.sub("", text).rstrip().splitlines()[-n:])


def unit_files(out: Path, unit: Unit) -> dict[str, bytes]:
    """What a unit may resume from in run directory `out`: its model's pretrained weights on its split
    and the snapshots of its stages (``checkpoints/``), as paths relative to `out` and contents."""
    folder = out / "checkpoints" / f"split{unit.split}"
    names = [f"{unit.model}.safetensors", f"{unit.model}.json"]
    paths = [folder / n for n in names] + sorted(folder.glob(f"{unit.model}-*.partial.pt"))
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in paths if p.is_file()}


class _Cancelled(BaseException):
    """The driver stopped listening: the unit stops at its next progress report."""


def _remote_unit(plan: RunPlan, header: dict, unit: Unit, files: dict[str, bytes], data, embeddings: bytes | None,
                 threads: int, snapshot_every: float) -> Iterator[tuple]:
    """A Ray task (a streaming generator): `unit` in a temporary run directory holding the driver's
    results header and the unit's `files`; yields ``("hello", ...)``, then the unit's events as they
    come: ``("log", line)``, ``("work", ...)``, ``("output", {...})`` (new rows, records, the files it
    wrote under ``checkpoints/``: see :meth:`ProtocolRun.merge_output`), and at last ``("done", wall,
    cpu)`` or ``("error", ...)``. Stage snapshots go to the driver at most every `snapshot_every`
    seconds, so that a run stopped mid-stage resumes it from there, on any machine."""
    import json

    _set_threads(threads)
    host = socket.gethostname()
    yield ("hello", __version__, torch.__version__, host)
    messages: queue_mod.Queue = queue_mod.Queue()
    stop = threading.Event()
    with tempfile.TemporaryDirectory(prefix="dyntc-unit-") as tmp:
        out = Path(tmp) / "run"
        for rel, content in files.items():
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            (out / rel).write_bytes(content)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(header), encoding="utf-8")
        if embeddings is not None:  # the driver's --embeddings file (not in the fingerprint; the vocabulary digest guards it)
            path = Path(tmp) / "embeddings.txt"
            path.write_bytes(embeddings)
            plan = replace(plan, embeddings=str(path))
        folder = out / "checkpoints" / f"split{unit.split}"

        def unit_paths() -> list[Path]:
            return [folder / f"{unit.model}.safetensors", folder / f"{unit.model}.json",
                    *sorted(folder.glob(f"{unit.model}-*.partial.pt"))]

        seen = {path: _stat(path) for path in unit_paths()}
        state: dict[str, Any] = {"rows": set(), "record": None, "split_info": None, "vocabulary": None,
                                 "synced": time.perf_counter()}

        def changed_files() -> dict[str, bytes]:
            """The unit's files under checkpoints/ written since they were last sent (all atomically
            replaced, so each is read whole)."""
            changed = {}
            for path in unit_paths():
                stat = _stat(path)
                if stat is not None and stat != seen.get(path):
                    seen[path] = stat
                    changed[path.relative_to(out).as_posix()] = path.read_bytes()
            state["synced"] = time.perf_counter()
            return changed

        def check() -> None:
            if stop.is_set():
                raise _Cancelled()
            if time.perf_counter() - state["synced"] >= snapshot_every:
                changed = changed_files()
                if changed:
                    messages.put(("output", {"files": changed}))

        def send_output(run: ProtocolRun) -> None:
            """What changed since the last send: files written (weights before the record that names
            them), new rows, the unit's pretraining record, the split's info, the vocabulary."""
            results, s = run.results, str(unit.split)
            output: dict[str, Any] = {"files": changed_files()}
            rows = [r for r in results["rows"] if cell_key(r["model"], r["variant"], r["n_fine"], r["split"]) not in state["rows"]
                    and (r["split"], r["model"]) == (unit.split, unit.model)]
            state["rows"] |= {cell_key(r["model"], r["variant"], r["n_fine"], r["split"]) for r in rows}
            if rows:
                output["rows"] = rows
            record = (results.get("pretraining") or {}).get(s, {}).get(unit.model)
            if record is not None and record != state["record"]:
                state["record"] = record
                output["pretraining"] = {s: {unit.model: record}}
            split_info = (results.get("split_info") or {}).get(s)
            if split_info is not None and split_info != state["split_info"]:
                state["split_info"] = dict(split_info)
                output["split_info"] = {s: split_info}
            if results.get("vocabulary") is not None and results["vocabulary"] != state["vocabulary"]:
                state["vocabulary"] = output["vocabulary"] = results["vocabulary"]
            if output["files"] or len(output) > 1:
                messages.put(("output", output))

        def work() -> None:
            t0, c0 = time.perf_counter(), time.process_time()
            run = None
            try:
                run = ProtocolRun(data, plan, out, progress=False, worker=True, log=lambda msg: messages.put(("log", msg)))
                run.on_save = lambda: send_output(run)
                run.run_unit(unit, _batched(messages.put, check))
                send_output(run)
                messages.put(("done", time.perf_counter() - t0, time.process_time() - c0))
            except _Cancelled:
                pass
            except BaseException as exc:  # noqa: BLE001 - every failure goes to the driver, named there
                if run is not None:
                    try:
                        send_output(run)  # e.g. the weights of a pretraining that finished before the failure
                    except Exception:  # noqa: BLE001 - the failure itself matters more
                        pass
                messages.put(("error", isinstance(exc, DyntcError), f"{type(exc).__name__}: {exc}", traceback.format_exc()))
            finally:
                messages.put(None)

        thread = threading.Thread(target=work, name=f"dyntc {unit.name}", daemon=True)
        thread.start()
        try:
            while (message := messages.get()) is not None:
                yield message
        finally:
            stop.set()  # the driver cancelled the task: the unit stops at its next progress report
            thread.join()


def _check_reachable(address: str, timeout: float = 10.0) -> None:
    """A HOST:PORT address must answer: Ray itself would retry a dead one for many minutes."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "://" in address:
        return  # "auto", "local", a ray:// address: Ray's own rules
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as exc:
        raise DyntcError(f"nothing answers at the Ray cluster address {address} ({exc.strerror or exc}): start the "
                         f"cluster's head there (ray start --head) or give the address it printed; docs/cluster.md") from None


def _stat(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_size, st.st_mtime_ns


class RayExecutor(Executor):
    """``--executor ray [--address ADDR]``: each unit a Ray task needing `threads` CPUs (and one GPU
    when the run's device is CUDA). Without an address (nor ``RAY_ADDRESS``), a local Ray instance is
    started for the run (``--address auto``: the cluster ``ray start`` started on this machine); a
    process already connected to Ray uses its connection. Code (the same dyntc and torch versions,
    checked) must be installed on every node; the dataset and an ``--embeddings`` file travel with
    the tasks; checkpoints and cells come back to the driver, which alone writes the run directory."""

    name = "ray"
    runs_here = False
    snapshot_every_s = 30.0  # a running stage's snapshot goes to the driver at most this often

    def __init__(self, threads: int = 1, address: str | None = None):
        self.ray = _import_ray()
        self.threads, self.address = threads, address
        self._started = False

    def header(self, slots: int | None = None) -> dict[str, Any]:
        return {"executor": self.name, "ray_address": self.address, **({"jobs": slots} if slots else {})}

    def __enter__(self) -> RayExecutor:
        ray = self.ray
        address = self.address or os.environ.get("RAY_ADDRESS") or None
        if address is not None:
            _check_reachable(address)
        if not ray.is_initialized():  # else: this process's own connection (e.g. a test's local cluster)
            try:
                if address is None:  # a fresh local instance, never a stale cluster file's address
                    ray.init(address="local", include_dashboard=False)
                else:
                    ray.init(address=address)
            except Exception as exc:  # noqa: BLE001 - connection errors of many kinds
                where = f"the Ray cluster at {address}" if address else "a local Ray instance"
                raise DyntcError(f"cannot connect to {where}: {type(exc).__name__}: {exc} (a cluster with token "
                                 f"authentication needs RAY_AUTH_MODE=token and its token here: docs/cluster.md)") from exc
            self._started = True
        return self

    def __exit__(self, *exc) -> None:
        if self._started:
            self.ray.shutdown()
            self._started = False

    def _nodes(self) -> list[dict]:
        return [n.get("Resources", {}) for n in self.ray.nodes() if n.get("Alive")]

    def slots(self, run: ProtocolRun, units: list[Unit]) -> int:
        cuda = run.plan.device.startswith("cuda")
        per_node = [int(r.get("CPU", 0) // self.threads) if not cuda else min(int(r.get("CPU", 0) // self.threads), int(r.get("GPU", 0)))
                    for r in self._nodes()]
        if sum(per_node) == 0:
            need = f"{self.threads} CPU(s)" + (" and a GPU" if cuda else "")
            have = ", ".join(f"{r.get('CPU', 0):g} CPU {r.get('GPU', 0):g} GPU" for r in self._nodes()) or "no nodes"
            raise DyntcError(f"no node of the Ray cluster can run a unit: each needs {need} (--threads {self.threads}, "
                             f"--device {run.plan.device}); the cluster's nodes have {have}")
        return max(1, min(sum(per_node), len(units)))

    def describe(self, slots: int) -> str:
        nodes = self._nodes()
        cpus, gpus = sum(r.get("CPU", 0) for r in nodes), sum(r.get("GPU", 0) for r in nodes)
        where = self.address or "local"
        return (f"Ray tasks on {len(nodes)} node(s) ({cpus:g} CPUs, {gpus:g} GPUs; address {where}), "
                f"{slots} at once")

    def run(self, run: ProtocolRun, units: list[Unit], events: Events) -> None:
        ray = self.ray
        plan = run.plan
        cuda = plan.device.startswith("cuda")
        header = {**run.results, "rows": []}  # the worker needs the header (fingerprint, vocabulary), not the cells
        data = ray.put(run.data)
        embeddings = ray.put(Path(plan.embeddings).read_bytes()) if plan.embeddings else None
        task = ray.remote(_remote_unit)
        pending = {}
        for unit in units:
            # no retries: a unit whose worker died is named, and a rerun resumes it
            ref = task.options(num_cpus=self.threads, num_gpus=1 if cuda else 0, max_retries=0, name=f"dyntc {unit.name}").remote(
                plan, header, unit, unit_files(run.out, unit), data, embeddings, self.threads, self.snapshot_every_s)
            pending[ref] = unit
        hosts: dict[str, str] = {}
        try:
            with _sigterm_interrupts():
                while pending:
                    ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
                    for gen in ready:
                        unit = pending[gen]
                        try:
                            message = ray.get(next(gen))
                        except StopIteration:
                            del pending[gen]
                            continue
                        except ray.exceptions.RayError as exc:
                            where = f" on {hosts[unit.name]}" if unit.name in hosts else ""
                            text = str(exc)
                            hint = ("; is the same dyntc installed on every node? (docs/cluster.md)"
                                    if "failed to import" in text or "ModuleNotFoundError" in text else "")
                            raise RuntimeError(
                                f"work unit {unit.name} failed on the Ray cluster{where}: {type(exc).__name__}{hint} (finished "
                                f"cells are kept in {run.results_path}; rerun to resume)\n\nRemote error (last lines):\n"
                                f"{_last_lines(text)}") from None
                        self._handle(run, unit, message, hosts, events)
        finally:
            for gen in pending:  # on an error or Ctrl-C: stop the other units (their finished cells are saved)
                try:
                    ray.cancel(gen, force=True)
                except Exception:  # noqa: BLE001 - finished meanwhile, or the cluster is gone
                    pass

    def _handle(self, run: ProtocolRun, unit: Unit, message: tuple, hosts: dict[str, str], events: Events) -> None:
        kind = message[0]
        host = hosts.get(unit.name, "?")
        if kind == "hello":
            _, version, torch_version, host = message
            if (version, torch_version) != (__version__, torch.__version__):
                raise DyntcError(f"node {host} of the Ray cluster runs dyntc {version} with torch {torch_version}, this "
                                 f"machine dyntc {__version__} with torch {torch.__version__}: install the same versions on "
                                 f"every node (results of different code must not mix in one run)")
            hosts[unit.name] = host
            events.started(unit, host)
        elif kind == "log":
            events.log(f"[{host}] {message[1]}")
        elif kind == "work":
            events.work(message[1], message[2], message[3])
        elif kind == "output":
            run.merge_output(message[1], source=f"node {host}")
        elif kind == "done":
            events.done(unit, message[1], message[2])
        elif kind == "error":
            _, user_error, text, tb = message
            if user_error:
                raise DyntcError(f"{unit.name}: {text.split(': ', 1)[-1]}")
            raise RuntimeError(f"work unit {unit.name} failed on Ray node {host}: {text} (finished cells are kept in "
                               f"{run.results_path}; rerun to resume)\n\nRemote traceback (last lines):\n{_last_lines(tb)}")


__all__ = ["Events", "Executor", "LocalExecutor", "RAY_INSTALL", "RayExecutor", "make_executor", "unit_files"]
