"""Benchmark: latency added and throughput kept by the evalkube model bridge proxy.

Not a test. Starts, each in its own process on loopback:

- a fake OpenAI-compatible provider (raw asyncio, canned Responses API answer);
- the evalkube proxy twice: ``native`` (the compiled ``evalkube-proxy``, exec'd exactly as
  ``evalkube proxy --engine native`` does; built by ``.ci/proxy.sh``, found through
  ``EVALKUBE_PROXY_BIN`` or ``PATH``) and ``python`` (the real
  :class:`~evalkube.proxy.server.ProxyServer`); budgets, usage audit, metrics and key
  injection all on in both;
- LiteLLM's proxy (``litellm --config``), when ``--litellm`` points at its executable
  (install it in a separate venv, never as a project dependency:
  ``python -m venv /tmp/litellm-venv && /tmp/litellm-venv/bin/pip install 'litellm[proxy]'``);

then drives ``POST /v1/responses`` at concurrency 1, 16 and 64 with a lean keep-alive client
(its own process), directly against the provider and through each proxy, and prints p50/p99
latency, calls/s, the proxy's CPU time per call, and the ratios against direct.

Run on a shared machine with ``nice``::

    nice -n 10 .venv/bin/python benchmarks/proxy.py --litellm /tmp/litellm-venv/bin/litellm
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
KEY = "sk-benchmark-0000000000000000"
#: What the load client sends as its own Authorization: LiteLLM's master key (evalkube drops it).
CLIENT_KEY = "sk-" + "5eb1c0de" * 8
CANNED = json.dumps(
    {
        "id": "resp_bench",
        "object": "response",
        "created_at": 1700000000,
        "status": "completed",
        "model": "m",
        "output": [
            {
                "type": "message",
                "id": "msg_1",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "ok", "annotations": []}],
            }
        ],
        "usage": {
            "input_tokens": 3,
            "output_tokens": 1,
            "total_tokens": 4,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }
).encode()


# -- roles (each runs in its own process) ----------------------------------------------------------
def role_upstream(port: int) -> None:
    """The fake provider: answers every POST with the canned response, keep-alive."""
    reply = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        len(CANNED),
        CANNED,
    )

    class Protocol(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            assert isinstance(transport, asyncio.Transport)
            self.transport = transport
            self.buffer = b""

        def data_received(self, data: bytes) -> None:
            self.buffer += data
            while True:
                end = self.buffer.find(b"\r\n\r\n")
                if end < 0:
                    return
                head = self.buffer[:end].lower()
                at = head.find(b"content-length:")
                length = int(head[at + 15 :].split(b"\r\n", 1)[0]) if at >= 0 else 0
                if len(self.buffer) < end + 4 + length:
                    return
                self.buffer = self.buffer[end + 4 + length :]
                self.transport.write(reply)

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Protocol, "127.0.0.1", port)
        await server.serve_forever()

    asyncio.run(main())


#: Execution tokens the client uses (``exec-0`` ... one per connection), opened before load.
CLIENT_TOKENS = 256


def control_socket(port: int) -> Path:
    """Where the proxy listening on ``port`` serves its control routes."""
    return Path(tempfile.gettempdir()) / f"evalkube-bench-control-{port}.sock"


def open_client_tokens(port: int) -> None:
    """Open the client's execution tokens, as the runner does before graders call."""
    from evalkube.proxy.control import ControlClient

    deadline = time.monotonic() + 30
    while not control_socket(port).exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"the proxy on port {port} opened no control socket")
        time.sleep(0.05)
    client = ControlClient(f"unix:{control_socket(port)}")
    try:
        client.open_executions([f"exec-{n}" for n in range(CLIENT_TOKENS)])
    finally:
        client.close()


def role_native(port: int, upstream_port: int) -> None:
    """The native proxy on TCP loopback, configured and exec'd as the sidecar does."""
    sys.path[:0] = [str(ROOT / "operator"), str(ROOT / "sandbox_image")]
    from evalkube.proxy.native import exec_native, native_config, require_native_binary
    from evalkube.proxy.upstream import Provider

    os.environ["EVALKUBE_BENCH_KEY"] = KEY
    provider = Provider(
        "fake", f"http://127.0.0.1:{upstream_port}/v1", api_key_env="EVALKUBE_BENCH_KEY"
    )
    config = native_config(
        {"fake": provider},
        listen=f"127.0.0.1:{port}",
        control_listen=f"unix:{control_socket(port)}",
        judge_model="fake:m",
        max_calls=10**9,
        planned_executions=10**6,
    )
    exec_native(require_native_binary(), config)


