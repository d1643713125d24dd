"""What keeping every model answer as it arrives costs: AnswerLog throughput on SQLite.

Not a test: prints figures. Hands N generated candidates to an :class:`AnswerLog` from one
thread, the way the engine's event loop does as answers arrive, and times (a) the calls to
``add`` (what the generation loop pays) and (b) until every answer is committed. A real
provider answers a few to a few hundred calls per second per run; the figures say how far
below that the store's share stays.

    python benchmarks/answers.py                  # 20k answers
    python benchmarks/answers.py --answers 100000
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from evalkube.engine.answers import AnswerLog
from evalkube.engine.candidates import Candidate
from evalkube.store import ResultStore


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--answers", type=int, default=20_000)
    args = parser.parse_args()
    text = "The answer is 42, because the question asked for the product of six and seven. " * 4
    with tempfile.TemporaryDirectory() as folder:
        store = ResultStore.open(f"sqlite:///{Path(folder) / 'r.db'}")
        log = AnswerLog(store, "bench")
        started = time.perf_counter()
        for n in range(args.answers):
            log.add(
                f"s{n:08d}",
                Candidate(
                    output_text=text,
                    response_id=f"resp_{n}",
                    ms=812.5,
                    model_calls={"candidate": 1, "response_ids": [f"resp_{n}"]},
                ),
            )
        handed = time.perf_counter() - started
        log.close()
        committed = time.perf_counter() - started
        kept = len(log.kept([f"s{n:08d}" for n in range(args.answers)]))
        store.close()
    assert kept == args.answers, kept
    print(f"answers           {args.answers}")
    print(f"add() per answer  {handed / args.answers * 1e6:.1f} µs (the generation loop's share)")
    print(f"all committed     {committed:.2f} s = {args.answers / committed:,.0f} answers/s")


if __name__ == "__main__":
    main()
