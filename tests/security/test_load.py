"""The load test, all at once against one running job: 200 concurrent
REST clients asking for its status and checkpoints, while 50 garbage and 50
silent TCP connections hit its control port and each task's data port. The
job completes with exact output and no restart, and every well-behaved
client gets its answer."""

from __future__ import annotations

import contextlib
import json
import os
import random
import threading
import time
from pathlib import Path

import pytest

from lockgate import RestConfig
from lockgate.web import discovery
from tests.fixtures import check_exact_sums
from tests.security.ports import data_ports, garbage, silent, sums_job
from tests.security.rest_peers import TOKEN, exchange, request, statuses

CLIENTS = 200
REQUESTS_EACH = 2
GARBAGE = SILENT = 50


@pytest.mark.timeout(240)
def test_rest_clients_and_hostile_peers_on_every_port_of_one_running_job(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCKGATE_HOME", str(tmp_path / "home"))
    n, keys = 20_000, 7
    client = sums_job(tmp_path, n=n, keys=keys, delay=3.0).start(
        launcher="local", rest=RestConfig(token=TOKEN))
    answers: list[tuple[int, bool]] = []
    lock = threading.Lock()
    try:
        deadline = time.monotonic() + 60
        while not (found := discovery.discover()):
            assert time.monotonic() < deadline, "no discovery file within 60 s"
            time.sleep(0.05)
        rest_port = int(found[0].url.rpartition(":")[2])
        ports = list(data_ports(os.getpid(), want=2).values())
        ports.append(client.master.server.address[1])
        start = threading.Barrier(CLIENTS + 1, timeout=60)

        def rest_client(i: int) -> None:
            start.wait()
            for r in range(REQUESTS_EACH):
                path = f"/jobs/{client.job_id}" + ("/checkpoints" if (i + r) % 2 else "")
                try:
                    answer = exchange(rest_port, request(path), timeout=60)
                except OSError:
                    answer = b""
                ok = statuses(answer) == [200]
                if ok and "checkpoints" not in path:
                    ok = json.loads(answer.partition(b"\r\n\r\n")[2]).get("id") == client.job_id
                with lock:
                    answers.append((statuses(answer)[0] if statuses(answer) else 0, ok))

        threads = [threading.Thread(target=rest_client, args=(i,), daemon=True)
                   for i in range(CLIENTS)]
        for t in threads:
            t.start()
        rng = random.Random(7)
        with contextlib.ExitStack() as stack:
            for port in ports:  # while the data ports still take connections
                stack.enter_context(silent(port, SILENT))
            start.wait()  # the REST clients go now, beside the hostile peers
            challenged = {port: sum(garbage(port, rng) for _ in range(GARBAGE))
                          for port in ports}
            assert all(challenged.values()), f"a port took no connection: {challenged}"
            for t in threads:
                t.join(120)
        result = client.result(timeout=120)
    finally:
        with contextlib.suppress(Exception):
            client.cancel(timeout=30)
    assert len(answers) == CLIENTS * REQUESTS_EACH
    failed = [a for a in answers if not a[1]]
    assert not failed, f"{len(failed)} of {len(answers)} REST requests failed: {failed[:5]}"
    assert result.status == "finished" and result.restarts == 0, result.failures
    check_exact_sums(tmp_path / "out", n, keys)
