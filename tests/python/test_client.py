"""optstate.Client: the C++ client's calls from Python, buffers in place, errors by code."""
import os
import re
import signal
import threading
import time

import numpy as np
import pytest
import torch

import optstate
from reference import bits_equal, compare, ieee_adamw_


def test_register_describe_list_delete(client, prefix):
    values = np.arange(1000, dtype=np.float32)
    info = client.register(prefix + "w", values, lr=0.01, betas=(0.8, 0.95), eps=1e-6,
                           weight_decay=0.1)
    assert (info.name, info.num_elements, info.created) == (prefix + "w", 1000, True)
    assert (info.lr, info.betas, info.eps, info.weight_decay) == (0.01, (0.8, 0.95), 1e-6, 0.1)
    assert (info.min_step, info.max_step) == (0, 0) and info.page_elements > 0
    again = client.register(prefix + "w", values, lr=0.01, betas=(0.8, 0.95), eps=1e-6,
                            weight_decay=0.1)
    assert not again.created
    assert client.describe(prefix + "w").num_elements == 1000
    assert prefix + "w" in [g.name for g in client.list_groups()]
    client.delete(prefix + "w")
    with pytest.raises(optstate.NotFound) as e:
        client.describe(prefix + "w")
    assert prefix + "w" in str(e.value) and e.value.code == "NOT_FOUND"


def test_step_numpy_matches_reference_bit_for_bit(client, prefix):
    gen = torch.Generator().manual_seed(1)
    p = torch.randn(300_001, generator=gen)
    m, v = torch.zeros_like(p), torch.zeros_like(p)
    client.register(prefix + "w", p.numpy(), lr=1e-3, weight_decay=0.05)
    out = np.empty(p.numel(), np.float32)
    for step, lr in [(1, 1e-3), (2, 3e-3), (3, 0.0123456789)]:
        g = torch.randn(p.numel(), generator=gen)
        client.step(prefix + "w", step, g.numpy(), out, lr=lr)
        ieee_adamw_(p, g, m, v, step, lr, weight_decay=0.05)
        compare(f"params after step {step}", torch.from_numpy(out), p, max_ulp=0)
    assert client.describe(prefix + "w").min_step == 3


def test_step_many_groups_in_one_call_writes_tensors_in_place(client, prefix):
    a, b = torch.randn(64, 33), torch.randn(1000)
    ref_a, ref_b = a.clone(), b.clone()
    client.register(prefix + "a", a)
    client.register(prefix + "b", b)
    ga, gb = torch.randn(64, 33), torch.randn(1000)
    pointer = a.data_ptr()
    client.step([(prefix + "a", ga, a), (prefix + "b", gb)], 1)  # b's params discarded
    assert a.data_ptr() == pointer
    ieee_adamw_(ref_a, ga, torch.zeros_like(a), torch.zeros_like(a), 1, 1e-3)
    assert bits_equal(a, ref_a)
    assert bits_equal(b, ref_b)  # not written
    out_b = torch.empty(1000)
    client.step([(prefix + "b", gb, out_b)], 1)  # a repeated step replays: current params
    ieee_adamw_(ref_b, gb, torch.zeros_like(b), torch.zeros_like(b), 1, 1e-3)
    assert bits_equal(out_b, ref_b)
    stats = client.stats()
    group = {g["info"]["name"]: g for g in stats["groups"]}[prefix + "b"]
    assert group["chunks_applied"] == 1 and group["chunks_replayed"] == 1


def test_step_bfloat16_and_float16_buffers_travel_as_they_are(client, prefix):
    gen = torch.Generator().manual_seed(2)
    for dtype in (torch.bfloat16, torch.float16):
        name = f"{prefix}{dtype}"
        model = torch.randn(5000, generator=gen).to(dtype)
        master = model.float()
        m, v = torch.zeros_like(master), torch.zeros_like(master)
        client.register(name, master)
        for step in (1, 2):
            g = (torch.randn(5000, generator=gen) * 0.1).to(dtype)
            client.step([(name, g, model)], step, lr=1e-2)
            ieee_adamw_(master, g.float(), m, v, step, 1e-2)
            assert bits_equal(model, master.to(dtype)), dtype


def test_float32_buffers_narrowed_to_wire_dtype(client, prefix):
    p = torch.randn(4096)
    master = p.clone()
    client.register(prefix + "w", p)
    g = torch.randn(4096)
    client.step(prefix + "w", 1, g, p, wire_dtype="bfloat16")
    ieee_adamw_(master, g.bfloat16().float(), torch.zeros(4096), torch.zeros(4096), 1, 1e-3)
    assert bits_equal(p, master.bfloat16().float())


def test_wire_dtype_may_be_the_wire_type_enum(client, prefix):
    assert [t.name for t in optstate.WireType] == ["float32", "bfloat16", "float16"]
    p = torch.randn(4096)
    by_name = p.clone()
    client.register(prefix + "enum", p)
    client.register(prefix + "name", by_name)
    g = torch.randn(4096)
    client.step(prefix + "enum", 1, g, p, wire_dtype=optstate.WireType.bfloat16)
    client.step(prefix + "name", 1, g, by_name, wire_dtype="bfloat16")
    assert bits_equal(p, by_name)


def _unchanged(client, name):
    info = client.describe(name)
    return info.min_step, info.max_step