def role_python(port: int, upstream_port: int) -> None:
    """The Python proxy on TCP loopback, budgets and audit on."""
    sys.path[:0] = [str(ROOT / "operator"), str(ROOT / "sandbox_image")]
    from prometheus_client import CollectorRegistry

    from evalkube.proxy.server import ProxyServer, run, run_until_stopped
    from evalkube.proxy.service import ProxyService
    from evalkube.proxy.upstream import Provider, Upstream

    os.environ["EVALKUBE_BENCH_KEY"] = KEY
    provider = Provider(
        "fake", f"http://127.0.0.1:{upstream_port}/v1", api_key_env="EVALKUBE_BENCH_KEY"
    )

    async def main() -> None:
        service = ProxyService(
            Upstream({"fake": provider}),
            judge_model="fake:m",
            embedding_model=None,
            registry=CollectorRegistry(),
            max_calls_per_execution=10**9,
            planned_executions=10**6,
        )
        await run_until_stopped(
            ProxyServer(
                service,
                listen=f"127.0.0.1:{port}",
                control_listen=f"unix:{control_socket(port)}",
            )
        )

    run(main())  # uvloop when installed, as `evalkube proxy` does


def role_client(port: int, concurrency: int, seconds: float, limit: int) -> None:
    """Keep-alive load: ``concurrency`` connections, each one request at a time."""
    body = json.dumps({"model": "auto", "input": "hello"}).encode()
    latencies: list[float] = []
    failures: list[bytes] = []

    async def worker(n: int, deadline: float, quota: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        request = (
            b"POST /v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer %s\r\nX-Evalkube-Execution: exec-%d\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (CLIENT_KEY.encode(), n, len(body), body)
        )
        done = 0
        while done < quota and time.perf_counter() < deadline:
            started = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            lower = head.lower()
            at = lower.find(b"content-length:")
            await reader.readexactly(int(lower[at + 15 :].split(b"\r\n", 1)[0]))
            if not head.startswith(b"HTTP/1.1 200"):
                failures.append(head[:80])
            latencies.append(time.perf_counter() - started)
            done += 1
        writer.close()

    async def main() -> dict[str, Any]:
        warm = time.perf_counter() + min(1.0, seconds / 4)
        await asyncio.gather(*(worker(n, warm, 30) for n in range(concurrency)))
        latencies.clear()
        started = time.perf_counter()
        deadline = started + seconds
        await asyncio.gather(
            *(worker(n, deadline, max(1, limit // concurrency)) for n in range(concurrency))
        )
        elapsed = time.perf_counter() - started
        ordered = sorted(latencies)
        return {
            "calls": len(ordered),
            "failures": len(failures),
            "failure": failures[0].decode("latin-1") if failures else None,
            "rps": len(ordered) / elapsed,
            "p50": ordered[len(ordered) // 2] * 1000 if ordered else float("nan"),
            "p99": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000
            if ordered
            else float("nan"),
        }

    print(json.dumps(asyncio.run(main())))


# -- orchestration ---------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_port(port: int, process: subprocess.Popen[bytes], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"process for port {port} exited with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port} after {seconds:g} s")


def cpu_seconds(pid: int, which: tuple[int, ...] = (11, 12)) -> float:
    """User (11) and/or system (12) CPU seconds of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(fields[i]) for i in which) / os.sysconf("SC_CLK_TCK")


def spawn(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, __file__, *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def measure(
    port: int, concurrency: int, seconds: float, limit: int, pid: int | None
) -> dict[str, Any]:
    before = cpu_seconds(pid) if pid else 0.0
    before_sys = cpu_seconds(pid, (12,)) if pid else 0.0
    out = subprocess.run(
        [sys.executable, __file__, "client", str(port), str(concurrency), str(seconds), str(limit)],
        capture_output=True,
        check=True,
        timeout=seconds * 4 + 60,
    )
    result: dict[str, Any] = json.loads(out.stdout)
    if pid and result["calls"]:
        result["cpu_us"] = (cpu_seconds(pid) - before) / result["calls"] * 1e6
        result["sys_us"] = (cpu_seconds(pid, (12,)) - before_sys) / result["calls"] * 1e6
    return result


def start_litellm(
    executable: str, upstream_port: int, workdir: Path
) -> tuple[subprocess.Popen[bytes], int]:
    config = workdir / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        "  - model_name: auto\n"
        "    litellm_params:\n"
        "      model: openai/m\n"
        f"      api_base: http://127.0.0.1:{upstream_port}/v1\n"
        f"      api_key: {KEY}\n"
        "litellm_settings:\n  telemetry: false\n  drop_params: true\n"
    )
    port = free_port()
    env = {
        **os.environ,
        "LITELLM_LOG": "ERROR",
        "LITELLM_TELEMETRY": "False",
        "LITELLM_MASTER_KEY": CLIENT_KEY,
    }
    process = subprocess.Popen(
        [executable, "--config", str(config), "--port", str(port), "--host", "127.0.0.1"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=(workdir / "litellm.log").open("wb"),
        start_new_session=True,
    )
    wait_port(port, process, 180)
    return process, port


#: The evalkube proxies measured: the sidecar's default engine first.
PROXIES = ("native", "python")


def orchestrate(options: argparse.Namespace) -> int:
    processes: list[subprocess.Popen[bytes]] = []
    workdir = Path(tempfile.mkdtemp(prefix="evalkube-bench-"))
    try:
        upstream_port = free_port()
        upstream = spawn("upstream", str(upstream_port))
        processes.append(upstream)
        wait_port(upstream_port, upstream, 30)
        targets: list[tuple[str, int, int | None]] = [("direct", upstream_port, None)]
        for role in PROXIES:
            port = free_port()
            proxy = spawn(role, str(port), str(upstream_port))
            processes.append(proxy)
            wait_port(port, proxy, 60)
            open_client_tokens(port)
            targets.append((role, port, proxy.pid))
        if options.litellm:
            litellm, litellm_port = start_litellm(options.litellm, upstream_port, workdir)
            processes.append(litellm)
            targets.append(("litellm", litellm_port, litellm.pid))

        results: dict[tuple[str, int], dict[str, Any]] = {}
        for concurrency in options.concurrency:
            for name, port, pid in targets:
                seconds = options.seconds * (2 if name == "litellm" else 1)
                results[(name, concurrency)] = measure(
                    port, concurrency, seconds, options.limit, pid
                )
                r = results[(name, concurrency)]
                if r["failures"]:
                    print(
                        f"warning: {name} c={concurrency}: {r['failures']} non-200: {r['failure']}"
                    )
        print_table(results, [t[0] for t in targets], options.concurrency)
    finally:
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


def print_table(
    results: dict[tuple[str, int], dict[str, Any]], names: list[str], levels: list[int]
) -> None:
    print()
    print(
        f"{'target':<9} {'conc':>4} {'calls':>7} {'calls/s':>8} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'added p50':>9} {'vs direct':>9} {'CPU us/call':>16}"
    )
    for concurrency in levels:
        direct = results[("direct", concurrency)]
        for name in names:
            r = results[(name, concurrency)]
            added = r["p50"] - direct["p50"]
            ratio = r["rps"] / direct["rps"] if direct["rps"] else float("nan")
            cpu = f"{r['cpu_us']:.0f} ({r['sys_us']:.0f} sys)" if "cpu_us" in r else "-"
            print(
                f"{name:<9} {concurrency:>4} {r['calls']:>7} {r['rps']:>8.0f} {r['p50']:>8.3f} "
                f"{r['p99']:>8.3f} {added if name != 'direct' else 0:>9.3f} {ratio:>8.1%} {cpu:>16}"
            )
    if "litellm" in names:
        print()
        for concurrency in levels:
            theirs = results[("litellm", concurrency)]
            direct_p50 = results[("direct", concurrency)]["p50"]
            ratios = ", ".join(
                f"{name} {results[(name, concurrency)]['rps'] / theirs['rps']:.1f}x"
                for name in PROXIES
            )
            print(
                f"c={concurrency}: throughput against litellm: {ratios}; added p50 litellm "
                f"{theirs['p50'] - direct_p50:.3f} ms"
            )
    for name in PROXIES:
        c1, c64 = (name, 1), (name, 64)
        if c1 not in results or c64 not in results:
            continue
        added = results[c1]["p50"] - results[("direct", 1)]["p50"]
        kept = results[c64]["rps"] / results[("direct", 64)]["rps"]
        print()
        print(f"{name}: target added p50 at c=1 <= 1 ms: {added:.3f} ms")
        print(f"{name}: target >= 25% of direct at c=64: {kept:.1%}")
        if ("litellm", 64) in results:
            times = results[c64]["rps"] / results[("litellm", 64)]["rps"]
            print(f"{name}: target >= 25x litellm at c=64: {times:.1f}x")


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] in ("upstream", "native", "python", "client"):
        role, *args = sys.argv[1:]
        if role == "upstream":
            role_upstream(int(args[0]))
        elif role == "native":
            role_native(int(args[0]), int(args[1]))
        elif role == "python":
            role_python(int(args[0]), int(args[1]))
        else:
            role_client(int(args[0]), int(args[1]), float(args[2]), int(args[3]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--litellm", help="path of LiteLLM's `litellm` executable (separate venv)")
    parser.add_argument("--seconds", type=float, default=4.0, help="measured seconds per point")
    parser.add_argument("--limit", type=int, default=40_000, help="max calls per point")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    return orchestrate(parser.parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
