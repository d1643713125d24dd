"""Every limit evalkube enforces, in one place.

Grader-facing limits (timeouts, model-call budgets) are declared per task in the spec and
bounded here; host-side caps protect the engine from untrusted worker answers. Each value is
documented because users meet them in error messages.
"""

from __future__ import annotations

from typing import Final

#: ``grader.timeout_seconds``: wall-clock limit of one grader execution (one sample, or one
#: ``grade_batch`` call, or one preprocessor call).
TIMEOUT_SECONDS_MIN: Final = 1
TIMEOUT_SECONDS_MAX: Final = 600
TIMEOUT_SECONDS_DEFAULT: Final = 120

#: ``grader.max_model_calls``: ``ctx`` bridge calls allowed from one grader execution.
MAX_MODEL_CALLS_MIN: Final = 0
MAX_MODEL_CALLS_MAX: Final = 500
MAX_MODEL_CALLS_DEFAULT: Final = 64

#: Characters of ``repr()`` kept of an invalid grader return value.
INVALID_PAYLOAD_REPR_CHARS: Final = 2_000
#: Lines of traceback kept for a grader exception (the tail: where the user's code failed).
TRACEBACK_TAIL_LINES: Final = 12
#: Characters of an exception message kept.
ERROR_MESSAGE_CHARS: Final = 2_000
#: Characters of a built-in grader's rendered ``input`` or ``reference`` (string_check,
#: text_similarity run in the engine process on model output: a longer text is an invalid
#: result, not minutes of BLEU on the host).
BUILTIN_INPUT_CHARS: Final = 100_000
#: ``rouge_l`` is a longest common subsequence in pure Python, quadratic in words: input words
#: x reference words above this is an invalid result (4M cells: about a second; two 100 000
#: character texts took 100 s on one core).
BUILTIN_LCS_CELLS: Final = 4_000_000
#: Characters of ``input``/``reference`` kept on a built-in grader's judge for debugging.
BUILTIN_JUDGE_CHARS: Final = 1_000
#: Characters of stdout and of stderr kept per grader execution for the debugging view.
CAPTURED_OUTPUT_CHARS: Final = 8_192
#: Score names one sample may return besides the task's declared ``metrics`` (and its
#: graders' ``metricId``s). More makes the sample invalid: every name becomes a metric of the
#: run (its status, the store's aggregates), so a grader could otherwise flood them.
SCORE_NAMES_PER_SAMPLE: Final = 64
#: Characters of one score or metric name; a longer name makes the sample invalid (or, from
#: ``grade_batch``, drops the metric with a problem noted).
SCORE_NAME_CHARS: Final = 128
#: Metrics one task x model reports in results (EvalRun status, ``--output``): the declared
#: ones always, then undeclared names in name order up to this count; the rest are counted
#: in ``metricsOmitted`` and stay in the store. Prometheus exports declared metrics only.
METRICS_PER_RESULT: Final = 64
#: Distinct metric names aggregated per task x model; score names past it are not averaged
#: (they count towards ``metricsOmitted``): aggregation memory stays bounded.
METRIC_NAMES_TRACKED: Final = 1_024
#: Characters of one condition message in a status (failed units, gate checks): longer ones
#: end in ``... [N more characters]``; a list of failed units says how many it left out.
STATUS_MESSAGE_CHARS: Final = 4_000
#: Characters of one Kubernetes Event message the operator posts (kopf cuts at 1,024).
EVENT_MESSAGE_CHARS: Final = 1_000
#: Characters of one failed unit's reason in a status or event message listing failed units,
#: so one long reason cannot take the room of the others.
FAILED_UNIT_REASON_CHARS: Final = 300
#: Execution tokens the model bridge keeps open at once (the runner opens a batch's tokens
#: before sending it and closes them when it stores the samples).
OPEN_EXECUTIONS_MAX: Final = 50_000
#: Bytes of one serialized grader answer (scores + judge) accepted from the worker; larger
#: answers become invalid samples ("judge payload too large").
RESULT_PAYLOAD_BYTES: Final = 1_000_000
#: Bytes of one protocol frame accepted from the worker (a whole batch of answers).
FRAME_BYTES_MAX: Final = 64_000_000
#: Samples sent to the worker in one request; answers come back in batches as well.
WORKER_BATCH_SIZE: Final = 512
#: Samples per worker request for graders with model access: their executions wait on model
#: calls anyway, and a worker then never holds more than its current execution's token and
#: the next one's (tokens are readable by any code in the worker's process).
WORKER_BATCH_SIZE_MODEL_ACCESS: Final = 1
#: Extra wall-clock slack on top of ``timeout_seconds`` before the runner kills a sandbox
#: (covers the worker's flush interval, ``evalkube_sandbox.worker.FLUSH_INTERVAL``, and
#: scheduling jitter).
TIMEOUT_GRACE_SECONDS: Final = 0.5
#: Memory of one grader sandbox (bytes). Inside the worker it is the address-space limit
#: (``RLIMIT_AS``, set before user code runs: allocations past it raise ``MemoryError`` and
#: the sample is invalid); gVisor, nsjail and bwrap also put the whole sandbox in a memory
#: cgroup of this size plus :data:`SANDBOX_MEMORY_OVERHEAD_BYTES` (child processes, tmpfs).
WORKER_MEMORY_BYTES: Final = 1024 * 1024 * 1024
#: Cgroup headroom above :data:`WORKER_MEMORY_BYTES` for the sandbox's own runtime (the gVisor
#: sentry, /tmp contents). Exceeding the cgroup kills the sandbox: the in-flight sample
#: becomes invalid ("the grader sandbox was killed: out of memory") and a fresh one continues.
SANDBOX_MEMORY_OVERHEAD_BYTES: Final = 256 * 1024 * 1024
#: CPU seconds one grader execution may use (``RLIMIT_CPU`` inside the worker, re-armed per
#: execution). Past it the execution raises ``CpuTimeLimitExceeded`` and the sample is
#: invalid. ``None`` means "the task's ``timeout_seconds``" (CPU can only outrun wall time
#: with threads or child processes). The wall-clock kill from outside is the hard backstop.
WORKER_CPU_SECONDS: Final[int | None] = None
#: Processes and threads one sandbox may hold (pids cgroup under gVisor, nsjail and bwrap).
#: A fork bomb meets ``BlockingIOError: Resource temporarily unavailable``.
SANDBOX_PIDS: Final = 64
#: Size of the sandbox's private, memory-backed ``/tmp`` (bytes); the only writable place.
#: Writing past it fails with ``OSError: [Errno 28] No space left on device``. The same
#: value is the largest single file the worker may write (``RLIMIT_FSIZE``).
SANDBOX_TMP_BYTES: Final = 64 * 1024 * 1024
#: Open files allowed in the worker (``RLIMIT_NOFILE``).
WORKER_OPEN_FILES: Final = 256
#: Bytes of the worker's raw stderr (output written straight to file descriptors 1 and 2,
#: bypassing ``print``) the runner keeps for crash reports; the rest is read and dropped.
WORKER_STDERR_TAIL_BYTES: Final = 16_384
#: Seconds the runner waits for a sandbox to start and say hello.
SANDBOX_START_TIMEOUT_SECONDS: Final = 60
#: Rows per work unit (shard) when the run does not say otherwise.
SHARD_SIZE_DEFAULT: Final = 10_000
#: Most seconds a work-unit Job may run (its ``activeDeadlineSeconds`` is the unit's worst case,
#: rows x the task's timeouts + slack, at most this); ``EVALKUBE_UNIT_DEADLINE_MAX_SECONDS``
#: changes it. A unit whose worst case is longer gets a ``DeadlineCapped`` warning event, and
#: a unit that runs out of it fails with a reason naming ``shardSize`` and ``timeoutSeconds``.
UNIT_DEADLINE_MAX_SECONDS: Final = 86_400
#: Concurrent candidate-generation requests per unit.
GENERATION_CONCURRENCY_DEFAULT: Final = 8
#: Retries of a candidate-generation request on 429/5xx/timeouts.
GENERATION_RETRIES_DEFAULT: Final = 4
#: Seconds the runner (and a grader's ctx, ``evalkube_sandbox.ctx.RESTART_RETRY_SECONDS``)
#: send a call to the proxy sidecar again while it restarts: its socket refuses, or it hung
#: up before answering. The kubelet starts a killed sidecar again at once, 10 s later after a
#: second kill (docs/proxy.md, "Resilience").
BRIDGE_RESTART_RETRY_SECONDS: Final = 60.0
#: Samples written to the store in one transaction.
STORE_CHUNK_SIZE: Final = 5_000
#: Samples one ``grade_batch`` call may receive: the call needs all of a task x model's
#: samples in one runner (and one grader worker), so past this many, or
#: :data:`BATCH_SAMPLES_BYTES`, the aggregate unit fails naming the task and what to do
#: instead of its runner being killed for memory (a pod's runner has 512 Mi).
BATCH_SAMPLES_MAX: Final = 100_000
#: Bytes of the samples one ``grade_batch`` call may receive (their texts, judges and dataset
#: rows as stored; a runner holds about three times this while it sends them).
BATCH_SAMPLES_BYTES: Final = 64 * 1024 * 1024
#: Seconds a work-unit runner waits for its NetworkPolicy to be enforced (the policy canary
#: refused) before it gives grader code anything; past it the unit fails.
POLICY_ENFORCED_TIMEOUT_SECONDS: Final = 120
#: A task x model stops the run once this many of its samples (or model calls) have ended
#: and the share that failed reached ``--max-error-rate``: a missing key or a provider
#: that cannot answer stops a run after this many calls, not after the whole dataset.
ERROR_RATE_MIN_SAMPLES: Final = 20
#: Default ``--max-error-rate``: stop only when every one of them failed.
MAX_ERROR_RATE_DEFAULT: Final = 1.0
#: Characters of a built-in grader's ``formula`` (a line of arithmetic: a longer one is refused,
#: which bounds its parse and evaluation cost).
FORMULA_CHARS_MAX: Final = 1_000
#: Inputs accepted in one request to the local embeddings model (the OpenAI API's own limit).
EMBEDDING_INPUTS_MAX: Final = 2048
#: Characters of one input to the local embeddings model (it truncates at 256 tokens anyway).
EMBEDDING_INPUT_CHARS_MAX: Final = 100_000
#: Characters of a provider's error message the model bridge passes on to the grader.
PROVIDER_ERROR_CHARS: Final = 500
#: Longest execution id the model bridge accepts (the runner uses sample ids).
EXECUTION_ID_CHARS: Final = 256
#: Largest request body the model bridge accepts from a grader or runner (bytes).
BRIDGE_REQUEST_BODY_BYTES: Final = 8 * 1024 * 1024
#: Largest request body the operator's ingest API accepts from a work-unit runner (bytes).
INGEST_BODY_BYTES: Final = 256 * 1024 * 1024
#: Threads of the operator that parse, validate and store posted samples: one parses while
#: the other writes (SQLite takes one writer at a time). Measured on 2 cores, 4 runners
#: posting 1,000,000 samples: with the loop's 6 default threads the operator's peak RSS grew
#: with the samples (230 MiB at 200k, 285 at 1M: more threads, more malloc arenas, and writers
#: sleeping on SQLite's lock) at 13-24k samples/s; with 2, 171-177 MiB whatever the count, at
#: 30-41k samples/s; with 1, 131 MiB at 9-15k samples/s.
INGEST_THREADS: Final = 2
#: Bytes of a run's snapshot ConfigMap (keys and values): Kubernetes' own limit for a
#: ConfigMap. A larger snapshot (a suite with large inline ``dataset.rows``) fails the run
#: with reason ``SnapshotTooLarge`` instead of being sent to the API server.
SNAPSHOT_CONFIGMAP_BYTES: Final = 1024 * 1024