@pytest.mark.parametrize("bad, error, words", [
    (lambda n: np.zeros(n, np.float64), TypeError, "gradient: dtype float64"),
    (lambda n: np.zeros(2 * n, np.float32)[::2], ValueError, "gradient: the array is not contiguous"),
    (lambda n: torch.zeros(n, requires_grad=True), TypeError, "gradient: a tensor that requires grad"),
    (lambda n: [0.0] * n, TypeError, "gradient: expected a numpy array or a torch CPU tensor"),
    (lambda n: torch.zeros(n, dtype=torch.int32), TypeError, "gradient: dtype int32"),
])
def test_bad_gradient_buffer_sends_nothing(client, prefix, bad, error, words):
    client.register(prefix + "w", 100)
    applied = client.stats()["chunks_applied"]
    with pytest.raises(error, match=words):
        client.step(prefix + "w", 1, bad(100))
    assert _unchanged(client, prefix + "w") == (0, 0)
    assert client.stats()["chunks_applied"] == applied


def test_bad_params_out_and_group_list_send_nothing(client, prefix):
    client.register(prefix + "w", 100)
    readonly = np.zeros(100, np.float32)
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match="groups\\[0\\].params_out: the array is read-only"):
        client.step([(prefix + "w", np.zeros(100, np.float32), readonly)], 1)
    with pytest.raises(ValueError, match="params_out: the array is not contiguous"):
        client.step(prefix + "w", 1, np.zeros(100, np.float32), torch.zeros(100, 2)[:, 0])
    with pytest.raises(TypeError, match="groups\\[1\\]: expected a tuple"):
        client.step([(prefix + "w", np.zeros(100, np.float32)), prefix + "w"], 1)
    with pytest.raises(ValueError, match="gradient buffers mix bfloat16 and float16"):
        client.step([(prefix + "w", torch.zeros(100, dtype=torch.bfloat16)),
                     (prefix + "w", torch.zeros(100, dtype=torch.float16))], 1)
    with pytest.raises(ValueError, match="wire dtype must be float32, bfloat16 or float16"):
        client.step(prefix + "w", 1, np.zeros(100, np.float32), wire_dtype="int8")
    assert _unchanged(client, prefix + "w") == (0, 0)


def test_errors_carry_code_message_and_target(client, daemon, prefix):
    client.register(prefix + "w", np.ones(10, np.float32), lr=1e-3)
    with pytest.raises(optstate.AlreadyExists) as e:
        client.register(prefix + "w", np.ones(10, np.float32), lr=2e-3)
    assert e.value.code == "ALREADY_EXISTS" and e.value.code_value == 6
    assert e.value.target == daemon.target and daemon.target in str(e.value)
    assert prefix + "w" in e.value.message
    assert client.describe(prefix + "w").lr == 1e-3

    gradient = np.ones(10, np.float32)
    gradient[7] = np.inf
    with pytest.raises(optstate.InvalidArgument, match="element 7 is inf"):
        client.step(prefix + "w", 1, gradient)
    with pytest.raises(optstate.InvalidArgument, match="length|elements"):
        client.step(prefix + "w", 1, np.ones(11, np.float32))
    with pytest.raises(optstate.FailedPrecondition):
        client.step(prefix + "w", 3, np.ones(10, np.float32))  # skips step 1 and 2
    assert _unchanged(client, prefix + "w") == (0, 0)
    with pytest.raises(optstate.NotFound):
        client.step(prefix + "nothing", 1, np.ones(10, np.float32))
    assert isinstance(e.value, optstate.Error)


def test_unreachable_target_is_unavailable_naming_it():
    c = optstate.Client("127.0.0.1:1", max_attempts=2, initial_backoff=0.01)
    with pytest.raises(optstate.Unavailable) as e:
        c.register("w", np.ones(4, np.float32))
    assert "127.0.0.1:1" in str(e.value) and e.value.target == "127.0.0.1:1"


def test_bad_options_are_invalid_argument():
    with pytest.raises(optstate.InvalidArgument, match="max_attempts"):
        optstate.Client("127.0.0.1:1", max_attempts=0)
    # Every refused option is optstate.InvalidArgument (a ValueError too), so that
    # `except optstate.Error` sees each; none reached a daemon, so none names one.
    for kwargs, what in (({"attempt_timeout": 0}, "attempt_timeout"),
                         ({"connect_timeout": -1}, "connect_timeout"),
                         ({"initial_backoff": float("nan")}, "initial_backoff"),
                         ({"data_plane": "bogus"}, "data_plane must be")):
        with pytest.raises(optstate.InvalidArgument, match=what) as e:
            optstate.Client("127.0.0.1:1", **kwargs)
        assert isinstance(e.value, ValueError) and e.value.target is None, kwargs


def test_client_keyword_defaults_are_the_cpp_client_options_defaults():
    # _default_client_options(): a default-constructed optstate::ClientOptions, in Client()'s
    # terms (seconds, the data plane's name). nanobind's __nb_signature__ holds the default
    # values of Client()'s keywords as the objects Python passes.
    cpp = optstate._optstate._default_client_options()
    signature, _, defaults = optstate.Client.__init__.__nb_signature__[0]
    keywords = {name: defaults[int(i)]
                for name, i in re.findall(r"(\w+): [^,=]+ = \\(\d+)", signature)}
    assert keywords == cpp
    assert set(cpp) == {"max_attempts", "initial_backoff", "max_backoff", "attempt_timeout",
                        "connect_timeout", "max_message_bytes", "chunk_bytes",
                        "max_chunks_in_flight", "data_plane", "token", "tls", "tls_root_ca",
                        "tls_cert", "tls_key", "tls_server_name", "lease_holder", "lease_job",
                        "lease_takeover", "reconnect_timeout", "members_from_dns"}
    optstate.Client("127.0.0.1:1", **cpp)  # valid options, as the C++ client takes them


