"""A pool of fake Ollama workstations behind `mr serve`, round-robin, least-busy, cache-aware (and LiteLLM), in one run.

Issue 17's lab, replayed on 127.0.0.1: four workstations (H100 80 GB, RTX
4090 24 GB, RTX 4080 16 GB, RTX 3060 12 GB) that schedule as Ollama does
(VRAM, loads by size, eviction, keep_alive, four slots per loaded model, a
prompt cache per slot): each fake server drives the simulator's own
workstation model (``mindrouter.simulate.workstation``, docs/simulate.md says
where it simplifies) on a scaled clock (``_workstation.py``), its GPU shared
by ``--sharing``. 20 users on an 8B chat model,
a 14B coder with long prompts, a 70B and an embedding model, Poisson
arrivals: a steady phase at 0.6x the pool's estimated capacity, then a
burst at 1.3x. Every target gets fresh workstations (one process, started
anew) and the same seeded workload, time-compressed (every duration, the
daemon's settings included, scaled alike). Figures are in lab seconds.

    python benchmarks/bench_pool.py                 # about 3.5 minutes
    python benchmarks/bench_pool.py --quick         # about 40 s, noisier
    python benchmarks/bench_pool.py --steady 600 --burst 360 --compression 10 --seed 17
    MR_BENCH_LITELLM=/path/to/venv-with-litellm python benchmarks/bench_pool.py   # adds LiteLLM's Router
    python benchmarks/bench_pool.py --only "mr serve" "mr serve without GPU readings" least-busy
    python benchmarks/bench_pool.py --scenario > lab.toml && mr simulate lab.toml   # the same lab, simulated
    python benchmarks/bench_pool.py --workload scenario --only "mr serve" "mr simulate"   # simulator against live
    python benchmarks/bench_pool.py --workload scenario --only "mr serve" "mr simulate, perfect placement"
    python benchmarks/bench_pool.py --workload conversations --only "mr serve" "mr simulate" least-busy
    python benchmarks/bench_pool.py --workload conversations --only "mr serve" least-busy cache-aware   # issue 31
    python benchmarks/bench_pool.py --sharing concurrent --only "mr serve" least-busy   # the other GPU law
    python benchmarks/bench_pool.py --pool six --only "mr serve" least-busy   # issue 31's held-out pools
    python benchmarks/bench_pool.py --pool two-popular --only "mr serve" least-busy
    python benchmarks/bench_pool.py --pool mixed --only "mr serve" least-busy   # a vLLM server beside, by an alias
    python benchmarks/bench_pool.py --overload 2 --only "mr serve" least-busy   # 2x the capacity for 180 lab s
    python benchmarks/bench_pool.py --only "mr serve" --trace /tmp/t && python benchmarks/pool_ttft.py /tmp/t/mr-serve

`mr serve` runs with its defaults, ``--max-concurrent 4`` per backend (the
README's suggestion), each workstation's ``parallel`` and ``max_loaded``
(its OLLAMA_NUM_PARALLEL and OLLAMA_MAX_LOADED_MODELS; a daemon that does not
know these backend fields ignores them), and each workstation as its ``mr
agent`` node (its GPU readings). Clients speak OpenAI (``/v1/chat/completions`` streamed with
usage, ``/v1/embeddings``), one key per user. The load generator, the
workstations and the daemon share this machine; figures on a busy machine are
noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
from _lab import Request, capacity, scenario, users, workload
from _pool_report import Figures, Outcome, compute, table
from _pool_sim import lab_scenario, scenario_requests, simulated
from _pools import ALIASES, POOL_KINDS, POOLS, SERVED_AS, WORKLOADS, pool
from _replay import TIMEOUT, replay
from _routers import POLICIES, create_router, learn_models
from aiohttp import web
from bench_daemon import (
    HERE,
    LITELLM_AUTH,
    admin_call,
    free_port,
    launch_daemon,
    start_litellm_config,
    stop_all,
    wait_http,
)

from mindrouter.config import BackendSettings, ServerSettings
from mindrouter.scheduler import SchedulerSettings
from mindrouter.simulate.scenario import SHARING

LITELLM = ("litellm least-busy", "litellm simple-shuffle")
PERFECT = "mr simulate, perfect placement"
TARGETS = ("mr serve", "mr serve without GPU readings", *POLICIES, *LITELLM, "mr simulate", PERFECT)
"""All targets; the default run is mr serve, the baselines and (with a LiteLLM virtualenv) LiteLLM.
``mr simulate`` is the simulator on this lab (``_pool_sim.py``), with ``--workload scenario`` on
the very requests the live targets get; ``mr simulate, perfect placement`` the same with every model
resident from the start and never loaded (issue 17's offline bound, docs/simulate.md)."""
SCALED = {
    "server": (ServerSettings, ("gpu_poll_interval",), ()),
    "scheduler": (
        SchedulerSettings,
        (
            "fairness_window",
            "queue_timeout",
            "heavy_refresh_interval",
            "latency_reference",
            "default_load_seconds",
            "wait_margin",
            "max_think_time",
            "placement_interval",
            "load_confirm_seconds",
            "min_load_sample_seconds",
        ),
        (
            "credit_rate",
            "wait_bonus_per_second",
            "throughput_reference",
            "default_decode_rate",
            "default_load_bytes_per_second",
        ),
    ),
    "backends": (
        BackendSettings,
        (
            "poll_interval",
            "first_byte_timeout",
            "load_timeout",
            "chunk_timeout",
            "request_timeout",
            "circuit_window",
            "circuit_cooldown",
        ),
        (),
    ),
}
"""Per config section: its defaults, the settings in seconds (divided) and those per second (multiplied).
``anticipation`` stays as it is: it is compared with a client's gap between an answer and its next request, which
holds a loopback round trip and the client's own work that do not compress."""


def scaled_settings(compression: float) -> dict[str, dict[str, Any]]:
    """The daemon's time settings at ``compression`` (only those this version has)."""
    out: dict[str, dict[str, Any]] = {}
    for section, (cls, seconds, rates) in SCALED.items():
        defaults = {f.name: getattr(cls(), f.name) for f in dataclasses.fields(cls)}
        out[section] = {k: defaults[k] / compression for k in seconds if k in defaults}
        out[section].update({k: defaults[k] * compression for k in rates if k in defaults})
    return out


async def start_mr(tmp: Path, args: argparse.Namespace, urls: list[str], readings: bool = True) -> Any:
    """`mr serve` with the workstations as backends (and, with ``readings``, as GPU nodes); one key per user.

    A vLLM-style replica is added as a vLLM backend (the fake serves no ``/metrics``, which mr serve takes as
    not offered)."""
    settings = scaled_settings(args.compression)
    for item in args.set or ():
        key, _, value = item.partition("=")
        section, _, name = key.partition(".")
        settings.setdefault(section, {})[name] = json.loads(value)
    daemon, port, sock = await launch_daemon(tmp, args.loop, settings)
    for spec, url in zip(pool(args.sharing, args.pool), urls, strict=True):
        backend = {"name": spec.name, "url": url, "max_concurrent": args.max_concurrent or spec.max_concurrent}
        if spec.engine == "ollama":
            backend.update(
                engine="ollama",
                parallel=spec.parallel,  # what the lab set OLLAMA_NUM_PARALLEL and
                max_loaded=spec.max_loaded,  # OLLAMA_MAX_LOADED_MODELS to (a daemon without these ignores them)
            )
            if readings:
                backend.update(node=url, gpus=[0])
        else:  # a vLLM-style replica: its prompts stall decoding (chunked prefill), as mr serve expects of vLLM
            backend["engine"] = spec.engine if spec.engine == "vllm" else "openai"
        await admin_call(sock, "POST", "/admin/backends", backend)
    for other, model in ALIASES.items():  # a server that lists a model under another name (mr model alias)
        await admin_call(sock, "PUT", f"/admin/models/aliases/{quote(other, safe='')}", {"target": model})
    keys = {}
    for name, _ in users(POOL_KINDS[args.pool]):
        await admin_call(sock, "POST", "/admin/users", {"name": name, "group": "staff"})
        keys[name] = (await admin_call(sock, "POST", f"/admin/users/{name}/keys"))["key"]
    for row in await admin_call(sock, "GET", "/admin/backends"):
        assert row["healthy"] and row["models"], row
    return daemon, f"http://127.0.0.1:{port}", lambda user: {"Authorization": f"Bearer {keys[user]}"}


def litellm_yaml(urls: list[str], strategy: str, compression: float, pool_name: str) -> str:
    lines = ["model_list:"]
    for spec, url in zip(pool(name=pool_name), urls, strict=True):
        for model in spec.models:
            lines += [
                f"  - model_name: {model}",
                "    litellm_params:",
                f"      model: openai/{SERVED_AS.get(spec.name, {}).get(model, model)}",
                f"      api_base: {url}/v1",
                "      api_key: none",
            ]
    lines += [
        "router_settings:",
        f"  routing_strategy: {strategy}",
        "litellm_settings:",
        f"  request_timeout: {TIMEOUT / compression:g}",
        "  num_retries: 0",
    ]
    return "\n".join(lines) + "\n"


async def run_target(name: str, args: argparse.Namespace, requests: list[Request]) -> Figures:
    """``name`` against fresh workstations: start everything, replay, read the workstations' stats, stop."""
    tmp = Path(tempfile.mkdtemp(prefix="mr-bench-pool-"))
    stations = pool(args.sharing, args.pool)
    ports = [free_port() for _ in stations]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    app = [sys.executable, str(HERE / "_ollama_app.py"), str(args.compression), args.sharing, args.pool]
    app += map(str, ports)
    procs = [subprocess.Popen(app)]
    runner: web.AppRunner | None = None
    try:
        for url in urls:
            await wait_http(f"{url}/api/version")
        headers: Callable[[str], dict[str, str]] = lambda _user: {}  # noqa: E731
        if name.startswith("mr serve"):
            daemon, target, headers = await start_mr(tmp, args, urls, readings=name == "mr serve")
            procs.append(daemon)
        elif name in POLICIES:
            async with aiohttp.ClientSession() as s:
                models = await learn_models(s, urls, ALIASES)
            runner = web.AppRunner(create_router(name, models, args.seed), access_log=None)
            await runner.setup()
            port = free_port()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            target = f"http://127.0.0.1:{port}"
        else:
            strategy = name.removeprefix("litellm ")
            proc, target = await start_litellm_config(
                args.litellm, tmp, litellm_yaml(urls, strategy, args.compression, args.pool)
            )
            procs.append(proc)
            headers = lambda _user: LITELLM_AUTH  # noqa: E731
        outcomes, arrivals, span = await replay(target, headers, requests, args.compression, args.steady)
        async with aiohttp.ClientSession() as s:
            stats = []
            for url in urls:
                async with s.get(f"{url}/bench/stats") as r:
                    stats.append(await r.json())
            if args.trace:
                traces = {}
                for spec, url in zip(stations, urls, strict=True):
                    async with s.get(f"{url}/bench/trace") as r:
                        traces[spec.name] = await r.json()
                save_trace(Path(args.trace) / name.replace(" ", "-"), outcomes, traces)
        return compute(Figures(name, outcomes, arrivals, stats, args.steady, args.burst, span))
    finally:
        if runner is not None:
            await runner.cleanup()
        stop_all(procs)
        if args.trace and (tmp / "state").is_dir():
            shutil.copytree(tmp / "state", Path(args.trace) / name.replace(" ", "-") / "state", dirs_exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)


def save_trace(folder: Path, outcomes: list[Outcome], traces: dict[str, list[dict[str, Any]]]) -> None:
    """Each request's outcome (lab seconds, with its request id) and each workstation's trace, as JSON."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = [
        {**dataclasses.asdict(o.req), "sent": o.sent, "first": o.first, "end": o.end, "error": o.error}
        | {"request_id": o.request_id}
        for o in outcomes
    ]
    (folder / "outcomes.json").write_text(json.dumps(rows))
    (folder / "workstations.json").write_text(json.dumps(traces))


async def main(args: argparse.Namespace) -> list[Figures]:
    sc = lab_scenario(
        args.seed,
        args.steady,
        args.burst,
        TIMEOUT,
        args.sharing,
        args.workload == "conversations",
        args.pool,
        burst=args.overload,
    )
    if args.workload != "lab":
        requests = scenario_requests(sc, args.steady)
    else:
        requests = workload(args.seed, args.steady, args.burst, burst=args.overload, pool_name=args.pool)
    targets = [t for t in TARGETS if t in args.only] if args.only else ["mr serve", *POLICIES]
    if args.litellm and not args.only:
        targets += LITELLM
    kinds = POOL_KINDS[args.pool]
    rate = capacity(pool(name=args.pool), kinds)
    print(
        f"seed {args.seed}: {len(requests)} requests from {len(users(kinds))} users"
        f" over {args.steady:g} + {args.burst:g}"
        f" lab s (steady 0.6x, burst {args.overload:g}x of an estimated {rate:.2f} requests/s);"
        f" compression {args.compression:g}x;"
        f" pool {args.pool}, GPUs {args.sharing};"
        f" mr serve: --max-concurrent {args.max_concurrent or 'parallel x max loaded'}, {args.loop} loop;"
        " figures in lab seconds",
        flush=True,
    )
    figures = []
    for name in targets:
        t0 = time.monotonic()
        if name in ("mr simulate", PERFECT):
            figures.append(simulated(sc, args.steady, args.burst, perfect=name == PERFECT))
        else:
            figures.append(await run_target(name, args, requests))
        print(f"  {name}: {time.monotonic() - t0:.0f} s wall", flush=True)
    print()
    print(table(figures))
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run: 120 + 90 lab s at 30x (under a minute)")
    parser.add_argument("--steady", type=float, default=300.0, help="lab seconds of the steady phase")
    parser.add_argument("--burst", type=float, default=180.0, help="lab seconds of the burst")
    parser.add_argument("--compression", type=float, default=10.0, help="lab seconds per wall second")
    parser.add_argument(
        "--overload",
        type=float,
        default=1.3,
        help="the burst's arrivals over the pool's estimated capacity (2 with --burst 180: issue 31's 2x overload"
        " for 3 minutes)",
    )
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument(
        "--max-concurrent",
        type=int,
        default=None,
        help="mr serve's cap per backend (default: parallel x max loaded, as `mr backend add --parallel` sets it)",
    )
    parser.add_argument(
        "--only", nargs="*", choices=TARGETS, metavar="TARGET", help=f"targets to run, of: {', '.join(TARGETS)}"
    )
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument(
        "--set",
        nargs="*",
        metavar="SECTION.KEY=VALUE",
        help="mr serve settings beside the scaled ones, e.g. scheduler.prefix_cache_tokens=0 (a JSON value)",
    )
    parser.add_argument(
        "--trace",
        metavar="DIR",
        help="keep, per target, each request's outcome, the workstations' traces and mr serve's state (decisions)",
    )
    parser.add_argument(
        "--loop",
        choices=("uvloop", "asyncio"),
        default="uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        help="mr serve's event loop",
    )
    parser.add_argument("--litellm", default=os.environ.get("MR_BENCH_LITELLM"), help="a virtualenv with LiteLLM")
    parser.add_argument(
        "--workload",
        choices=("lab", "scenario", "conversations"),
        default="lab",
        help="lab: the benchmark's own draws; scenario: the requests `mr simulate` submits for --scenario;"
        " conversations: the same with the chat and coder users in conversations behind their app's system prompt",
    )
    parser.add_argument(
        "--sharing",
        choices=SHARING,
        default=SHARING[0],
        help="how runners of two models share a GPU (workstations and simulator alike; docs/simulate.md)",
    )
    parser.add_argument(
        "--pool",
        choices=tuple(POOLS),
        default="lab",
        help="lab: the four Ollama workstations; replicas: the chat model on four vLLM-style replicas (issue 31's"
        " pool (a); with --workload scenario or conversations); six: the lab, a second RTX 4090 and an RTX A6000"
        " for the 70B; two-popular: the lab's GPUs with llama3.1:8b and gemma2:9b both popular and a 32B;"
        " mixed: the lab and a vLLM server listing the chat model by its Hugging Face id (_pools.py)",
    )
    parser.add_argument(
        "--scenario", action="store_true", help="print this lab as an `mr simulate` scenario (TOML) and exit"
    )
    ns = parser.parse_args()
    if ns.workload not in WORKLOADS[ns.pool]:
        parser.error(f"--pool {ns.pool} runs --workload {' or '.join(WORKLOADS[ns.pool])}, not {ns.workload}")
    if set(ns.only or ()) & set(LITELLM) and not ns.litellm:
        parser.error("the LiteLLM targets need a virtualenv with LiteLLM: pass --litellm PATH or set MR_BENCH_LITELLM")
    if ns.quick:
        ns.steady, ns.burst, ns.compression = 120.0, 90.0, 30.0
    if ns.scenario:
        print(
            scenario(
                ns.seed,
                ns.steady,
                ns.burst,
                TIMEOUT,
                burst=ns.overload,
                sharing=ns.sharing,
                conversations=ns.workload == "conversations",
                pool_name=ns.pool,
            )
        )
        sys.exit(0)
    done = asyncio.run(main(ns))
    if ns.json:
        Path(ns.json).write_text(json.dumps({f.name: f.rows for f in done}, indent=1))
