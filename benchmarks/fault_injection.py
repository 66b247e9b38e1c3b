"""Fault injection against a real store: kills, Ctrl-C, corrupt lines and concurrent writers, counted.

kills       a real `resaware tune` killed with SIGKILL (process group, workers too) at random moments,
            then rerun; every whole record line written before a kill must be there at the end
ctrl-c      SIGINT to the tuner's process group: it must exit 130 after its batch, cost model saved
corruption  damaged lines of every kind written into a copy of the store: every good record must load
            and every damaged line be set aside (blank lines are dropped: they hold nothing)
writers     processes appending to one budget at once through the records lock: all must load

  python benchmarks/fault_injection.py [--model zoo:squeezenet] [--kills 5] [--trials 96] [--seed 0]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import add_output_args, output_dir, write
from resaware.store import Store

WRITER = """
import sys
from tvm.s_tir.meta_schedule.database import TuningRecord
from resaware.store import Slot
slot = Slot.open(sys.argv[1])
database = slot.shared_database()
base = list(slot.database().get_all_tuning_records())[0]
for i in range(int(sys.argv[3])):
    secs = [1e-3 * int(sys.argv[2]) + 1e-7 * i]
    database.commit_tuning_record(TuningRecord(base.trace, base.workload, secs, base.target, base.args_info))