def test_calls_release_the_gil():
    # Three attempts with 0.2 s and 0.4 s of backoff between them: about 0.6 s
    # inside the C++ client, during which this thread must keep running.
    c = optstate.Client("127.0.0.1:1", max_attempts=3, initial_backoff=0.2, max_backoff=0.4)
    done = threading.Event()

    def call():
        with pytest.raises(optstate.Unavailable):
            c.list_groups()
        done.set()

    thread = threading.Thread(target=call)
    ticks = 0
    start = time.monotonic()
    thread.start()
    while not done.is_set():
        ticks += 1
        time.sleep(0.001)
    thread.join()
    elapsed = time.monotonic() - start
    assert elapsed > 0.5
    assert ticks > 100, f"the calling thread held the GIL: {ticks} ticks in {elapsed:.2f} s"


def test_a_registration_over_the_memory_budget_is_resource_exhausted(prefix):
    from conftest import Daemon
    small = Daemon("--max_host_bytes=1000000")
    try:
        c = optstate.Client(small.target)
        with pytest.raises(optstate.ResourceExhausted) as e:
            c.register(prefix + "big", 1_000_000)  # 12 MB of state
        assert e.value.code == "RESOURCE_EXHAUSTED" and small.target in str(e.value)
        assert c.list_groups() == []
    finally:
        assert small.stop() == 0


def test_a_daemon_that_never_answers_is_deadline_exceeded():
    import socket
    silent = socket.create_server(("127.0.0.1", 0))  # accepts connections, says nothing
    try:
        target = f"127.0.0.1:{silent.getsockname()[1]}"
        c = optstate.Client(target, max_attempts=1, attempt_timeout=0.3)
        start = time.monotonic()
        with pytest.raises(optstate.DeadlineExceeded) as e:
            c.list_groups()
        assert time.monotonic() - start < 5 and target in str(e.value)
    finally:
        silent.close()


def test_each_group_of_a_call_may_carry_its_own_lr(client, prefix):
    gen = torch.Generator().manual_seed(7)
    a, b = torch.randn(1000, generator=gen), torch.randn(1000, generator=gen)
    refs = [a.clone(), b.clone()]
    client.register(prefix + "a", a)
    client.register(prefix + "b", b)
    ga, gb = torch.randn(1000, generator=gen), torch.randn(1000, generator=gen)
    client.step([(prefix + "a", ga, a, 0.05), (prefix + "b", gb, b, None)], 1, lr=0.002)
    ieee_adamw_(refs[0], ga, torch.zeros(1000), torch.zeros(1000), 1, 0.05)
    ieee_adamw_(refs[1], gb, torch.zeros(1000), torch.zeros(1000), 1, 0.002)
    assert bits_equal(a, refs[0]) and bits_equal(b, refs[1])
    with pytest.raises(TypeError, match="groups\\[0\\].lr: expected a float"):
        client.step([(prefix + "a", ga, a, "fast")], 2)
    with pytest.raises(optstate.InvalidArgument, match="lr"):
        client.step([(prefix + "a", ga, a, -1.0)], 2)
    assert client.describe(prefix + "a").min_step == 1


@pytest.mark.parametrize("where", ["gradient", "params_out"])
def test_a_tensor_not_on_the_cpu_is_refused_naming_its_group_and_sends_nothing(client, prefix,
                                                                              where):
    """Any device but the CPU is refused the same way (a CPU-only torch makes meta
    tensors; a CUDA tensor takes the same check), before anything is sent: also the other
    groups of the same call are not stepped."""
    good, bad = prefix + "good", prefix + "bad"
    client.register(good, np.arange(64, dtype=np.float32))
    client.register(bad, np.arange(64, dtype=np.float32))
    applied = client.stats()["chunks_applied"]
    meta = torch.zeros(64, device="meta")
    buffers = (meta, torch.zeros(64)) if where == "gradient" else (torch.ones(64), meta)
    single = f"group '{bad}' {where}: the tensor is on device 'meta', not the CPU"
    with pytest.raises(ValueError, match=single):
        client.step(bad, 1, *buffers)
    listed = f"group '{bad}', groups\\[1\\].{where}: the tensor is on device 'meta', not the CPU"
    with pytest.raises(ValueError, match=listed):
        client.step([(good, torch.ones(64), torch.zeros(64)), (bad, *buffers)], 1)
    for name in (good, bad):
        assert _unchanged(client, name) == (0, 0)
        assert np.array_equal(client.export_state(name).params, np.arange(64, dtype=np.float32))
    assert client.stats()["chunks_applied"] == applied


def _widest_kernel_by_cpuinfo():
    """The CPU kernel's widest path by the flags the kernel lists (not asking the daemon)."""
    flags = set()
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    if not {"avx2", "fma", "f16c"} <= flags:
        return "scalar"
    return "avx512" if "avx512f" in flags else "avx2"


def test_stats_report_the_cpu_kernel_path_and_cpu_kernel_chooses_it(fresh_daemons):
    widest = _widest_kernel_by_cpuinfo()
    assert optstate.Client(fresh_daemons().target).stats()["cpu_kernel"] == widest
    scalar = fresh_daemons("--cpu_kernel=scalar")
    assert optstate.Client(scalar.target).stats()["cpu_kernel"] == "scalar"