# -- input surfaces (docs/security.md "Input surfaces"): files, imports, templates, output --
#: Bytes of a suite or run YAML file, and of a grader or preprocessor ``file`` (read whole).
SUITE_FILE_BYTES: Final = 16 * 1024 * 1024
#: Weight of one YAML document with every alias expanded: a node counts 1, a scalar 1 more
#: per :data:`YAML_SCALAR_CHARS_PER_NODE` characters. An alias bomb of a few hundred bytes
#: (each level repeating the one below) is refused before any object is built.
YAML_NODES_MAX: Final = 1_000_000
YAML_SCALAR_CHARS_PER_NODE: Final = 64
#: Bytes of one line of a JSONL dataset or outputs file (a longer line is refused after this
#: many bytes are read: parsing a line costs up to ~25 times its size in memory).
DATASET_LINE_BYTES: Final = 8 * 1024 * 1024
#: Fields of one CSV record (a CSV record, which quoted fields may spread over many lines, is
#: read to at most :data:`DATASET_LINE_BYTES` as well).
DATASET_CSV_FIELDS_MAX: Final = 10_000
#: Bytes of a ``.json`` dataset (one array, parsed whole): larger datasets go in JSONL.
DATASET_JSON_BYTES: Final = 16 * 1024 * 1024
#: Bytes of an ``evalkube import openai`` export file (parsed whole).
IMPORT_EXPORT_BYTES: Final = 32 * 1024 * 1024
#: Keyword evaluations of an export's ``item_schema`` per item and over all items (bound the
#: time of ``$ref`` fan-out and nested ``anyOf``: a step costs 5-15 µs, so the total is a few
#: seconds), and the depth of nested schema evaluation.
SCHEMA_ITEM_STEPS_MAX: Final = 20_000
SCHEMA_STEPS_MAX: Final = 1_000_000
SCHEMA_DEPTH_MAX: Final = 64
#: Values of one ``enum`` in an export's ``item_schema``, and JSON bytes of one ``enum`` or
#: ``const`` value (a larger one is refused, naming it). Checking an item against them walks
#: them whole, so each check is charged one schema step per
#: :data:`SCHEMA_VALUE_NODES_PER_STEP` JSON values they hold (one value costs ~0.5 µs).
SCHEMA_ENUM_VALUES_MAX: Final = 10_000
SCHEMA_ENUM_BYTES_MAX: Final = 1024 * 1024
SCHEMA_VALUE_NODES_PER_STEP: Final = 16
#: Characters of one rendered template (prompt, target, a grader's input or reference).
TEMPLATE_OUTPUT_CHARS: Final = 1_000_000
#: Characters a template may build in one render (every string, list and number it makes
#: counted by its size, before it is made): what bounds its memory.
TEMPLATE_WORK_CHARS: Final = 16_000_000
#: Wall-clock seconds of one template render (checked at every loop step and call).
TEMPLATE_RENDER_SECONDS: Final = 2.0
#: A unit's buffered samples are handed to the store at this many bytes (an estimate: text
#: fields and the judge) as well as at :data:`STORE_CHUNK_SIZE` samples.
STORE_CHUNK_BYTES: Final = 16 * 1024 * 1024
#: Bytes of samples one page of the samples API holds (texts, judges and rows as stored): a
#: page ends before it passes this, after at least one sample, and ``next_cursor`` goes on,
#: so the operator and ``evalkube samples/report --api`` hold one bounded page at a time.
SAMPLES_PAGE_BYTES: Final = 8 * 1024 * 1024
#: Characters of one field of a sample in the HTML report (the rest: ``evalkube samples``).
REPORT_FIELD_CHARS: Final = 4_000
#: Bytes of sample text the HTML report holds; samples past it are left to ``evalkube samples``.
REPORT_SAMPLES_BYTES: Final = 16 * 1024 * 1024
#: Score distributions the HTML report draws (task x model x metric): graders choose metric
#: names, up to 64 new ones per sample, and each distribution is an inline SVG.
REPORT_HISTOGRAMS_MAX: Final = 200
#: ``score:NAME`` columns of a CSV export (the names any sample has, sorted); past it the
#: export warns and keeps the first (every score stays in ``--format jsonl``).
CSV_SCORE_COLUMNS_MAX: Final = 1_000

