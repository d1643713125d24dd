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
#: The worker flushes pending answers at least this often (seconds), so the runner always
#: knows which sample is in flight.
WORKER_FLUSH_INTERVAL: Final = 0.02
#: Extra wall-clock slack on top of ``timeout_seconds`` before the runner kills a sandbox
#: (covers the flush interval and scheduling jitter).
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
#: Concurrent candidate-generation requests per unit.
GENERATION_CONCURRENCY_DEFAULT: Final = 8
#: Retries of a candidate-generation request on 429/5xx/timeouts.
GENERATION_RETRIES_DEFAULT: Final = 4
#: Samples written to the store in one transaction.
STORE_CHUNK_SIZE: Final = 5_000
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