def test_stats_report_regions_and_checkpoints(fresh_daemons, prefix, tmp_path):
    daemon = fresh_daemons(f"--state_dir={tmp_path}")
    wire = optstate.Client(daemon.target, data_plane="wire")
    wire.register(prefix + "w", 4096)
    wire.step(prefix + "w", 1, torch.ones(4096), torch.empty(4096))
    stats = wire.stats()
    assert stats["regions"] == {"sessions": 0, "regions": 0, "registered_bytes": 0,
                                "mapped_bytes": 0, "registrations": 0, "step_plans": 0,
                                "step_plan_uses": 0}
    assert stats["last_checkpoint"] is None
    assert stats["checkpoints_written"] == 0 and stats["checkpoint_failures"] == 0
    assert stats["restored_checkpoint_id"] == "" and stats["restore_refusals"] == []

    local = optstate.Client(daemon.target)  # data_plane="auto": the daemon is on this host
    local.step(prefix + "w", 2, torch.ones(4096), torch.empty(4096))
    regions = local.stats()["regions"]
    assert regions["sessions"] == 1 and regions["regions"] == 1 and regions["registrations"] == 1
    assert regions["registered_bytes"] >= 4096 * 8
    assert regions["mapped_bytes"] == regions["registered_bytes"]

    checkpoint = wire.checkpoint([prefix + "w"], wait_for_step=2)
    assert checkpoint["step"] == 2 and checkpoint["bytes"] > 4096 * 12
    stats = wire.stats()
    assert stats["checkpoints_written"] == 1
    assert stats["last_checkpoint"]["id"] == checkpoint["id"]
    assert stats["last_checkpoint"]["step"] == 2
    assert stats["last_checkpoint"]["bytes"] > 4096 * 12
    assert stats["last_checkpoint"]["finished_unix_micros"] > 0


def test_checkpoint_refusals_raise_their_codes(fresh_daemons, prefix, tmp_path):
    plain = optstate.Client(fresh_daemons().target)
    with pytest.raises(optstate.FailedPrecondition, match="state_dir"):
        plain.checkpoint()
    daemon = fresh_daemons(f"--state_dir={tmp_path}")
    client = optstate.Client(daemon.target, attempt_timeout=1.0)
    client.register(prefix + "g", 1000)
    client.step(prefix + "g", 1, torch.ones(1000), torch.empty(1000))
    client.step(prefix + "g", 2, torch.ones(1000), torch.empty(1000))
    with pytest.raises(optstate.NotFound):
        client.checkpoint([prefix + "absent"], wait_for_step=2)
    with pytest.raises(optstate.FailedPrecondition, match="2"):
        client.checkpoint([prefix + "g"], wait_for_step=1)
    # The daemon answers before the caller's deadline, naming the page behind (the
    # caller's own timer ended the call first, with a bare "Deadline Exceeded").
    with pytest.raises(optstate.DeadlineExceeded,
                       match=f"group '{prefix}g' page 0 is at step 2 and did not reach step 3"):
        client.checkpoint([prefix + "g"], wait_for_step=3)
    assert client.stats()["checkpoints_written"] == 0
    assert client.describe(prefix + "g").min_step == 2


def test_import_state_takes_a_diverged_runs_state_only_when_told(client, prefix):
    # Finite gradients at float32's edge leave exp_avg -inf and params nan (torch's AdamW
    # too). A plain import refuses them, as it refuses any value a healthy run never holds;
    # accept_non_finite=True takes them bit for bit (what a Rebalance and load_state_dict do).
    name = prefix + "diverged"
    client.register(name, np.ones(1000, np.float32))
    out = np.empty(1000, np.float32)
    client.step(name, 1, np.full(1000, 3.4e38, np.float32), out)
    client.step(name, 2, np.full(1000, -3.4e38, np.float32), out)
    state = client.export_state(name)
    assert np.isnan(state.params).all() and np.isinf(state.exp_avg).all()
    with pytest.raises(optstate.InvalidArgument, match="params element 0 is nan; values must "
                       "be finite.*accept_non_finite") as refused:
        client.import_state(prefix + "copy", state.params, state.exp_avg, state.exp_avg_sq,
                            list(state.page_steps))
    assert refused.value.code == "INVALID_ARGUMENT"
    with pytest.raises(optstate.NotFound):
        client.describe(prefix + "copy")
    client.import_state(prefix + "copy", state.params, state.exp_avg, state.exp_avg_sq,
                        list(state.page_steps), accept_non_finite=True)
    again = client.export_state(prefix + "copy")
    for got, sent in ((again.params, state.params), (again.exp_avg, state.exp_avg),
                      (again.exp_avg_sq, state.exp_avg_sq)):
        assert got.tobytes() == sent.tobytes()
    assert list(again.page_steps) == list(state.page_steps)
    # A square below 0 no step leaves: refused either way.
    with pytest.raises(optstate.InvalidArgument, match="never below 0"):
        client.import_state(prefix + "copy", state.params, state.exp_avg,
                            np.full(1000, -1.0, np.float32), list(state.page_steps),
                            accept_non_finite=True)
    assert client.export_state(prefix + "copy").exp_avg_sq.tobytes() == state.exp_avg_sq.tobytes()