# -- dataset and output sources (evalkube.sources; docs/operator.md "Data sources") ---------
#: The row index of a plain JSONL or CSV source keeps the byte offset of every
#: :data:`SOURCE_INDEX_STRIDE`-th row (at least), so a shard seeks to its first row and
#: skips fewer than a stride's lines without parsing them.
SOURCE_INDEX_STRIDE: Final = 1_000
#: Offsets an index keeps at most: past it the stride doubles (every other offset dropped),
#: so the index of a billion rows still fits a run's snapshot.
SOURCE_INDEX_OFFSETS_MAX: Final = 4_096
#: Bytes of one https:// (or Parquet over https://) source: it is read whole and its sha256
#: checked by every unit that reads it (use s3:// or pvc:// for larger data).
SOURCE_HTTPS_BYTES_MAX: Final = 512 * 1024 * 1024
#: Seconds to connect to, and to wait for each read of, an object store or https:// source.
SOURCE_CONNECT_SECONDS: Final = 10.0
SOURCE_READ_SECONDS: Final = 60.0
#: Attempts of one object-store request (botocore's standard retry mode: throttling, 5xx,
#: dropped connections).
SOURCE_ATTEMPTS: Final = 5
#: Seconds the run's prepare Job may take to pin its sources (read each JSONL or CSV source
#: once; a Parquet footer); past it the Job fails and so does the run, naming it.
PREPARE_DEADLINE_SECONDS: Final = 6 * 3600
#: Rows a Parquet source is decoded in at a time (one record batch).
SOURCE_PARQUET_BATCH_ROWS: Final = 2_048

