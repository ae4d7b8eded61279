"""What the dashboard costs a job: W1 (the pipeline of ``bench_sums.py``, a
checkpoint every second, local launcher) with and without the dashboard
polled every second, in alternating pairs.

    python benchmarks/bench_dashboard.py [--n 6000000] [--pairs 4] [--browser]

"Polled" is what an open dashboard asks the driver every second (its page's
two requests, ``/jobs/<id>/metrics`` and ``/jobs/<id>/checkpoints``) plus a
Prometheus scrape of ``/metrics``, from a thread of this process; with
``--browser`` a real headless chromium has the page open instead (on the same
machine, so its own rendering competes for the CPU too). Prints records/s and
the CPU seconds of the driver process per run, and the
medians. The task processes' work is the same in both (they report their
figures once a second whether anyone looks or not).
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from lockgate import CheckpointConfig, Pipeline, RestConfig
from lockgate.connectors import FileSink, SequenceSource

TOKEN = "bench-dashboard-token-0123456789"
PORT = 18931


def _cpu() -> float:
    """CPU seconds of this process: the driver, its REST server, and the
    poller's own client side (so an upper bound of what serving costs)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    return me.ru_utime + me.ru_stime


def _get(path: str) -> bytes:
    request = urllib.request.Request(f"http://127.0.0.1:{PORT}{path}",
                                     headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=10) as r:
        data: bytes = r.read()
        return data


def _poll(stop: threading.Event, counter: list[int], latency: list[float]) -> None:
    while not stop.wait(1.0):
        try:
            t0 = time.perf_counter()
            for job in json.loads(_get("/jobs"))["jobs"]:
                _get(f"/jobs/{job['id']}/metrics")
                _get(f"/jobs/{job['id']}/checkpoints")
            _get("/metrics")
            latency.append(time.perf_counter() - t0)
            counter[0] += 1
        except OSError:
            pass  # the job has not started serving yet, or has ended


def _browse(stop: threading.Event, counter: list[int], latency: list[float]) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        while not stop.is_set():
            try:
                jobs = json.loads(_get("/jobs"))["jobs"]
            except OSError:
                jobs = []
            if jobs:
                try:
                    driver.get(f"http://127.0.0.1:{PORT}/ui#token={TOKEN}&job={jobs[0]['id']}")
                except Exception:
                    stop.wait(0.1)
                    continue
                counter[0] += 1
                stop.wait()
            else:
                stop.wait(0.1)
    finally:
        driver.quit()


def run(n: int, parallelism: int, keys: int, polled: bool, browser: bool) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="lockgate-bench-"))
    stop = threading.Event()
    counter = [0]
    latency: list[float] = []
    poller = threading.Thread(target=_browse if browser else _poll,
                              args=(stop, counter, latency), daemon=True)
    try:
        p = Pipeline("bench-sums", parallelism=parallelism,
                     checkpoint=CheckpointConfig(interval=1.0, storage=str(tmp / "chk")))
        (p.source(SequenceSource(1, n), uid="numbers")
           .key_by(lambda x: x % keys)
           .reduce(lambda a, b: a + b, uid="sums")
           .sink(FileSink(str(tmp / "out"), format="jsonl"), uid="out"))
        if polled:
            poller.start()
        cpu0, t0 = _cpu(), time.perf_counter()
        p.run(launcher="local", rest=RestConfig(port=PORT, token=TOKEN), progress=False)
        wall, cpu = time.perf_counter() - t0, _cpu() - cpu0
        return {"wall": wall, "records_per_s": n / wall, "cpu": cpu, "polls": counter[0],
                "poll_ms": statistics.median(latency) * 1000 if latency else None}
    finally:
        stop.set()
        if poller.is_alive():
            poller.join(30)
        shutil.rmtree(tmp, ignore_errors=True)


def serve_cost(polls: int = 200) -> float:
    """CPU seconds of this process per poll (the three requests, both the
    server's and the client's side: an upper bound), on a running job of
    ``bench_sums``' shape rate-limited to 200,000 records/s."""
    tmp = Path(tempfile.mkdtemp(prefix="lockgate-bench-"))
    try:
        p = Pipeline("bench-sums", parallelism=2,
                     checkpoint=CheckpointConfig(interval=1.0, storage=str(tmp / "chk")))
        (p.source(SequenceSource(1, None, rate=200_000), uid="numbers")
           .key_by(lambda x: x % 1000)
           .reduce(lambda a, b: a + b, uid="sums")
           .sink(FileSink(str(tmp / "out"), format="jsonl"), uid="out"))
        client = p.start(launcher="local", rest=RestConfig(port=PORT, token=TOKEN))
        try:
            while client.master.coordinator.completed_count < 3:
                time.sleep(0.1)
            job = client.job_id
            t0 = time.process_time()
            for _ in range(polls):
                _get(f"/jobs/{job}/metrics")
                _get(f"/jobs/{job}/checkpoints")
                _get("/metrics")
            return (time.process_time() - t0) / polls
        finally:
            client.cancel(timeout=120)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=6_000_000)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--keys", type=int, default=1000)
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--browser", action="store_true", help="a headless chromium has the "
                    "page open, instead of a thread asking what the page asks")
    ap.add_argument("--serve-cost", action="store_true", help="only measure the CPU "
                    "time one poll costs the driver, on a running job")
    args = ap.parse_args()
    if args.serve_cost:
        cost = serve_cost()
        print(f"one poll (3 requests): {cost * 1000:.2f} ms of CPU in the driver process "
              f"(server and client sides): {cost * 100:.2f}% of one core at one poll a second")
        return
    results: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    for i in range(args.pairs):
        for polled in ((False, True) if i % 2 == 0 else (True, False)):
            r = run(args.n, args.parallelism, args.keys, polled, args.browser)
            results[polled].append(r)
            print(f"pair {i + 1} {'dashboard' if polled else 'plain    '}: "
                  f"{r['records_per_s'] / 1e6:.2f} M/s, {r['wall']:.1f} s, "
                  f"driver CPU {r['cpu']:.2f} s"
                  + (f", {r['polls']} polls of {r['poll_ms']:.1f} ms" if r["poll_ms"] else ""),
                  flush=True)
    for polled in (False, True):
        rs = results[polled]
        print(f"median {'with the dashboard' if polled else 'without'}: "
              f"{statistics.median(r['records_per_s'] for r in rs) / 1e6:.2f} M/s, "
              f"driver CPU {statistics.median(r['cpu'] for r in rs):.2f} s")


if __name__ == "__main__":
    main()