def test_a_shared_buffer_steps_in_place_bit_identically_to_the_wire(fresh_daemons, prefix):
    # Gradients and params of three groups in one buffer, as float32 views: the step copies
    # nothing (the client needs no region of its own: the buffer is its only one), gives the
    # wire's params bit for bit, and a bad value in the last group refuses the whole step.
    daemon = fresh_daemons()
    shared = optstate.Client(daemon.target, data_plane="shared_memory")
    wire = optstate.Client(daemon.target, data_plane="wire")
    sizes = [70_000, 4096, 77]
    total = sum(sizes)
    raw = shared.allocate_shared_buffer(8 * total)
    assert raw.dtype == np.uint8 and raw.size >= 8 * total and raw.size % 4096 == 0
    assert raw.ctypes.data % 4096 == 0 and not raw.any()
    floats = torch.from_numpy(raw).view(torch.float32)
    grads, params = floats[:total], floats[total:2 * total]
    gen = torch.Generator().manual_seed(3)
    at, views = 0, []
    for i, n in enumerate(sizes):
        initial = torch.randn(n, generator=gen)
        shared.register(f"{prefix}s{i}", initial)
        wire.register(f"{prefix}w{i}", initial)
        views.append((grads[at:at + n], params[at:at + n]))
        at += n
    wire_params = [torch.empty(n) for n in sizes]
    for step in (1, 2, 3):
        for (g, _), n in zip(views, sizes):
            g.copy_(torch.randn(n, generator=gen))
        shared.step([(f"{prefix}s{i}", g, p) for i, (g, p) in enumerate(views)], step)
        wire.step([(f"{prefix}w{i}", g.clone(), out)
                   for i, ((g, _), out) in enumerate(zip(views, wire_params))], step)
        for (_, p), out in zip(views, wire_params):
            assert bits_equal(p, out), f"step {step}"
    assert shared.stats()["regions"]["regions"] == 1, "the buffer, and no region of the client's"
    before = shared.export_state(f"{prefix}s0").params.copy()
    views[2][0][5] = float("nan")
    with pytest.raises(optstate.InvalidArgument) as e:
        shared.step([(f"{prefix}s{i}", g, p) for i, (g, p) in enumerate(views)], 4)
    assert f"{prefix}s2" in str(e.value) and "at element 5 " in str(e.value)
    assert np.array_equal(shared.export_state(f"{prefix}s0").params, before), "nothing applied"
    assert shared.describe(f"{prefix}s0").max_step == 3
    with pytest.raises(optstate.FailedPrecondition):
        wire.allocate_shared_buffer(4096)


def test_gradients_checked_steps_the_same_bits_and_a_false_word_refuses_only_its_group(
        fresh_daemons, prefix):
    # Sixteen groups of 65,536 elements in one SharedBuffer: one message (4 MiB: applied
    # at once on a daemon of several threads, else in order), its chunks small enough to be
    # checked as the daemon applies them. Vouched for, the step gives the same bits as
    # unvouched; a NaN the caller vouched for is still refused with its group left as it
    # was bit for bit, the groups before it applied, the others as the refusal says, and a
    # repeat with the gradient fixed replays them and applies the refused one; unvouched,
    # the same NaN refuses the whole step.
    daemon = fresh_daemons()
    client = optstate.Client(daemon.target, data_plane="shared_memory")
    groups, n = 16, 65_536
    raw = client.allocate_shared_buffer(4 * 2 * groups * n * 2)
    floats = torch.from_numpy(raw).view(torch.float32)
    gen = torch.Generator().manual_seed(5)
    views = {}
    initial = [torch.randn(n, generator=gen) for _ in range(groups)]
    for kind in ("vouched", "plain"):
        base = 0 if kind == "vouched" else 2 * groups * n
        for i in range(groups):
            name = f"{prefix}{kind}{i}"
            client.register(name, initial[i])
            g = floats[base + i * n:base + (i + 1) * n]
            p = floats[base + (groups + i) * n:base + (groups + i + 1) * n]
            views[name] = (g, p)

    def step(kind, k, **kw):
        client.step([(f"{prefix}{kind}{i}", *views[f"{prefix}{kind}{i}"]) for i in range(groups)],
                    k, **kw)

    for k in (1, 2):
        for i in range(groups):
            g = torch.randn(n, generator=gen)
            views[f"{prefix}vouched{i}"][0].copy_(g)
            views[f"{prefix}plain{i}"][0].copy_(g)
        step("vouched", k, gradients_checked=True)
        step("plain", k)
        for i in range(groups):
            assert bits_equal(views[f"{prefix}vouched{i}"][1], views[f"{prefix}plain{i}"][1]), (
                f"step {k}, group {i}")
    for kind in ("vouched", "plain"):
        for i in range(groups):
            views[f"{prefix}{kind}{i}"][0].copy_(torch.randn(n, generator=gen))
        views[f"{prefix}{kind}5"][0][123] = float("nan")
    bad = f"{prefix}vouched5"
    before = client.export_state(bad)
    with pytest.raises(optstate.InvalidArgument) as e:
        step("vouched", 3, gradients_checked=True)
    assert bad in str(e.value) and "at element 123 " in str(e.value), str(e.value)
    assert "nothing in its message was applied" not in str(e.value), str(e.value)
    after = client.export_state(bad)
    for field in ("params", "exp_avg", "exp_avg_sq"):
        assert np.array_equal(getattr(after, field), getattr(before, field)), field
    assert client.describe(bad).max_step == 2
    at_once = "the other chunks of its message were applied" in str(e.value)
    assert at_once or "the chunks before it in its message were applied" in str(e.value)
    assert [client.describe(f"{prefix}vouched{i}").max_step for i in range(groups)] == [
        2 if i == 5 or (i > 5 and not at_once) else 3 for i in range(groups)]
    views[bad][0][123] = 0.0
    step("vouched", 3, gradients_checked=True)
    assert all(client.describe(f"{prefix}vouched{i}").min_step == 3 for i in range(groups))
    with pytest.raises(optstate.InvalidArgument) as e:
        step("plain", 3)
    assert f"{prefix}plain5" in str(e.value)
    assert all(client.describe(f"{prefix}plain{i}").max_step == 2 for i in range(groups))