"""


SHAPES: list[str] = []  # --shape arguments for the tuner, from the command line


def tune_command(model: str, store: Path, trials: int) -> list[str]:
    return [sys.executable, "-m", "resaware.cli", "tune", model, *SHAPES, "--budgets", "50%", "--trials", str(trials),
            "--store", str(store), "--no-progress"]  # fmt: skip


def record_file(store: Path) -> Path | None:
    found = list(store.glob("*/llvm/*/database_tuning_record.json"))
    return found[0] if found else None


def whole_lines(path: Path | None) -> list[str]:
    """Lines that reached their newline (what a reader may count on)."""
    if path is None or not path.exists():
        return []
    return [line for line in path.read_text(errors="replace").split("\n")[:-1] if line.strip()]


def start_and_wait(model, store, trials, more: int):
    """Start a tuner and return it once `more` records beyond the current ones are whole."""
    have = len(whole_lines(record_file(store)))
    tuner = subprocess.Popen(tune_command(model, store, trials), stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    while len(whole_lines(record_file(store))) < have + more:
        if tuner.poll() is not None:
            raise SystemExit(f"the tuner ended before the fault: {tuner.stderr.read()[-500:]}")
        time.sleep(0.05)
    return tuner


def kills(model, store, trials, count, rng) -> list[dict]:
    rows = []
    for _ in range(count):
        tuner = start_and_wait(model, store, trials, rng.randint(1, 8))
        time.sleep(rng.uniform(0, 2.0))  # anywhere in a batch: searching, building, measuring, appending
        before = whole_lines(record_file(store))
        raw = record_file(store).read_bytes()
        os.killpg(tuner.pid, signal.SIGKILL)
        tuner.wait()
        after_kill = whole_lines(record_file(store))
        loaded = len(next(iter(Store.open(store).slots())).database())  # sets aside a cut line
        kept = whole_lines(record_file(store))
        rows.append({"whole_before": len(before), "cut_line": not raw.endswith(b"\n"),
                     "written_after_snapshot": len(after_kill) - len(before), "loaded": loaded,
                     "lost": len(set(after_kill) - set(kept))})  # fmt: skip
    return rows


def ctrl_c(model, store, trials, count, rng) -> list[dict]:
    rows = []
    for _ in range(count):
        tuner = start_and_wait(model, store, trials, rng.randint(1, 8))
        before = whole_lines(record_file(store))
        asked = time.monotonic()
        os.killpg(tuner.pid, signal.SIGINT)
        _, err = tuner.communicate(timeout=600)
        kept = whole_lines(record_file(store))
        rows.append({"exit_code": tuner.returncode, "stop_s": round(time.monotonic() - asked, 1),
                     "lost": len(set(before) - set(kept)), "added_after_ctrl_c": len(kept) - len(before),
                     "traceback": "Traceback" in err})  # fmt: skip
    return rows


def corruption(store: Path, work: Path) -> dict:
    copy = shutil.copytree(store, work / "corrupt")
    path = record_file(copy)
    good = whole_lines(path)
    damaged_lines = ["not json at all", '{"an": "object"}', "null", "[0]", "[999999, []]",
                     good[0][: len(good[0]) // 3], "[0, [[], [1e-3], {}, []]"]  # fmt: skip
    mixed = []
    for i, line in enumerate(good):
        mixed.append(line)
        if i < len(damaged_lines):
            mixed += ["", damaged_lines[i]]
    path.write_text("\n".join(mixed) + "\n" + good[-1][:50])  # ends cut short, as a kill leaves it
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", f"from resaware.store import Slot; print(len(Slot.open({str(path.parent)!r}).database()))"],
                          capture_output=True, text=True)  # fmt: skip
    corrupt = path.parent / (path.name + ".corrupt")
    return {"good": len(good), "damaged": len(damaged_lines) + 1, "blank": len(damaged_lines),
            "loaded": int(done.stdout.strip().splitlines()[-1]), "set_aside": len(whole_lines(corrupt)),
            "warnings": sum("skipped line" in line for line in done.stderr.splitlines()),
            "load_s": round(time.monotonic() - started, 1)}  # fmt: skip


def writers(store: Path, work: Path, count: int, each: int) -> dict:
    copy = shutil.copytree(store, work / "writers")
    path = record_file(copy)
    before = len(whole_lines(path))
    script = work / "writer.py"
    script.write_text(WRITER)
    started = time.monotonic()
    procs = [subprocess.Popen([sys.executable, str(script), str(path.parent), str(w), str(each)]) for w in range(count)]
    codes = [p.wait() for p in procs]
    loaded = len(next(iter(Store.open(copy).slots())).database())
    return {"processes": count, "each": each, "exit_codes": codes, "expected": before + count * each,
            "loaded": loaded, "wall_s": round(time.monotonic() - started, 1)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="zoo:squeezenet")
    parser.add_argument("--shape", action="append", default=[], help="passed to the tuner, e.g. x=2x3x16x16")
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--interrupts", type=int, default=2)
    parser.add_argument("--trials", type=int, default=96)
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    add_output_args(parser)
    args = parser.parse_args()
    if args.quick:
        args.kills, args.interrupts, args.trials, args.writers = 1, 1, 48, 2
    SHAPES.extend(a for shape in args.shape for a in ("--shape", shape))
    rng = random.Random(args.seed)
    out = output_dir(args)
    with tempfile.TemporaryDirectory(prefix="resaware-faults-") as tmp:
        work = Path(tmp)
        store = work / "store"
        killed = kills(args.model, store, args.trials, args.kills, rng)
        interrupted = ctrl_c(args.model, store, args.trials, args.interrupts, rng)
        final = subprocess.run(tune_command(args.model, store, args.trials), capture_output=True, text=True)
        if final.returncode != 0:
            raise SystemExit(f"the resumed tuner failed: {final.stderr[-500:]}")
        final_lines = whole_lines(record_file(store))
        total = len(final_lines)
        corrupt = corruption(store, work)
        wrote = writers(store, work, args.writers, 50 if args.quick else 300)
    lost = sum(r["lost"] for r in killed) + sum(r["lost"] for r in interrupted)
    lines = [
        f"fault injection on a real store: {args.model} at 50%, {args.trials} trials, seed {args.seed}",
        f"{'fault':<12} {'#':>3}  what happened",
    ]
    for i, r in enumerate(killed):
        lines.append(f"{'SIGKILL':<12} {i + 1:>3}  after {r['whole_before']} whole records; cut line: "
                     f"{'yes' if r['cut_line'] else 'no'}; loaded {r['loaded']}; lost {r['lost']}")  # fmt: skip
    for i, r in enumerate(interrupted):
        lines.append(f"{'Ctrl-C':<12} {i + 1:>3}  exit {r['exit_code']} after {r['stop_s']} s (batch in flight "
                     f"finished: +{r['added_after_ctrl_c']} records); lost {r['lost']}; traceback: {r['traceback']}")  # fmt: skip
    lines.append(f"{'resume':<12} {'':>3}  the same command ran to {total} records (asked {args.trials})")
    lines.append(f"{'corruption':<12} {'':>3}  {corrupt['damaged']} damaged + {corrupt['blank']} blank lines among "
                 f"{corrupt['good']} good: {corrupt['loaded']} loaded, {corrupt['set_aside']} set aside, "
                 f"{corrupt['warnings']} warnings")  # fmt: skip
    lines.append(f"{'writers':<12} {'':>3}  {wrote['processes']} processes x {wrote['each']} records at once: "
                 f"{wrote['loaded']} loaded of {wrote['expected']}")  # fmt: skip
    lines.append(f"records lost in all: {lost}")
    table = "\n".join(lines)
    print(table)
    ok = (lost == 0 and all(r["exit_code"] == 130 and not r["traceback"] for r in interrupted)
          and total >= args.trials and corrupt["loaded"] == corrupt["good"] and corrupt["set_aside"] == corrupt["damaged"]
          and wrote["loaded"] == wrote["expected"])  # fmt: skip
    data = {"model": args.model, "trials": args.trials, "kills": killed, "interrupts": interrupted,
            "final_records": total, "distinct_final_records": len(set(final_lines)), "corruption": corrupt, "writers": wrote,
            "lost": lost, "ok": ok}  # fmt: skip
    write(out, "fault_injection", data, table, "python benchmarks/fault_injection.py " + " ".join(sys.argv[1:]))
    if not ok:
        raise SystemExit("a fault lost or corrupted work (see above)")


if __name__ == "__main__":
    main()
