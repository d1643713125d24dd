"""A run made for the HTML report tests: every status, a traceback, a judge payload, and
model output that tries to inject markup and script into the page."""

from __future__ import annotations

from pathlib import Path

from evalkube.store import ResultStore, RunRecord, SampleRecord, TaskResultRecord

RUN = "report-run"
INJECTION = (
    "<script>window.pwned = 1; document.title = 'pwned'</script>"
    '<img src=x onerror="window.pwned = 2">'
    "</pre></details></article><b id=injected>bold?</b>"
)
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "grader.py", line 7, in grade\n'
    "    return {'score': answers[item['id']]}\n"
    "KeyError: 'q9'"
)
#: A dataset row id is untrusted too (a dataset's idField value): shown as text, never markup.
ROW_INJECTION = "<i id=rowinjected>es</i>"
JUDGE = {"verdict": "partially right", "rubric": {"accuracy": 2, "style": 1}}
#: What the report's scores table must show (summary of a finished run).
SUMMARY = {
    "run_id": RUN,
    "suite": "report-suite",
    "suite_version": "sha256:0",
    "sandbox": "process",
    "phase": "Succeeded",
    "seconds": 12.5,
    "problems": [],
    "results": [
        {
            "task": "capitals",
            "model": "gpt-x",
            "metrics": {"exact": 0.4, "f1": 0.55},
            "counts": {"samples": 5, "valid": 3, "invalid": 1, "errored": 1},
            "model_calls": {},
        },
        {
            "task": "math",
            "model": "gpt-x",
            "metrics": {"exact": 0.5},
            "counts": {"samples": 2, "valid": 2, "invalid": 0, "errored": 0},
            "model_calls": {},
        },
    ],
}


def make_report_store(path: Path) -> str:
    """Write the run into a SQLite store at ``path``; returns its URL."""
    url = f"sqlite:///{path}"
    store = ResultStore.open(url)
    try:
        store.create_run(RunRecord(RUN, "report-suite", "sha256:0", {}, "process"))
        store.record_samples(
            [
                SampleRecord(RUN, "cap-paris", "capitals", "gpt-x", 0, "valid", row_id="fr",
                             prompt="Capital of France?", target="Paris", output_text="Paris",
                             scores={"exact": 1.0, "f1": 1.0}),
                SampleRecord(RUN, "cap-rome", "capitals", "gpt-x", 1, "valid", row_id="it",
                             prompt="Capital of Italy?", target="Rome", output_text="Milan",
                             scores={"exact": 0.0, "f1": 0.25}, judge=JUDGE),
                SampleRecord(RUN, "cap-evil", "capitals", "gpt-x", 2, "valid", row_id=ROW_INJECTION,
                             prompt="Capital of Spain?", target="Madrid", output_text=INJECTION,
                             scores={"exact": 1.0, "f1": 0.5}),
                SampleRecord(RUN, "cap-empty", "capitals", "gpt-x", 3, "invalid", row_id="pe",
                             prompt="Capital of Peru?", target="Lima", output_text="",
                             scores={"exact": 0.0}),
                SampleRecord(RUN, "cap-crash", "capitals", "gpt-x", 4, "errored", row_id="td",
                             prompt="Capital of Chad?", target="N'Djamena", output_text="?",
                             error={"stage": "grading", "type": "KeyError", "message": "'q9'",
                                    "traceback": TRACEBACK}),
                SampleRecord(RUN, "math-1", "math", "gpt-x", 0, "valid", row_id="0", target="4",
                             output_text="4", scores={"exact": 1.0}),
                SampleRecord(RUN, "math-2", "math", "gpt-x", 1, "valid", row_id="1", target="5",
                             output_text="6", scores={"exact": 0.0}),
            ]
        )  # fmt: skip
        store.save_task_result(TaskResultRecord(RUN, "capitals", "gpt-x", {}))
        store.finish_run(RUN, "Succeeded", SUMMARY)
    finally:
        store.close()
    return url