def test_a_vouched_large_group_is_checked_a_chunk_at_a_time_and_a_false_word_refuses_one_chunk(
        fresh_daemons, prefix):
    # One group of four default pages (1 MiB of float32 gradient each) in a SharedBuffer:
    # vouched for, the client cuts it into chunks of at most 1 MiB, which the daemon checks
    # as it applies them, at once. The bits are those of the unvouched step; a NaN the
    # caller vouched for refuses only the chunk that holds it, whose pages stay as they were
    # bit for bit while the group's other pages step; a repeat with the gradient fixed
    # replays them and applies the refused one.
    daemon = fresh_daemons()
    client = optstate.Client(daemon.target, data_plane="shared_memory")
    page, pages = 262_144, 4
    n = page * pages
    raw = client.allocate_shared_buffer(4 * 4 * n)
    floats = torch.from_numpy(raw).view(torch.float32)
    gen = torch.Generator().manual_seed(11)
    initial = torch.randn(n, generator=gen)
    views = {}
    for k, kind in enumerate(("vouched", "plain")):
        client.register(f"{prefix}{kind}", initial)
        views[kind] = (floats[2 * k * n:(2 * k + 1) * n], floats[(2 * k + 1) * n:(2 * k + 2) * n])
    assert client.describe(f"{prefix}vouched").page_elements == page

    def step(kind, k, **kw):
        client.step([(f"{prefix}{kind}", *views[kind])], k, **kw)

    for k in (1, 2):
        g = torch.randn(n, generator=gen)
        for kind in ("vouched", "plain"):
            views[kind][0].copy_(g)
        step("vouched", k, gradients_checked=True)
        step("plain", k)
        assert bits_equal(views["vouched"][1], views["plain"][1]), f"step {k}"
    g = torch.randn(n, generator=gen)
    bad_at = page + 123  # In the second chunk.
    for kind in ("vouched", "plain"):
        views[kind][0].copy_(g)
        views[kind][0][bad_at] = float("nan")
    name = f"{prefix}vouched"
    before = client.export_state(name)
    with pytest.raises(optstate.InvalidArgument) as e:
        step("vouched", 3, gradients_checked=True)
    assert f"at element {bad_at} " in str(e.value), str(e.value)
    assert "the other chunks of its message were applied" in str(e.value), str(e.value)
    after = client.export_state(name)
    assert list(after.page_steps) == [3, 2, 3, 3]
    refused = slice(page, 2 * page)
    for field in ("params", "exp_avg", "exp_avg_sq"):
        assert np.array_equal(getattr(after, field)[refused], getattr(before, field)[refused]), field
        assert not np.array_equal(getattr(after, field)[:page], getattr(before, field)[:page]), field
    for kind in ("vouched", "plain"):
        views[kind][0][bad_at] = 0.0
    step("vouched", 3, gradients_checked=True)
    step("plain", 3)
    assert client.describe(name).min_step == 3
    assert bits_equal(views["vouched"][1], views["plain"][1])
    for field in ("params", "exp_avg", "exp_avg_sq"):
        assert np.array_equal(getattr(client.export_state(name), field),
                              getattr(client.export_state(f"{prefix}plain"), field)), field


def test_calls_made_once_ride_out_a_restarted_daemon(fresh_daemons, tmp_path):
    # delete() and checkpoint() are sent once (a retry could not tell "deleted now" from
    # NotFound, nor write one checkpoint), so right after the daemon restarted they failed
    # at once on the dead connection ("Broken pipe", "Socket closed"), although the client
    # waits reconnect_timeout for a restarting daemon. One small call, retried, finds the
    # daemon first now.
    flags = (f"--state_dir={tmp_path}", "--checkpoint_interval=0")
    d = fresh_daemons(*flags)
    client = optstate.Client(d.target, data_plane="wire", reconnect_timeout=30)
    for name in ("a", "b"):
        client.register(name, np.ones(64, np.float32), lr=0.1)
    client.checkpoint()
    for call in (lambda: client.checkpoint(), lambda: client.rewind_job("b", validate_only=True),
                 lambda: client.delete("a")):
        d.process.kill()
        d.process.wait()
        d = fresh_daemons(f"--listen=127.0.0.1:{d.port}", *flags)
        call()
    assert [g.name for g in client.list_groups()] == ["b"]


@pytest.mark.parametrize("restarted_with", ["--region_socket=none", "--max_region_bytes=4096"])
@pytest.mark.parametrize("shared_buffer", [False, True])
def test_a_daemon_restarted_without_room_for_shared_memory_gets_the_wire_or_the_reason(
        fresh_daemons, tmp_path, restarted_with, shared_buffer):
    # The client registered its regions again over a new connection, and a refusal left the
    # connection up with region ids of the daemon before: the next step named one and got
    # NOT_FOUND "region 1 is not registered" (which RemoteAdamW took for lost state); and
    # an auto client kept retrying shared memory on a daemon that offered none.
    flags = (f"--state_dir={tmp_path}", "--checkpoint_interval=0")
    d = fresh_daemons(*flags)
    n = 50_000
    expected = optstate.Client(d.target, data_plane="wire")
    expected.register("wire", np.zeros(n, np.float32))
    clients = {plane: optstate.Client(d.target, data_plane=plane, reconnect_timeout=10)
               for plane in ("auto", "shared_memory")}
    buffers = {}
    for plane, client in clients.items():
        client.register(plane, np.zeros(n, np.float32))
        if shared_buffer:
            memory = client.allocate_shared_buffer(8 * n).view(np.float32)
            buffers[plane] = (memory[:n], memory[n:2 * n])
        else:
            buffers[plane] = (np.zeros(n, np.float32), np.zeros(n, np.float32))
    want = np.zeros(n, np.float32)
    for step in (1, 2):
        gradient = np.linspace(-1, 1, n, dtype=np.float32) * step
        expected.step("wire", step, gradient, want)
        for plane, client in clients.items():
            grad, out = buffers[plane]
            grad[:] = gradient
            if step == 1:
                client.step(plane, step, grad, out)
                continue
            if plane == "auto":
                client.step(plane, step, grad, out)  # over the wire now
                np.testing.assert_array_equal(out, want)
            else:
                code = (optstate.FailedPrecondition if "none" in restarted_with
                        else optstate.ResourceExhausted)
                with pytest.raises(code, match="daemon restarted"):
                    client.step(plane, step, grad, out)
        if step == 1:
            assert d.stop() == 0
            d = fresh_daemons(f"--listen=127.0.0.1:{d.port}", *flags, restarted_with)
    assert clients["auto"].describe("auto").max_step == 2
    assert clients["shared_memory"].describe("shared_memory").max_step == 1


