"""Measuring on other machines through TVM's RPC tracker.

`serve` runs a TVM RPC server confined to one partition of a budget on this machine and registers it
with a tracker under `resaware.<hardware id>.<share key>`; every session it forks inherits the
partition's cores and thread count. A tuner given the tracker waits for servers whose share matches
its budget, builds for their hardware (each answers `resaware.server_info`), measures through
MetaSchedule's RPCRunner on all of them at once, and stores the records under *their* hardware.

A TVM RPC server runs whatever code a client sends it: serve on trusted networks only. It binds to
loopback unless told otherwise.
"""

from __future__ import annotations

import functools
import json
import re
import signal
import sys
import tempfile
import time
from pathlib import Path

from resaware import files
from resaware.budget import Budget, CpuShare
from resaware.errors import ResawareError
from resaware.platform import confine, hardware
from resaware.platform.hardware import Hardware

PREFIX = "resaware"
INFO = "resaware.server_info"
LOCK_DIR = Path(tempfile.gettempdir()) / "resaware-cores"


def key(hw: Hardware, share: CpuShare) -> str:
    """The tracker key servers of this hardware and share register under."""
    return f"{PREFIX}.{hw.id}.{share.key}"


def parse_key(text: str) -> tuple[str, int, int] | None:
    """(hardware id, cores, usable cores) of a resaware server key, else None."""
    found = re.fullmatch(rf"{PREFIX}\.(.+)\.cpu-(\d+)of(\d+)", text)
    return (found[1], int(found[2]), int(found[3])) if found else None


def parse_address(text: str) -> tuple[str, int]:
    """`HOST:PORT` -> (host, port); one clear error otherwise."""
    host, _, port = str(text).rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ResawareError(f"tracker address {text!r} is not HOST:PORT (e.g. 127.0.0.1:9190)")
    return host, int(port)


# ---------------------------------------------------------------- the measuring side


def claim(budget: Budget, partition: int | None) -> tuple[CpuShare, list]:
    """A partition of `budget` no other server on this machine holds: (share, its held core locks).

    Locks are per core, so servers at different budgets cannot overlap either.
    """
    usable = confine.usable_cores()
    share = budget.cpu(usable)
    LOCK_DIR.mkdir(exist_ok=True)
    candidates = [partition] if partition is not None else range(share.max_concurrency)
    for i in candidates:
        part = budget.cpu(usable, i)
        held = []
        for core in part.cores:
            if (lock := files.try_lock(LOCK_DIR / f"core{core}.lock")) is None:
                break
            held.append(lock)
        if len(held) == part.count:
            return part, held
        for lock in held:
            lock.release()
    which = f"partition {partition}" if partition is not None else f"any of its {share.max_concurrency} partitions"
    raise ResawareError(f"budget {budget}: {which} is held by another `resaware serve` here (locks in {LOCK_DIR})")


def _register_info(info: str) -> None:
    """Runs inside the RPC server process: lets tuners ask what they are measuring on."""
    import tvm

    tvm.register_global_func(INFO, lambda: info, override=True)


def serve(budget: Budget, tracker: str, host: str = "127.0.0.1", port: int = 9090,
          partition: int | None = None, stream=sys.stdout) -> None:  # fmt: skip
    """Serve measurements at `budget` until interrupted."""
    from tvm import rpc

    tracker_addr = parse_address(tracker)
    if host not in ("127.0.0.1", "localhost", "::1"):
        print(f"resaware: WARNING: serving on {host}: a TVM RPC server runs any code sent to it. "
              "Use it on trusted networks only.", file=sys.stderr)  # fmt: skip
    hw = hardware.detect()  # before confining: the store keys the whole machine
    share, locks = claim(budget, partition)
    confine.enter(share.cores)  # the server process and every session it forks inherit this
    name = key(hw, share)
    info = json.dumps({"hardware": hw.to_json(), "cores": list(share.cores), "key": name})
    try:
        server = rpc.Server(host=host, port=port, port_end=port + 100, tracker_addr=tracker_addr, key=name,
                            silent=True, server_init_callback=functools.partial(_register_info, info))  # fmt: skip
    except Exception as error:
        raise ResawareError(f"cannot start an RPC server on {host}:{port} ({error})") from None
    print(f"serving budget {budget} on cores {list(share.cores)} at {host}:{server.port}, "
          f"registered with {tracker} as {name}", file=stream, flush=True)  # fmt: skip
    # SIGTERM (a service manager, `kill`) ends the server like Ctrl-C: its process goes with it.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        while server.proc is not None:
            time.sleep(1.0)
    finally:
        server.terminate()
        for handle in locks:
            handle.close()


# ---------------------------------------------------------------- the tuning side


def find_servers(tracker: str, budget: Budget, wait_s: float = 60.0, settle_s: float = 3.0) -> dict[str, int]:
    """Keys of servers whose share realises `budget`, with how many servers each has.

    Waits up to `wait_s` for the first; then until no more arrive for `settle_s`.
    """
    from tvm import rpc

    host, port = parse_address(tracker)
    deadline, found, changed = time.monotonic() + wait_s, {}, time.monotonic()
    while True:
        try:
            summary = rpc.connect_tracker(host, port).summary()
        except Exception as error:
            raise ResawareError(f"no RPC tracker at {tracker} ({error}): start one with "
                                f"`python -m tvm.exec.rpc_tracker --host {host} --port {port}`") from None  # fmt: skip
        now: dict[str, int] = {}
        for server in summary.get("server_info", []):
            name = server["key"].removeprefix("server:")
            parsed = parse_key(name)
            if parsed and budget.core_count(parsed[2]) == parsed[1]:
                now[name] = now.get(name, 0) + 1
        if now != found:
            found, changed = now, time.monotonic()
        if found and time.monotonic() - changed >= settle_s:
            return found
        if time.monotonic() >= deadline:
            if found:
                return found
            raise ResawareError(
                f"no server registered at {tracker} for budget {budget} within {wait_s:.0f} s: start one on each "
                f"measuring machine with `resaware serve --tracker {tracker} --budget {budget}`"
            )
        time.sleep(0.5)


def server_info(tracker: str, name: str, timeout_s: float = 60.0) -> dict:
    """What a server under `name` measures on: its hardware (as `Hardware`) and cores."""
    from tvm import rpc

    host, port = parse_address(tracker)
    session = rpc.connect_tracker(host, port).request(name, session_timeout=timeout_s)
    info = json.loads(session.get_function(INFO)())
    info["hardware"] = Hardware.from_json(info["hardware"])
    return info


def runner(tracker: str, name: str, servers: int, timing):
    """MetaSchedule's RPCRunner over every server under `name`: one candidate in flight per server."""
    from tvm.s_tir.meta_schedule.runner import RPCConfig, RPCRunner

    host, port = parse_address(tracker)
    config = RPCConfig(tracker_host=host, tracker_port=port, tracker_key=name,
                       session_timeout_sec=int(timing.timeout_s))  # fmt: skip
    return RPCRunner(rpc_config=config, evaluator_config=timing.evaluator(), max_workers=servers)
