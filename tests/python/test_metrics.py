"""The metrics endpoint (--metrics_listen): Prometheus' text format, parsed with
prometheus_client's parser, checked value by value against GetStats after known
calls and steps; a real Prometheus (Debian's) scraping it with deploy/'s scrape
config; a taken or malformed port refused at start; the Grafana dashboard
asking only for what the daemon exports."""
import json
import os
import re
import resource
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request

import numpy as np
import pytest
import torch
import yaml
from prometheus_client.parser import text_string_to_metric_families

import optstate

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEP = "optstate.v1.OptimizerState/Step"
DESCRIBE = "optstate.v1.OptimizerState/DescribeGroup"


def scrape(port):
    """Every sample of /metrics: {(name, (sorted label pairs)): value}, and the raw text."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        assert reply.status == 200
        assert reply.headers["Content-Type"].startswith("text/plain")
        text = reply.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            assert key not in samples, f"sample {key} twice"
            samples[key] = sample.value
    return samples, text


def value(samples, name, **labels):
    key = (name, tuple(sorted(labels.items())))
    assert key in samples, f"no sample {name}{labels}"
    return samples[key]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_every_value_matches_get_stats_after_known_steps(fresh_daemons, tmp_path):
    daemon = fresh_daemons("--metrics_listen=127.0.0.1:0", f"--state_dir={tmp_path}",
                           "--checkpoint_interval=0")
    wire = optstate.Client(daemon.target, data_plane="wire")
    shared = optstate.Client(daemon.target, data_plane="shared_memory")
    before, _ = scrape(daemon.metrics_port)
    assert value(before, "optstate_groups") == 0
    assert value(before, "optstate_chunks_applied_total") == 0

    gen = torch.Generator().manual_seed(7)
    sizes = {"a": 70_000, "b": 1000}
    for name, n in sizes.items():
        wire.register(name, torch.randn(n, generator=gen))
    for step in (1, 2, 3):
        wire.step([(name, torch.randn(n, generator=gen), torch.empty(n))
                   for name, n in sizes.items()], step)
    wire.step([("b", torch.randn(1000, generator=gen), torch.empty(1000))], 3)  # a replay
    with pytest.raises(optstate.FailedPrecondition):  # b is at step 3: refused by the daemon.
        wire.step([("b", torch.randn(1000, generator=gen), torch.empty(1000))], 9)

    # Shared memory: the gradient and params in a region, 2 steps of 5000 float32.
    n = 5000
    raw = shared.allocate_shared_buffer(8 * n)
    floats = torch.from_numpy(raw).view(torch.float32)
    grad, params = floats[:n], floats[n:2 * n]
    shared.register("s", torch.randn(n, generator=gen))
    for step in (1, 2):
        grad.copy_(torch.randn(n, generator=gen))
        shared.step([("s", grad, params)], step)

    wire.checkpoint()
    for name in ("a", "b", "a", "s"):
        wire.describe(name)
    with pytest.raises(optstate.NotFound):
        wire.describe("missing")

    samples, text = scrape(daemon.metrics_port)
    stats = wire.stats()
    # The state, as GetStats sees it.
    assert value(samples, "optstate_groups") == stats["num_groups"] == 3
    assert value(samples, "optstate_group_elements") == stats["total_elements"] == 76_000
    assert value(samples, "optstate_host_bytes") == stats["host_bytes"]
    assert value(samples, "optstate_max_host_bytes") == stats["max_host_bytes"]
    assert value(samples, "optstate_chunks_applied_total") == stats["chunks_applied"]
    assert value(samples, "optstate_chunks_replayed_total") == stats["chunks_replayed"] == 1
    assert value(samples, "optstate_gradient_bytes_total") == stats["bytes_received"]
    assert value(samples, "optstate_params_bytes_total") == stats["bytes_sent"]
    steps_completed = sum(g["steps_completed"] for g in stats["groups"])
    assert value(samples, "optstate_steps_completed_total") == steps_completed == 3 + 3 + 2
    paging = stats["paging"]
    assert value(samples, "optstate_paging_page_ins_total") == paging["page_ins"]
    assert value(samples, "optstate_paging_page_outs_total") == paging["page_outs"]
    assert value(samples, "optstate_paging_bytes_total",
                 direction="host_to_device") == paging["bytes_host_to_device"]
    assert value(samples, "optstate_paging_bytes_total",
                 direction="device_to_host") == paging["bytes_device_to_host"]
    device = stats["device"]
    assert value(samples, "optstate_vram_budget_bytes") == device["budget_total_bytes"]
    assert value(samples, "optstate_vram_resident_bytes") == device["resident_bytes"]
    assert value(samples, "optstate_staging_pool_bytes") == device["staging_pool_bytes"]
    assert value(samples, "optstate_build_info", backend=stats["backend"],
                 cpu_kernel=stats["cpu_kernel"], paging_strategy=device["strategy"]) == 1
    # Checkpoints.
    assert value(samples, "optstate_checkpoints_written_total") == stats["checkpoints_written"] == 1
    assert value(samples, "optstate_checkpoint_failures_total") == stats["checkpoint_failures"]
    last = stats["last_checkpoint"]
    assert value(samples, "optstate_checkpoint_last_bytes") == last["bytes"] > 0
    assert value(samples, "optstate_checkpoint_last_step") == last["step"]
    assert value(samples, "optstate_checkpoint_last_duration_seconds") == pytest.approx(
        last["duration_seconds"])
    assert value(samples, "optstate_checkpoint_last_success_timestamp_seconds") == pytest.approx(
        last["finished_unix_micros"] / 1e6)
    # Regions.
    regions = stats["regions"]
    for metric, field in [("optstate_region_sessions", "sessions"),
                          ("optstate_regions", "regions"),
                          ("optstate_region_registered_bytes", "registered_bytes"),
                          ("optstate_region_mapped_bytes", "mapped_bytes"),
                          ("optstate_region_registrations_total", "registrations"),
                          ("optstate_step_plans", "step_plans"),
                          ("optstate_step_plan_uses_total", "step_plan_uses")]:
        assert value(samples, metric) == regions[field], metric
    assert regions["regions"] >= 1
    # The heap and the process.
    heap = wire.stats()["heap"]
    assert stats["heap"]["trims"] <= value(samples, "optstate_heap_trims_total") <= heap["trims"]
    with open(f"/proc/{daemon.process.pid}/statm") as statm:
        rss = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    assert abs(value(samples, "process_resident_memory_bytes") - rss) < 64 << 20
    assert abs(value(samples, "process_start_time_seconds") - time.time()) < 600

    # Calls (gRFC A66's names): the describes above, by status, as deltas.
    def calls(s, method, status=None):
        if status is None:
            return value(s, "grpc_server_call_started_total", grpc_method=method)
        key = ("grpc_server_call_duration_seconds_count",
               (("grpc_method", method), ("grpc_status", status)))
        return s.get(key, 0)
    assert calls(samples, DESCRIBE) - calls(before, DESCRIBE) == 5
    assert calls(samples, DESCRIBE, "OK") - calls(before, DESCRIBE, "OK") == 4
    assert calls(samples, DESCRIBE, "NOT_FOUND") - calls(before, DESCRIBE, "NOT_FOUND") == 1
    assert value(samples, "grpc_server_call_duration_seconds_bucket", grpc_method=DESCRIBE,
                 grpc_status="OK", le="+Inf") == calls(samples, DESCRIBE, "OK")
    assert calls(samples, STEP, "FAILED_PRECONDITION") == 1
    refused = value(samples, "optstate_refusals_total", code="FAILED_PRECONDITION")
    assert refused == 1, "the step past b's; nothing else was refused for its state"
    assert value(samples, "optstate_refusals_total", code="NOT_FOUND") == 1
    # Every method of the services is listed, and no label holds a group's name.
    started_methods = {dict(labels)["grpc_method"] for (name, labels) in samples
                       if name == "grpc_server_call_started_total"}
    assert {STEP, DESCRIBE, "optstate.v1.OptimizerState/GetStats", "grpc.health.v1.Health/Check",
            "other"} <= started_methods
    for (name, labels) in samples:
        for _, label_value in labels:
            assert label_value not in ("a", "b", "s", "missing"), (name, labels)

    # The step's phases: one sample per Step message in each (the one past b's step was
    # read and refused: no reply to send).
    receive = value(samples, "optstate_step_phase_seconds_count", phase="receive")
    compute = value(samples, "optstate_step_phase_seconds_count", phase="compute")
    send = value(samples, "optstate_step_phase_seconds_count", phase="send")
    assert receive == compute >= 6 and send == receive - 1
    for phase in ("receive", "compute", "send"):
        assert value(samples, "optstate_step_phase_seconds_sum", phase=phase) > 0
    # Bytes by data plane: the region's are exactly the two steps' gradient and params.
    assert value(samples, "optstate_data_plane_bytes_total",
                 plane="shared_memory", direction="in") == 2 * 4 * n
    assert value(samples, "optstate_data_plane_bytes_total",
                 plane="shared_memory", direction="out") == 2 * 4 * n
    wire_gradients = 4 * (3 * sum(sizes.values()) + 1000 + 1000)
    assert value(samples, "optstate_data_plane_bytes_total",
                 plane="wire", direction="in") > wire_gradients
    assert value(samples, "optstate_data_plane_bytes_total",
                 plane="wire", direction="out") > 4 * (3 * sum(sizes.values()) + 1000)

    # Deleting a group takes it out of GetStats' totals; the counters stay.
    wire.delete("a")
    after, _ = scrape(daemon.metrics_port)
    stats = wire.stats()
    assert value(after, "optstate_groups") == stats["num_groups"] == 2
    assert stats["chunks_applied"] < value(samples, "optstate_chunks_applied_total")
    for metric in ("optstate_chunks_applied_total", "optstate_steps_completed_total",
                   "optstate_gradient_bytes_total", "optstate_params_bytes_total"):
        assert value(after, metric) == value(samples, metric), metric
    assert "# TYPE optstate_chunks_applied_total counter" in text
    assert "# TYPE optstate_step_phase_seconds histogram" in text


def test_a_step_whose_client_gave_up_counts_as_cancelled_not_ok(fresh_daemons):
    # The Step reactor ends a stream its client gave up on (here: grpcurl's deadline
    # passes on an idle stream) with a status the client never sees; it was counted as
    # OK, so steps timing out were invisible to the refusal alerts.
    from test_readme_grpcurl import grpcurl_binary
    port = free_port()
    daemon = fresh_daemons(f"--metrics_listen=127.0.0.1:{port}")

    def counts():
        samples, _ = scrape(port)
        key = "grpc_server_call_duration_seconds_count"
        return (samples.get(("grpc_server_call_started_total", (("grpc_method", STEP),)), 0),
                samples.get((key, (("grpc_method", STEP), ("grpc_status", "OK"))), 0),
                samples.get((key, (("grpc_method", STEP), ("grpc_status", "CANCELLED"))), 0))

    before = counts()
    idle = subprocess.Popen([grpcurl_binary(), "-plaintext", "-max-time", "0.5", "-d", "@",
                             daemon.target, "optstate.v1.OptimizerState/Step"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)  # stdin stays open: no message is sent, nor the stream's end
    _, err = idle.communicate(timeout=30)  # grpcurl waits on stdin until it is closed
    assert idle.returncode != 0 and "DeadlineExceeded" in err, err
    for _ in range(50):  # the daemon's side of the call ends on its own threads
        started, ok, cancelled = (a - b for a, b in zip(counts(), before))
        if cancelled == 1:
            break
        time.sleep(0.05)
    assert (started, ok, cancelled) == (1, 0, 1)


def test_region_socket_refusals_count_among_the_refusals(fresh_daemons):
    # A region past --max_region_bytes was refused (ResourceExhausted) while
    # optstate_refusals_total{code="RESOURCE_EXHAUSTED"}, which the alert watches, stayed 0:
    # it counted gRPC calls alone.
    port = free_port()
    daemon = fresh_daemons(f"--metrics_listen=127.0.0.1:{port}", "--max_region_bytes=1048576")
    client = optstate.Client(daemon.target, data_plane="shared_memory")
    before, _ = scrape(port)
    client.allocate_shared_buffer(4096)
    with pytest.raises(optstate.ResourceExhausted, match="max_region_bytes"):
        client.allocate_shared_buffer(2 << 20)
    samples, _ = scrape(port)
    key = ("optstate_refusals_total", (("code", "RESOURCE_EXHAUSTED"),))
    assert samples[key] - before.get(key, 0) == 1
    assert value(samples, "optstate_region_registrations_total") == 1


def test_idle_connections_to_the_metrics_port_do_not_starve_scrapes(fresh_daemons):
    # civetweb holds a thread per connection until it closes or its request times out,
    # and had 2, then 8: as many idle connections (any peer of a 0.0.0.0 metrics port)
    # held every scrape up 30 s, then 5 s for each 8. 31 leave one of its 32 threads free.
    port = free_port()
    fresh_daemons(f"--metrics_listen=127.0.0.1:{port}")
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(31)]
    try:
        time.sleep(0.3)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=3) as reply:
            assert reply.status == 200 and b"optstate_groups" in reply.read()
    finally:
        for s in idle:
            s.close()


def test_a_real_prometheus_scrapes_the_daemon_with_deploys_config(fresh_daemons, client):
    prometheus = "/usr/bin/prometheus"
    assert os.path.exists(prometheus), "Debian's prometheus is missing: make test installs it"
    deploy = os.path.join(REPO, "deploy/prometheus")
    for check in (["check", "config", "prometheus.yml"], ["check", "rules", "alerts.yml"],
                  ["test", "rules", "alerts_test.yml"]):
        run = subprocess.run(["/usr/bin/promtool", *check], cwd=deploy, capture_output=True,
                             text=True, timeout=60)
        assert run.returncode == 0, run.stdout + run.stderr
    daemon = fresh_daemons("--metrics_listen=127.0.0.1:0")
    steps = optstate.Client(daemon.target)
    steps.register("w", np.zeros(3000, np.float32))
    for step in (1, 2, 3):
        steps.step("w", step, np.ones(3000, np.float32), np.empty(3000, np.float32))
    expected = steps.stats()["chunks_applied"]
    with open(os.path.join(REPO, "deploy/prometheus/prometheus.yml")) as f:
        config = yaml.safe_load(f)
    # deploy/'s config as it is, but for the interval and the target: this daemon's.
    config["global"]["scrape_interval"] = "1s"
    config["rule_files"] = [os.path.join(deploy, name) for name in config["rule_files"]]
    job = next(j for j in config["scrape_configs"] if j["job_name"] == "optstated")
    job["static_configs"] = [{"targets": [f"127.0.0.1:{daemon.metrics_port}"]}]
    web = free_port()
    with tempfile.TemporaryDirectory() as work:
        path = os.path.join(work, "prometheus.yml")
        with open(path, "w") as f:
            yaml.safe_dump(config, f)
        process = subprocess.Popen(
            [prometheus, f"--config.file={path}", f"--storage.tsdb.path={work}/data",
             f"--web.listen-address=127.0.0.1:{web}", "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            def query(expr):
                url = f"http://127.0.0.1:{web}/api/v1/query?" + urllib.parse.urlencode(
                    {"query": expr})
                with urllib.request.urlopen(url, timeout=5) as reply:
                    body = json.load(reply)
                assert body["status"] == "success", body
                return body["data"]["result"]
            deadline, result = time.time() + 90, []
            while time.time() < deadline:
                assert process.poll() is None, process.stderr.read()
                try:
                    result = query('optstate_chunks_applied_total{job="optstated"}')
                except OSError:
                    result = []  # Not serving yet.
                if result:
                    break
                time.sleep(0.5)
            assert result, "Prometheus never scraped optstate_chunks_applied_total"
            assert float(result[0]["value"][1]) == expected
            up = query('up{job="optstated"}')
            assert float(up[0]["value"][1]) == 1
        finally:
            process.terminate()
            process.wait(timeout=30)


def test_a_taken_metrics_port_stops_the_start_naming_it(fresh_daemons):
    binary = os.environ["OPTSTATED"]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = subprocess.run([binary, "--listen=127.0.0.1:0", f"--metrics_listen=127.0.0.1:{port}"],
                             capture_output=True, text=True, timeout=60)
    assert run.returncode != 0
    assert f"127.0.0.1:{port}" in run.stderr and "metrics" in run.stderr, run.stderr
    assert "listening on port" not in run.stdout
    # A name, and parts past 255: civetweb took 256.0.0.0 for 0.0.0.0 (each part modulo
    # 256), so a typo served the metrics on every interface.
    for listen in ("localhost:9464", "256.0.0.0:0", "383.0.0.1:0", "1.2.3:0", "1.2.3.4.5:0"):
        run = subprocess.run([binary, "--listen=127.0.0.1:0", f"--metrics_listen={listen}"],
                             capture_output=True, text=True, timeout=60)
        assert run.returncode != 0 and "--metrics_listen must be IP:PORT" in run.stderr, \
            (listen, run.stderr)
        assert "listening on port" not in run.stdout, listen
    # Debian's civetweb has no IPv6: an IPv6 address failed as "the port is taken or the
    # address is not this host's", though ::1 was. A civetweb with IPv6 serves it.
    six = subprocess.Popen([binary, "--listen=127.0.0.1:0", "--metrics_listen=[::1]:0"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = six.communicate(timeout=10)
        assert six.returncode != 0 and "has no IPv6; give an IPv4 address" in err, err
    except subprocess.TimeoutExpired:
        six.terminate()
        out, err = six.communicate(timeout=30)
        assert "serving metrics on port" in out, (out, err)


def test_the_grafana_dashboard_asks_only_for_exported_metrics(fresh_daemons, tmp_path):
    # With --state_dir: the checkpoint metrics exist only then.
    daemon = fresh_daemons("--metrics_listen=127.0.0.1:0", f"--state_dir={tmp_path}")
    optstate.Client(daemon.target).stats()  # A call ended: its duration series exists.
    _, text = scrape(daemon.metrics_port)
    exported = set()
    for family in text_string_to_metric_families(text):
        exported.update(sample.name for sample in family.samples)
    with open(os.path.join(REPO, "deploy/grafana/optstate-dashboard.json")) as f:
        dashboard = json.load(f)
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    assert len(exprs) >= 10
    for expr in exprs:
        names = set(re.findall(r"\b((?:optstate|grpc_server|process)_[a-z_]+)\b", expr))
        assert names, expr
        assert names <= exported, (expr, names - exported)


def test_an_auto_client_refused_a_region_connection_steps_over_the_wire_and_asks_later(
        fresh_daemons):
    # A kAuto client refused for the daemon's cap on region connections (a quarter of its
    # descriptor limit) asked again at every step: a GetDataPlane call and a refused
    # connection each time. It now steps over the wire and asks again after 10 s.
    port = free_port()
    daemon = fresh_daemons(f"--metrics_listen=127.0.0.1:{port}")
    resource.prlimit(daemon.process.pid, resource.RLIMIT_NOFILE, (64, 64))  # a cap of 16
    holders = []
    for i in range(16):
        c = optstate.Client(daemon.target, data_plane="shared_memory")
        c.register(f"held{i}", 64)
        c.step([(f"held{i}", np.ones(64, np.float32), np.empty(64, np.float32))], 1)
        holders.append(c)
    with pytest.raises(optstate.ResourceExhausted, match="as many as it takes"):
        optstate.Client(daemon.target, data_plane="shared_memory").allocate_shared_buffer(4096)
    before, _ = scrape(port)
    auto = optstate.Client(daemon.target)  # kAuto
    auto.register("late", 64)
    out = np.empty(64, np.float32)
    for step in range(1, 6):
        auto.step([("late", np.full(64, 0.5, np.float32), out)], step)
    samples, _ = scrape(port)
    key = ("optstate_refusals_total", (("code", "RESOURCE_EXHAUSTED"),))
    assert samples[key] - before.get(key, 0) == 1, "asked once, then over the wire"
    assert auto.describe("late").max_step == 5
    for c in holders:
        c.close()