def test_a_call_mixing_float32_and_16_bit_buffers_needs_wire_dtype(client, prefix):
    # One call carries one type: a float32 group beside a bfloat16 one was narrowed to
    # bfloat16 without a word (its moments those of the rounded gradient).
    n = 256
    client.register(prefix + "f", np.zeros(n, np.float32))
    client.register(prefix + "h", np.zeros(n, np.float32))
    gradient = np.linspace(-1, 1, n, dtype=np.float32) + np.float32(1e-3)
    half = torch.from_numpy(gradient).to(torch.bfloat16)
    entries = [(prefix + "f", gradient, np.zeros(n, np.float32)),
               (prefix + "h", half, torch.zeros(n, dtype=torch.bfloat16))]
    with pytest.raises(ValueError, match="mix float32 and bfloat16.*wire_dtype=bfloat16"):
        client.step(entries, 1)
    assert client.describe(prefix + "f").max_step == 0  # nothing sent
    client.step(entries[:1], 1)  # alone: float32 all the way
    client.step(entries[1:], 1)
    alone = client.export_state(prefix + "f").exp_avg
    narrowed = 0.1 * half.float().numpy()
    np.testing.assert_allclose(alone, 0.1 * gradient, rtol=1e-6)  # (1 - beta1) g at step 1
    assert np.abs(alone - narrowed).max() > 1e-5  # which bfloat16 would have rounded
    client.step(entries, 2, wire_dtype="bfloat16")  # narrowed, as asked
    assert client.describe(prefix + "f").max_step == 2


def test_read_only_buffers_and_empty_arrays_are_refused_naming_what_is_wrong(client, prefix):
    # A memoryview of bytes passed numpy's read-only check (it has no flags) and was
    # written: the bytes object changed. An empty array was "not contiguous (dimension 0
    # has stride 0, expected 1)".
    client.register(prefix + "w", 4)
    frozen = bytes(16)
    with pytest.raises(ValueError, match="params_out: the buffer is read-only"):
        client.step(prefix + "w", 1, np.ones(4, np.float32), memoryview(frozen).cast("f"))
    assert frozen == bytes(16)
    with pytest.raises(ValueError, match="gradient: the array has no elements"):
        client.step(prefix + "w", 1, np.zeros(0, np.float32))
    assert _unchanged(client, prefix + "w") == (0, 0)
    out = bytearray(16)  # a writable buffer is taken
    client.step(prefix + "w", 1, np.ones(4, np.float32), memoryview(out).cast("f"))
    assert np.frombuffer(bytes(out), np.float32)[0] != 0


@pytest.mark.parametrize("target", ["127.0.0.1:113661", "127.0.0.1:65536", "localhost:0",
                                    "ipv4:127.0.0.1:70000", "[::1]:99999"])
def test_a_port_past_65535_or_0_is_invalid_argument(target):
    # gRPC takes the port modulo 65536: 127.0.0.1:113661 reached the daemon on 48125.
    with pytest.raises(optstate.InvalidArgument, match="is not a TCP port"):
        optstate.Client(target).list_groups()


def test_a_client_made_in_a_child_forked_while_one_was_open_is_refused(client, daemon):
    # gRPC's threads do not survive fork(): the child's new Client waited for them past
    # every deadline (its timers run on them too).
    client.list_groups()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            optstate.Client(daemon.target, attempt_timeout=2, max_attempts=1).list_groups()
            said = b"answered"
        except optstate.FailedPrecondition as e:
            said = str(e).encode()
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            said = repr(e).encode()
        os.write(write, said[:4000])
        os._exit(0)
    os.close(write)
    deadline = time.monotonic() + 20
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child's Client hung")
        time.sleep(0.05)
    said = os.read(read, 4000).decode()
    os.close(read)
    assert "is a fork of process" in said and "'spawn'" in said, said
    client.list_groups()  # the parent's goes on


@pytest.mark.parametrize("count", [-5, 2 ** 64])
def test_an_element_count_out_of_range_is_value_error(client, prefix, count):
    # It was RuntimeError: std::bad_cast.
    with pytest.raises(ValueError, match="an element count must be a whole number from 1"):
        client.register(prefix + "w", count)
    with pytest.raises(optstate.NotFound):
        client.describe(prefix + "w")


_INTERRUPTED_CALL = r"""
import sys, time
import numpy as np
import optstate
# One daemon, or two whose calls run on threads of their own (neither is there).
target = "127.0.0.1:1" if sys.argv[2] == "one" else ["127.0.0.1:1", "127.0.0.1:2"]
c = optstate.Client(target, max_attempts=2, max_backoff=0.5, reconnect_timeout=60)
# Enough groups that both daemons of two own some.
groups = [(f"w{i}", np.ones(4, np.float32), np.empty(4, np.float32)) for i in range(16)]
call = {"list_groups": lambda: c.list_groups(),
        "step": lambda: c.step(groups, 1),
        "wait_until_reachable": lambda: c.wait_until_reachable(60)}[sys.argv[1]]
print("calling", flush=True)
try:
    call()
except KeyboardInterrupt:
    print("KeyboardInterrupt", flush=True)
    c.list_groups  # the client is still usable as an object
    sys.exit(0)
print("returned", flush=True)
"""


