"""Does a class's batch hold with a memory bomb and a sleep bomb in it? Issue 54's bar, timed.

    python tools/bomb_batch.py                 # 30 honest notebooks, 2 workers, cell wall 30 s
    BOMB_HONEST=10 BOMB_CELL_WALL=20 python tools/bomb_batch.py

Grades ``BOMB_HONEST`` (30) honest notebooks (ex01's solution, definitions only, each with its
own metadata so no two are byte-identical) with ``batch.grade`` on 2 workers in the sandbox,
then the same 30 with two bombs among them: a cell that sleeps for an hour (stopped by the
cell's wall limit, ``BOMB_CELL_WALL`` seconds) and one that allocates 5 GB (stopped by the
2 GiB memory cap). Prints both wall-clock times, the bar (with bombs at most the wall limit
plus 1.1 times the time without), each bomb's status and the limit it names, and whether the
30 honest scores are the same in both runs. Wall clock; the machine may be shared, so a
single run is one sample.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from graded_class import MODE, ex01_defs  # noqa: E402

from specdec_grader.judge import batch  # noqa: E402

HONEST = int(os.environ.get("BOMB_HONEST", "30"))
CELL_WALL = float(os.environ.get("BOMB_CELL_WALL", "30"))
BOMBS = {
    "sleep_bomb": "import time\ntime.sleep(3600)",
    "memory_bomb": "hog = [bytearray(50 * 2**20) for _ in range(100)]  # 5 GB",
}


def _write(folder: Path, bombs: bool) -> None:
    for i in range(HONEST):
        nb = ex01_defs("solutions")
        nb.metadata["submission"] = f"student {i}"
        nbformat.write(nb, folder / f"ex01_honest{i:02d}.ipynb")
    for name, cell in BOMBS.items() if bombs else ():
        nb = ex01_defs("solutions")
        nb.cells[3:3] = [new_code_cell(cell)]
        nbformat.write(nb, folder / f"ex01_{name}.ipynb")


def _grade(bombs: bool) -> tuple[float, dict]:
    with tempfile.TemporaryDirectory() as tmp:
        _write(Path(tmp), bombs)
        t0 = time.perf_counter()
        res = batch.grade(
            [tmp], workers=2, cell_wall=CELL_WALL, notebook_wall=10 * CELL_WALL, seed=5,
            sandbox_mode=MODE, progress=False,
        )  # fmt: skip
        return time.perf_counter() - t0, {Path(r.file).stem: r for r in res}


def main() -> None:
    print(f"{HONEST} honest ex01 notebooks, 2 workers, cell wall {CELL_WALL:g} s, sandbox {MODE}")
    alone, honest = _grade(False)
    mixed, both = _grade(True)
    print(f"without bombs: {alone:.0f} s; with a sleep bomb and a memory bomb: {mixed:.0f} s")
    bar = CELL_WALL + 1.1 * alone
    verdict = "met" if mixed <= bar else "NOT met"
    print(f"bar: at most the wall limit + 1.1 x without = {bar:.0f} s: {verdict}")
    for name in BOMBS:
        r = both[f"ex01_{name}"]
        print(f"{name}: {r.points} points, status {r.status}, limit {r.limit!r}")
    same = all(both[n].points == r.points and both[n].status == r.status for n, r in honest.items())
    print(f"the {HONEST} honest scores unchanged beside the bombs: {same}")


if __name__ == "__main__":
    main()