# -- MLflow tracking (evalkube.tracking) -----------------------------------------------------
#: Tries of each step of logging a run to MLflow (experiment, run, each batch, each artifact)
#: while the server does not answer, times out or answers 429/5xx; then the run keeps its
#: phase and gets a warning (``evalkube run``) or a ``Tracked=False`` condition (operator).
MLFLOW_ATTEMPTS: Final = 4
#: The operator's tries (it logs in the background, so it waits longer for a server to come
#: back: about 2 minutes in all); ``EVALKUBE_MLFLOW_ATTEMPTS`` overrides it.
MLFLOW_OPERATOR_ATTEMPTS: Final = 8
#: First wait between two tries (seconds), doubled after each, at most
#: :data:`MLFLOW_BACKOFF_MAX_SECONDS`.
MLFLOW_BACKOFF_SECONDS: Final = 0.5
MLFLOW_BACKOFF_MAX_SECONDS: Final = 30.0
#: Timeout of one request to the tracking server (seconds).
MLFLOW_REQUEST_SECONDS: Final = 15
#: MLflow's caps: characters of a param/metric/tag key, a param value, a tag value.
MLFLOW_KEY_CHARS: Final = 250
MLFLOW_PARAM_CHARS: Final = 6_000
MLFLOW_TAG_CHARS: Final = 8_000
#: Bytes of the per-sample ``samples.jsonl`` artifact; the samples past it are left out (all
#: of them stay in the store: ``evalkube samples RUN --format jsonl``).
MLFLOW_SAMPLES_BYTES: Final = 512 * 1024 * 1024
#: Seconds ``evalkube run`` waits, after printing the scores, for the MLflow logging it
#: started in the background; then it warns and exits (the run is recorded either way).
MLFLOW_LOCAL_WAIT_SECONDS: Final = 120

# -- evalkube submit (evalkube.submit; docs/cli.md "Submitting to a cluster") ---------------
#: Bytes of one dataset file ``evalkube submit`` puts into a ConfigMap when no ``--store`` is
#: given (a Kubernetes object holds at most 1 MiB, metadata included); a larger one is refused,
#: naming the file and ``--store``. The grader and preprocessor files of a suite share one
#: ConfigMap within the same bound.
SUBMIT_CONFIGMAP_BYTES: Final = 900 * 1024
#: Bytes of each part of an upload to the object store, and parts sent at once: a file is
#: streamed, at most ``PART x CONCURRENCY`` bytes of it in memory (a file under two parts
#: goes in one request).
SUBMIT_UPLOAD_PART_BYTES: Final = 8 * 1024 * 1024
SUBMIT_UPLOAD_CONCURRENCY: Final = 4
#: Seconds ``evalkube submit`` keeps trying to re-open its watch of the EvalRun while the API
#: server does not answer (waits of 1 s doubling to 10 s); then it stops watching, exit 3.
SUBMIT_WATCH_RETRY_SECONDS: Final = 300