@pytest.mark.parametrize("daemons", ["one", "two"])
@pytest.mark.parametrize("call", ["list_groups", "step", "wait_until_reachable"])
def test_ctrl_c_ends_a_call_that_waits_for_a_daemon(call, daemons, tmp_path):
    # With reconnect_timeout=60 a call to a daemon that is not there waits up to a
    # minute; Ctrl-C must end it at once (ClientOptions::interrupted, asked every
    # 100 ms while the call waits), as KeyboardInterrupt, not as an optstate error.
    # With two daemons the members' calls wait on threads of their own, where Python
    # looks for no signal: the calling thread asks for them.
    import subprocess
    import sys
    script = tmp_path / "call.py"
    script.write_text(_INTERRUPTED_CALL)
    child = subprocess.Popen([sys.executable, str(script), call, daemons],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "calling"
        time.sleep(1.0)  # well inside its waits between attempts
        assert child.poll() is None, child.stderr.read()
        sent = time.monotonic()
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=20)
        took = time.monotonic() - sent
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0 and out.strip() == "KeyboardInterrupt", (out, err)
    assert took < 2.0, f"Ctrl-C took {took:.2f} s to end the call"


def test_a_checkpoint_of_values_a_step_made_infinite_restores_whole(fresh_daemons, prefix,
                                                                     tmp_path):
    # At float32's edges a step leaves params infinite (lr * weight_decay near the largest
    # float: torch's AdamW does the same). A restore that took such values for damage
    # refused the whole checkpoint, and the daemon came back with no group of any tenant.
    d = fresh_daemons(f"--state_dir={tmp_path}")
    c = optstate.Client(d.target, data_plane="wire")
    c.register(prefix + "good", np.ones(1000, np.float32))
    c.register(prefix + "edge", np.ones(1000, np.float32), lr=1.0, weight_decay=3e38)
    grad = np.ones(1000, np.float32)
    for step in (1, 2, 3):
        c.step([(prefix + "good", grad, np.empty(1000, np.float32)),
                (prefix + "edge", grad, np.empty(1000, np.float32))], step)
    edge, good = c.export_state(prefix + "edge"), c.export_state(prefix + "good")
    assert not np.isfinite(edge.params).any()
    c.checkpoint(wait_for_step=3)
    assert d.stop() == 0
    again = fresh_daemons(f"--state_dir={tmp_path}")
    c = optstate.Client(again.target, data_plane="wire")
    assert c.stats()["restore_refusals"] == []
    for name, before in ((prefix + "edge", edge), (prefix + "good", good)):
        after = c.export_state(name)
        for field in ("params", "exp_avg", "exp_avg_sq"):
            assert np.array_equal(getattr(after, field).view(np.uint32),
                                  getattr(before, field).view(np.uint32)), (name, field)


_EXIT_WHILE_A_THREAD_WAITS = r"""
import threading, time
import optstate
c = optstate.Client("127.0.0.1:1", max_backoff=0.2, reconnect_timeout=60)
threading.Thread(target=lambda: c.wait_until_reachable(60), daemon=True).start()
time.sleep(0.5)
print("exiting", flush=True)
"""


def test_the_interpreter_exits_cleanly_while_a_thread_waits_for_a_daemon(tmp_path):
    # The wait asks ClientOptions::interrupted every 100 ms; had it taken the GIL on this
    # thread while the interpreter finalized, CPython would end the thread by unwinding
    # through C++ frames: "terminate called without an active exception" (SIGABRT) in 7
    # of 12 exits. Only the main thread looks for signals, without the GIL elsewhere.
    import subprocess
    import sys
    script = tmp_path / "exit.py"
    script.write_text(_EXIT_WHILE_A_THREAD_WAITS)
    for _ in range(8):
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0 and done.stdout.strip() == "exiting", (
            done.returncode, done.stderr[-500:])


_INTERRUPTED_CHECKPOINT = r"""
import sys, threading, time
import numpy as np
import optstate
targets = sys.argv[1:3]
c = optstate.Client(targets, data_plane="wire")
names = [f"w{i}" for i in range(16)]  # on both daemons
for n in names:
    c.register(n, np.ones(4, np.float32))
assert len({c.member_of(n) for n in names}) == 2
stepper = optstate.Client(targets, data_plane="wire")

def step_later():
    time.sleep(3.0)  # after the Ctrl-C; the checkpoints wait for this step
    stepper.step([(n, np.ones(4, np.float32), np.empty(4, np.float32)) for n in names], 1)

threading.Thread(target=step_later, daemon=True).start()
print("calling", flush=True)
try:
    c.checkpoint(wait_for_step=1)
except KeyboardInterrupt:
    print("KeyboardInterrupt", flush=True)
    sys.exit(0)
except BaseException as e:
    print(type(e).__name__, str(e)[:300], flush=True)
    sys.exit(0)
print("returned", flush=True)
"""


def test_ctrl_c_during_a_call_of_several_daemons_whose_calls_then_succeed_is_keyboard_interrupt(
        fresh_daemons, tmp_path):
    # The calling thread sees the signal while every member's call is under way (each
    # Checkpoint waits for a step), not between attempts: the members' calls then all
    # end OK. Returning OK with the KeyboardInterrupt pending was Python's SystemError
    # ("returned a result with an exception set").
    import subprocess
    import sys
    daemons = [fresh_daemons(f"--state_dir={tmp_path / name}") for name in ("a", "b")]
    script = tmp_path / "checkpoint.py"
    script.write_text(_INTERRUPTED_CHECKPOINT)
    child = subprocess.Popen([sys.executable, str(script), *(d.target for d in daemons)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "calling", child.stderr.read()
        time.sleep(1.0)
        assert child.poll() is None, child.stderr.read()
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0 and out.strip() == "KeyboardInterrupt", (out, err[-2000:])
