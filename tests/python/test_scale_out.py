"""Several daemons behind one client, across stand-in hosts (network namespaces,
netns_hosts.py): placement spread, steps bit-identical to one daemon, a member added and
the groups rebalanced, a cut link failing its daemon's groups only, a rebalance killed at
several points and finished by the next, delay and a rate limit on every link, and
RemoteAdamW over three daemons. The reference is always one daemon stepping the same
inputs (on loopback)."""
import copy
import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np

import pytest
import torch
import torch.nn.functional as F

import daemon_logs
import optstate
from models import MLP
from netns_hosts import DelayProxy, Hosts
from optstate.torch import RemoteAdamW

WIRE = dict(data_plane="wire")


@pytest.fixture
def hosts():
    """Hosts(n) of this test's own, closed (daemons stopped, namespaces removed) at the end,
    also after a failure; every daemon not killed must exit cleanly."""
    made = []

    def make(n):
        made.append(Hosts(n))
        for h in made[-1]:
            h.start()
        return made[-1]

    yield make
    for m in made:
        statuses = m.close()
        assert all(s in (0, -9) for s in statuses), statuses


def model(sizes, seed=0):
    rng = np.random.default_rng(seed)
    return {f"model.layers.{i:03d}.w{size}": rng.standard_normal(size).astype(np.float32)
            for i, size in enumerate(sizes)}


def mixed_sizes():
    """300 groups from 1 element to 8 M, as a 24-layer transformer of width 384 has them
    (an 8 M embedding, four attention and two MLP matrices and six norms and biases per
    layer, a scalar and the final norm's pieces): 50 M elements in all."""
    width = 384
    layer = [width * width] * 4 + [4 * width * width] * 2 + [width] * 4 + [4 * width] * 2
    return [8_000_000, 1] + layer * 24 + [width] * 10


def register(client, groups):
    for name, values in groups.items():
        client.register(name, values, lr=1e-2, weight_decay=0.01)


_NORMALS = []


def gradient(seed, size):
    """A gradient of `size` elements for `seed`: a window of one pool of standard normals
    (made once), starting where the seed says. Windows of different seeds differ, and
    making one costs nothing, so the 50 M-element steps spend their time in the daemons,
    not in numpy's generator."""
    if not _NORMALS:
        _NORMALS.append(np.random.default_rng(0).standard_normal(12_000_000, dtype=np.float32))
    pool = _NORMALS[0]
    start = seed % (pool.size - size + 1)
    return pool[start:start + size]


def step_all(client, groups, step, names=None, outs=None):
    """Steps `names` (all) with gradients made from (step, name); returns the params."""
    names = list(groups) if names is None else names
    outs = {} if outs is None else outs
    batch = []
    for name in names:
        seed = (step * 1_000_003 + sum(map(ord, name))) % (2 ** 32)
        grad = gradient(seed, groups[name].size)
        outs[name] = np.empty_like(grad)
        batch.append((name, grad, outs[name]))
    client.step(batch, step)
    return outs


def assert_bit_identical(a, b, names=None):
    for name in (a if names is None else names):
        assert np.array_equal(a[name].view(np.uint32), b[name].view(np.uint32)), name


def test_three_daemons_spread_step_like_one_and_a_fourth_takes_its_share(hosts, fresh_daemons):
    h = hosts(3)
    groups = model(mixed_sizes())
    multi = optstate.Client([x.target for x in h], **WIRE)
    one = optstate.Client(fresh_daemons().target, **WIRE)
    register(multi, groups)
    register(one, groups)
    # Balanced: no daemon above 1.5x the mean bytes; each group where placement says.
    members = multi.stats()["members"]
    assert [m["identity"] for m in members] == [x.target for x in h]
    held = [m["host_bytes"] for m in members]
    assert max(held) <= 1.5 * (sum(held) / 3), held
    listed = multi.list_groups()
    assert sorted(g.name for g in listed) == sorted(groups)
    assert all(g.member == multi.member_of(g.name) for g in listed)
    for step in range(1, 21):
        assert_bit_identical(step_all(multi, groups, step), step_all(one, groups, step))

    # A fourth member: at most 35% of the groups move, all to it; the rest untouched.
    h.add().start()
    before = {g.name: g.member for g in multi.list_groups()}
    result = multi.rebalance([x.target for x in h])
    exports = [line for line in result["log"] if line.startswith("export ")]
    assert result["moved"] == len(exports) <= 0.35 * len(groups), result["moved"]
    assert result["moved"] > 0.15 * len(groups), result["moved"]
    moved = {line.split()[1] for line in exports}
    for line in result["log"]:
        assert line.split()[1] in moved, f"{line}: an action on a group that does not move"
    after = multi.list_groups()
    assert sorted(g.name for g in after) == sorted(groups), "each group once"
    for g in after:
        assert g.member == multi.member_of(g.name)
        assert (g.member == h[3].target) == (g.name in moved), g.name
        assert g.name in moved or g.member == before[g.name]
    for step in range(21, 41):
        assert_bit_identical(step_all(multi, groups, step), step_all(one, groups, step))

    # A client still on the old list reaches the old owner: refused, naming the move.
    stale = optstate.Client([x.target for x in h][:3], **WIRE)
    name = sorted(moved)[0]
    with pytest.raises(optstate.FailedPrecondition, match=f"moved to daemon '{h[3].target}'"):
        step_all(stale, groups, 41, names=[name])
    assert_bit_identical(step_all(multi, groups, 41, names=[name]),
                         step_all(one, groups, 41, names=[name]))


def test_a_cut_link_fails_its_daemons_groups_only_and_the_retry_steps_them_once(
        hosts, fresh_daemons):
    h = hosts(3)
    groups = model([300_000] * 30)
    options = dict(max_attempts=2, attempt_timeout=2.0, connect_timeout=0.5, **WIRE)
    multi = optstate.Client([x.target for x in h], **options)
    one = optstate.Client(fresh_daemons().target, **WIRE)
    register(multi, groups)
    register(one, groups)
    step_all(multi, groups, 1)
    step_all(one, groups, 1)
    cut = h[1]
    on_cut = sorted(n for n in groups if multi.member_of(n) == cut.target)
    assert 0 < len(on_cut) < len(groups)

    # Cut before the step: UNAVAILABLE naming the daemon, for its groups only.
    cut.link(False)
    outs = {}
    with pytest.raises(optstate.Unavailable, match=f"daemon '{cut.target}'") as refused:
        step_all(multi, groups, 2, outs=outs)
    assert sorted(refused.value.not_stepped) == on_cut
    reference = step_all(one, groups, 2)
    assert_bit_identical(outs, reference, [n for n in groups if n not in on_cut])
    cut.link(True)
    multi.wait_until_reachable(30)  # The channel's reconnect backoff grew while cut.
    retried = step_all(multi, groups, 2, names=refused.value.not_stepped)
    assert_bit_identical(retried, reference, on_cut)

    # Cut while the step is in flight: whatever did not step is the cut daemon's, and the
    # retry of just those is exactly-once.
    outs = {}
    failure = []

    def stepping():
        try:
            step_all(multi, groups, 3, outs=outs)
        except optstate.Unavailable as e:
            failure.append(e)

    thread = threading.Thread(target=stepping)
    thread.start()
    time.sleep(0.02)
    cut.link(False)
    thread.join()
    cut.link(True)
    multi.wait_until_reachable(30)
    reference = step_all(one, groups, 3)
    missed = failure[0].not_stepped if failure else []
    assert set(missed) <= set(on_cut)
    if missed:
        retried = step_all(multi, groups, 3, names=missed)
        assert_bit_identical(retried, reference, missed)
    assert_bit_identical(outs, reference, [n for n in groups if n not in missed])
    for g in multi.list_groups():
        assert g.min_step == g.max_step == 3, g


REBALANCE_CHILD = textwrap.dedent("""
    import json, sys, optstate
    old, new = json.loads(sys.argv[1]), json.loads(sys.argv[2])
    client = optstate.Client(old, data_plane="wire", lease_holder=sys.argv[3])
    def announce(what):
        print(what, flush=True)
        sys.stdin.readline()  # The parent answers by killing this process.
    client.rebalance(new, before_each=announce)
""")


def rebalance_killed_at(old, new, action, nth, lease_holder=""):
    """Runs a rebalance from `old` to `new` (member lists) in a child process, a client of
    `lease_holder`, and kills it (SIGKILL) as it announces its nth action of kind `action`
    ("export", "import", "checkpoint", "delete")."""
    child = subprocess.Popen([sys.executable, "-c", REBALANCE_CHILD, json.dumps(old),
                              json.dumps(new), lease_holder],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    seen = 0
    try:
        for line in child.stdout:
            if line.startswith(action + " "):
                seen += 1
                if seen == nth:
                    child.send_signal(signal.SIGKILL)
                    child.wait(timeout=20)
                    return line.strip()
            child.stdin.write("\n")
            child.stdin.flush()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=20)
    raise AssertionError(f"the rebalance ended before its {action} number {nth}")


def states(client, names):
    return {n: client.export_state(n) for n in names}


def assert_whole_once_on_owner(h, multi, expected):
    """Every group on exactly one member, its owner, with the state it had."""
    where = {}
    for x in h:
        for g in optstate.Client(x.target, **WIRE).list_groups():
            assert g.name not in where, f"{g.name} on {where.get(g.name)} and {x.target}"
            where[g.name] = x.target
    assert sorted(where) == sorted(expected), "a group lost"
    for name, state in expected.items():
        assert where[name] == multi.member_of(name), name
        now = multi.export_state(name)
        for field in ("params", "exp_avg", "exp_avg_sq", "page_steps"):
            assert np.array_equal(getattr(now, field), getattr(state, field)), (name, field)


def test_a_rebalance_killed_at_any_point_is_finished_by_the_next(hosts):
    h = hosts(3)
    groups = model([int(s) for s in np.random.default_rng(60).integers(1, 20_000, 60)])
    three = [x.target for x in h]
    multi = optstate.Client(three, **WIRE)
    register(multi, groups)
    for step in (1, 2, 3):
        step_all(multi, groups, step)
    expected = states(multi, groups)
    h.add().start()
    four = [x.target for x in h]
    rounds = [(three, four, "import", 1), (four, three, "delete", 1), (three, four, "export", 3),
              (four, three, "delete", 4)]
    for old, new, action, nth in rounds:
        killed_at = rebalance_killed_at(old, new, action, nth)
        # The groups sealed by the killed run refuse steps until the move is finished.
        finished = optstate.Client(old, **WIRE).rebalance(new)
        assert finished["moved"] + finished["copies_deleted"] >= 1, (killed_at, finished)
        multi = optstate.Client(new, **WIRE)
        assert_whole_once_on_owner(h, multi, expected)
        assert all(not g.moved_to for g in multi.list_groups())
    # And the moved groups step on, as one daemon would have had them.
    step_all(multi, groups, 4)


def test_three_daemons_behind_delay_and_a_rate_limit_step_like_one(hosts, fresh_daemons):
    h = hosts(3)
    for x in h:
        x.limit_rate("1gbit")
    proxies = [DelayProxy(x.target, delay=0.001) for x in h]
    try:
        groups = model([400_000] * 30)
        # Identities are the hosts': placement as without the proxies.
        members = [{"target": p.target, "identity": x.target} for p, x in zip(proxies, h)]
        multi = optstate.Client(members, **WIRE)
        one = optstate.Client(fresh_daemons().target, **WIRE)
        register(multi, groups)
        register(one, groups)
        elements = sum(v.size for v in groups.values())
        for step in (1, 2, 3):
            started = time.perf_counter()
            stepped = step_all(multi, groups, step)
            seconds = time.perf_counter() - started
            assert_bit_identical(stepped, step_all(one, groups, step))
            # fp32 gradients one way and params the other over three links of 1 Gbit/s
            # each way: the share of the links' rate in one direction.
            share = 4 * elements * 8 / seconds / (3 * 1e9)
            print(f"step {step}: {seconds:.3f} s, {share:.0%} of the three links' rate")
    finally:
        for p in proxies:
            p.close()


def train(opt, net, steps=10):
    for step in range(steps):
        gen = torch.Generator().manual_seed(step)
        x, y = torch.randn(16, 32, generator=gen), torch.randn(16, 10, generator=gen)
        opt.zero_grad()
        F.mse_loss(net(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in net.parameters()]


def test_remote_adamw_over_three_daemons_trains_like_one(hosts, fresh_daemons):
    h = hosts(3)
    torch.manual_seed(0)
    net_a = MLP()
    net_b = MLP()
    net_b.load_state_dict(net_a.state_dict())
    over_three = RemoteAdamW(net_a.parameters(), lr=1e-2, target=[x.target for x in h],
                             name_prefix="parity.", data_plane="wire")
    over_one = RemoteAdamW(net_b.parameters(), lr=1e-2, target=fresh_daemons().target,
                           name_prefix="parity.", data_plane="wire")
    for p, q in zip(train(over_three, net_a), train(over_one, net_b)):
        assert torch.equal(p.view(torch.int32), q.view(torch.int32))
    spread = {g.member for g in over_three._client.list_groups()}
    assert len(spread) > 1, "the parity model's groups should span daemons"
    over_three.close()
    over_one.close()


def test_checkpoints_and_tokens_go_to_every_member(hosts, tmp_path):
    """Checkpoint{wait_for_step} reaches every member, each writing its own groups; a tokens
    file on every daemon and one token for the client."""
    token = "scale-out-token-5be1"
    daemon_logs.record_secrets(token)
    tokens = tmp_path / "tokens"
    tokens.write_text(f"job {hashlib.sha256(token.encode()).hexdigest()}\n")
    h = Hosts(0)
    try:
        for i in range(3):
            state = tmp_path / f"state-{i}"
            state.mkdir()
            h.add().start(f"--state_dir={state}", f"--auth_tokens_file={tokens}")
        with pytest.raises(optstate.Unauthenticated):
            optstate.Client([x.target for x in h], max_attempts=1, **WIRE).list_groups()
        multi = optstate.Client([x.target for x in h], token=token, **WIRE)
        groups = model([1000] * 12)
        register(multi, groups)
        step_all(multi, groups, 1)
        done = multi.checkpoint(wait_for_step=1)
        assert done["step"] == 1
        ids = dict(part.split("=", 1) for part in done["id"].split(","))
        assert sorted(ids) == sorted(x.target for x in h), done
        for x in h:
            alone = optstate.Client(x.target, token=token, **WIRE).stats()
            assert alone["last_checkpoint"]["id"] == ids[x.target]
            assert alone["last_checkpoint"]["step"] == 1
        assert sum(m["num_groups"] for m in multi.stats()["members"]) == len(groups)
    finally:
        statuses = h.close()
    assert statuses == [0, 0, 0]


def _sharded_run(tmp_path, tag, target, prefix, steps=4):
    """Two gloo ranks of ddp_worker.run with shard=True against `target`; their records."""
    import ddp_worker
    return ddp_worker.two_ranks(ddp_worker.run, target, tmp_path, tag, prefix, steps)


def test_zero1_shards_over_three_daemons_train_like_over_one(fresh_daemons, tmp_path):
    # Fixed identities: placement does not hang on the ports the daemons got.
    three = [{"target": fresh_daemons().target, "identity": f"optstated-{i}"} for i in range(3)]
    one = fresh_daemons().target
    spread = _sharded_run(tmp_path, "three", three, "zero1.")
    alone = _sharded_run(tmp_path, "one", one, "zero1.")
    for rank in (0, 1):
        for name, value in alone[rank]["final"].items():
            assert torch.equal(spread[rank]["final"][name].view(torch.int32),
                               value.view(torch.int32)), (rank, name)
    members = {g.member for g in optstate.Client(three, **WIRE).list_groups()}
    assert len(members) > 1, "the model's groups should span daemons"


def test_a_rewind_over_several_daemons_is_done_on_all_or_on_none(fresh_daemons, tmp_path):
    # Member 2 pruned its checkpoint of step 3. The rewind to step 3 rewound members 0
    # and 1, then failed on member 2: the job was left at steps 3 and 6, and the error
    # did not say that two daemons were already rewound.
    three = [{"target": fresh_daemons(f"--state_dir={tmp_path / f'state-{i}'}",
                                      "--checkpoints_to_keep=2").target,
              "identity": f"optstated-{i}"} for i in range(3)]
    multi = optstate.Client(three, **WIRE)
    groups = model([1000] * 12)
    register(multi, groups)

    def steps():
        return {g.name: (g.min_step, g.max_step) for g in multi.list_groups()}

    for step in range(1, 4):
        step_all(multi, groups, step)
    multi.checkpoint(wait_for_step=3)
    for step in range(4, 7):
        step_all(multi, groups, step)
    member_2 = optstate.Client(three[2]["target"], **WIRE)
    assert any(g.name in groups for g in member_2.list_groups())
    member_2.checkpoint()
    member_2.checkpoint()  # step 3's is pruned there (--checkpoints_to_keep=2)
    at_6 = steps()
    assert set(at_6.values()) == {(6, 6)}

    for validate_only in (True, False):
        with pytest.raises(optstate.NotFound, match="optstated-2") as refused:
            multi.rewind_job("model.", step=3, validate_only=validate_only)
        assert "nothing was rewound on any daemon" in str(refused.value)
        assert steps() == at_6
    # Without a step: the newest checkpoints are at 3 (members 0, 1) and 6 (member 2).
    with pytest.raises(optstate.FailedPrecondition, match="different steps") as apart:
        multi.rewind_job("model.")
    assert "optstated-2: ckpt-0000000000000003 at step 6" in str(apart.value)
    assert steps() == at_6

    multi.checkpoint(wait_for_step=6)
    step_all(multi, groups, 7)
    checked = multi.rewind_job("model.", validate_only=True)
    assert (checked["step"], sorted(checked["groups"])) == (6, sorted(groups))
    assert set(steps().values()) == {(7, 7)}
    rewound = multi.rewind_job("model.")
    assert (rewound["step"], sorted(rewound["groups"])) == (6, sorted(groups))
    assert set(steps().values()) == {(6, 6)}


def test_a_member_restarted_without_the_job_is_named_in_the_step_error(fresh_daemons):
    # Over several daemons the members' raw refusals came through ("no group named ...;
    # register it first", which would have restarted the group at step 0).
    daemons = [fresh_daemons(), fresh_daemons()]
    two = [{"target": d.target, "identity": f"optstated-{i}"} for i, d in enumerate(daemons)]
    net = MLP()
    opt = RemoteAdamW(net.named_parameters(), target=two, name_prefix="restart.", **WIRE)
    train(opt, net, steps=2)
    members = {g.member for g in opt.client.list_groups()}
    assert members == {"optstated-0", "optstated-1"}, members
    daemons[1].process.kill()
    daemons[1].process.wait()
    fresh_daemons(f"--listen=127.0.0.1:{daemons[1].port}")
    with pytest.raises(optstate.NotFound) as gone:
        train(opt, net, steps=1)
    message = str(gone.value)
    assert f"optstated 'optstated-1' at {daemons[1].target} restarted at" in message, message
    assert "this job's state (at step 2) is gone there" in message, message
    assert "resume='state_dict'" in message
    # Which groups did not step (the restarted member's), as the raw refusal had them.
    on_restarted = {"restart." + n for n, p in net.named_parameters()
                    if p.requires_grad and opt.client.member_of("restart." + n) == "optstated-1"}
    assert set(gone.value.not_stepped) == on_restarted, gone.value.not_stepped


def test_the_way_on_the_step_error_gives_after_a_member_lost_its_state_works(fresh_daemons):
    # The error above sends the user to resume='state_dict' and load_state_dict(); the
    # new optimizer found the job's groups on the other member trained and the lost
    # member's new, and refused ("renamed parameters"): no way on but deleting by hand.
    daemons = [fresh_daemons(), fresh_daemons()]
    two = [{"target": d.target, "identity": f"optstated-{i}"} for i, d in enumerate(daemons)]
    torch.manual_seed(0)
    net, reference_net = MLP(), MLP()
    reference_net.load_state_dict(net.state_dict())
    opt = RemoteAdamW(net.named_parameters(), lr=1e-2, target=two, name_prefix="lost.",
                      **WIRE)
    train(opt, net, steps=2)
    saved_model, saved_opt = copy.deepcopy(net.state_dict()), copy.deepcopy(opt.state_dict())
    daemons[1].process.kill()
    daemons[1].process.wait()
    fresh_daemons(f"--listen=127.0.0.1:{daemons[1].port}")
    with pytest.raises(optstate.NotFound, match="resume='state_dict'"):
        train(opt, net, steps=1)
    holder = opt.lease_holder  # The same trainer process, resuming.
    opt.close()
    restored = MLP()
    restored.load_state_dict(saved_model)
    resumed = RemoteAdamW(restored.named_parameters(), lr=1e-2, target=two,
                          name_prefix="lost.", resume="state_dict", lease_holder=holder, **WIRE)
    resumed.load_state_dict(saved_opt)
    reference = RemoteAdamW(reference_net.named_parameters(), lr=1e-2,
                            target=fresh_daemons().target, name_prefix="lost.", **WIRE)
    train(reference, reference_net, steps=2)
    # The same inputs as the uninterrupted run's steps 3 and 4 (train() seeds by step).
    for step in (2, 3):
        for o, n in ((resumed, restored), (reference, reference_net)):
            gen = torch.Generator().manual_seed(step)
            x, y = torch.randn(16, 32, generator=gen), torch.randn(16, 10, generator=gen)
            o.zero_grad()
            F.mse_loss(n(x), y).backward()
            o.step()
    for p, q in zip(restored.parameters(), reference_net.parameters()):
        assert torch.equal(p.view(torch.int32), q.view(torch.int32))
    assert {g.member for g in resumed.client.list_groups()} == {"optstated-0", "optstated-1"}
    resumed.close()
    reference.close()


def test_a_rewind_over_daemons_one_of_which_holds_frozen_groups_only(fresh_daemons, tmp_path):
    # A daemon holding only never-stepped groups of the job answered step 0, and the
    # all-or-none rewind took that for the oldest step: every other daemon refused it.
    # Here it has no checkpoint at all (a checkpoint of the trained groups skips it):
    # it has nothing to rewind.
    three = [{"target": fresh_daemons(f"--state_dir={tmp_path / f'state-{i}'}").target,
              "identity": f"optstated-{i}"} for i in range(3)]
    multi = optstate.Client(three, **WIRE)
    groups = model([1000] * 12)
    register(multi, groups)
    frozen = [g.name for g in multi.list_groups() if g.member == "optstated-2"]
    trained = [name for name in groups if name not in frozen]
    assert frozen and trained
    for step in range(1, 3):
        step_all(multi, groups, step, names=trained)
    multi.checkpoint(groups=trained, wait_for_step=2)
    step_all(multi, groups, 3, names=trained)
    for step in (None, 2):
        rewound = multi.rewind_job("model.", step=step)
        assert rewound["step"] == 2 and sorted(rewound["groups"]) == sorted(trained)
        steps = {g.name: (g.min_step, g.max_step) for g in multi.list_groups()}
        assert {steps[n] for n in trained} == {(2, 2)} and {steps[n] for n in frozen} == {(0, 0)}
    # With a checkpoint of every group, its frozen groups are rewound too, at any step.
    multi.checkpoint()
    step_all(multi, groups, 3, names=trained)
    rewound = multi.rewind_job("model.")
    assert rewound["step"] == 2 and sorted(rewound["groups"]) == sorted(groups)
    # A job no daemon holds is still NOT_FOUND.
    with pytest.raises(optstate.NotFound):
        multi.rewind_job("no-such-job.")


def test_a_rebalance_leaves_another_jobs_leased_groups_and_both_jobs_step_on(fresh_daemons):
    # Job x rebalanced onto a fourth daemon while job y leased groups on the same daemons:
    # the export of y's first group was refused after some of x's had moved, x's client
    # stayed on the old member list, and every step of x was refused ("moved to ...").
    daemons = [fresh_daemons() for _ in range(4)]
    three = [{"target": d.target, "identity": f"optstated-{i}"} for i, d in enumerate(daemons[:3])]
    four = three + [{"target": daemons[3].target, "identity": "optstated-3"}]
    x = optstate.Client(three, lease_holder="x-holder", lease_job="x", **WIRE)
    y = optstate.Client(three, lease_holder="y-holder", lease_job="y", **WIRE)
    groups = {f"{job}/{name}": values for job in ("x", "y")
              for name, values in model([1000] * 16).items()}
    xs = {n: v for n, v in groups.items() if n.startswith("x/")}
    ys = {n: v for n, v in groups.items() if n.startswith("y/")}
    register(x, xs)
    register(y, ys)
    step_all(x, xs, 1)
    step_all(y, ys, 1)
    # A daemon that leaves holding y's groups: refused before anything moves.
    with pytest.raises(optstate.FailedPrecondition, match="leaves the member list, and job 'y'"):
        x.rebalance(three[:2])
    assert {g.name: g.member for g in x.list_groups()} == \
        {g.name: g.member for g in optstate.Client(three, **WIRE).list_groups()}
    done = x.rebalance(four)
    assert done["moved"] > 0 and done["left"], done
    assert all(name.startswith("y/") for name in done["left"]), done
    assert {g.member for g in x.list_groups() if g.name in xs} >= {"optstated-3"}
    step_all(x, xs, 2)  # refused before: "moved to daemon ..."
    step_all(y, ys, 2)  # y still on the old list: its groups stayed
    again = y.rebalance(four)
    assert sorted(again["left"]) == [], again
    assert again["moved"] == len(done["left"]), (done, again)
    step_all(x, xs, 3)
    step_all(y, ys, 3)
    steps = {g.name: (g.min_step, g.max_step) for g in optstate.Client(four, **WIRE).list_groups()}
    assert set(steps.values()) == {(3, 3)} and len(steps) == len(groups)


def test_after_a_restart_a_rebalance_moves_another_jobs_groups_unleased(fresh_daemons,
                                                                        tmp_path):
    # Leases are not checkpointed: after the daemons restarted no group was leased, job
    # x's Rebalance moved job y's groups too, and each import leased them to x, so y's
    # next step on a moved group was refused until x's lease expired.
    flags = ("--checkpoint_interval=0", "--lease_seconds=600")
    daemons = [fresh_daemons(f"--state_dir={tmp_path / str(i)}", *flags) for i in range(3)]
    named = [{"target": d.target, "identity": f"optstated-{i}"} for i, d in enumerate(daemons)]
    groups = {f"{job}/{name}": values for job in ("x", "y")
              for name, values in model([1000] * 16).items()}
    jobs = {job: {n: v for n, v in groups.items() if n.startswith(f"{job}/")}
            for job in ("x", "y")}
    for job, own in jobs.items():
        client = optstate.Client(named[:2], lease_holder=f"{job}-holder", lease_job=job, **WIRE)
        register(client, own)
        step_all(client, own, 1)
        client.checkpoint(wait_for_step=1)
    for i, d in enumerate(daemons[:2]):
        d.process.kill()
        d.process.wait(timeout=20)
        named[i]["target"] = fresh_daemons(f"--state_dir={tmp_path / str(i)}", *flags).target
    x = optstate.Client(named[:2], lease_holder="x-holder", lease_job="x", **WIRE)
    done = x.rebalance(named)
    moved = {g.name for g in x.list_groups() if g.member == "optstated-2"}
    assert done["moved"] == len(moved) and not done["left"], done
    assert any(n.startswith("y/") for n in moved), moved
    assert all(x.describe(n).lease is None for n in moved)
    y = optstate.Client(named, lease_holder="y-holder", lease_job="y", **WIRE)
    step_all(y, jobs["y"], 2)  # refused before: "job 'x' leases it"
    step_all(x, jobs["x"], 2)
    leases = {g.name: g.lease["job"] for g in y.list_groups()}
    assert leases == {n: n.split("/")[0] for n in groups}, leases


def test_one_daemon_listed_twice_is_refused_and_naming_the_daemons_moves_nothing(
        fresh_daemons):
    # Two daemons known by their addresses, then given names (what scale-out.md advises):
    # the rebalance took each daemon's copy, under its old identity, for another
    # daemon's and deleted it, reporting success. One daemon listed under two addresses
    # lost every group the same way.
    daemons = [fresh_daemons(), fresh_daemons()]
    by_address = [d.target for d in daemons]
    client = optstate.Client(by_address, **WIRE)
    groups = {f"n/{name}": values for name, values in model([1000] * 16).items()}
    register(client, groups)
    step_all(client, groups, 1)
    before = {g.name: g.member for g in client.list_groups()}

    alias = f"localhost:{daemons[0].port}"
    with pytest.raises(optstate.InvalidArgument, match="are one daemon") as twice:
        client.rebalance([daemons[0].target, alias, daemons[1].target])
    assert "nothing moved" in str(twice.value)
    assert {g.name: g.member for g in client.list_groups()} == before
    with pytest.raises(optstate.InvalidArgument, match="are one daemon"):
        optstate.Client([daemons[0].target, alias], **WIRE).wait_until_reachable(5)

    named = [{"target": d.target, "identity": f"optstated-{i}"} for i, d in enumerate(daemons)]
    done = client.rebalance(named)
    assert done["copies_deleted"] == 0, done
    listed = optstate.Client(named, **WIRE).list_groups()
    assert sorted(g.name for g in listed) == sorted(groups)
    assert all(g.member == optstate.Client(named, **WIRE).member_of(g.name) for g in listed)
    step_all(client, groups, 2)
    assert {(g.min_step, g.max_step) for g in client.list_groups()} == {(2, 2)}


def checkpointed_at_one_then_at_two(members, prefix):
    """A job of 16 groups under `prefix` on `members` (lease holder "job"), checkpointed
    at step 1 and stepped on to 2: its client and groups."""
    client = optstate.Client(members, lease_holder="job", **WIRE)
    groups = {f"{prefix}{name}": values for name, values in model([1000] * 16).items()}
    register(client, groups)
    step_all(client, groups, 1)
    client.checkpoint(wait_for_step=1)
    step_all(client, groups, 2)
    return client, groups


def test_a_rewind_through_the_old_member_list_does_not_bring_moved_groups_back(
        fresh_daemons, tmp_path):
    # Checkpointed on two daemons, then rebalanced onto three: a rewind through a client
    # of the old two made the moved groups again there at the checkpoint's step, unsealed,
    # and old-list steps went to those stale copies while the third daemon held the job.
    daemons = [fresh_daemons(f"--state_dir={tmp_path / str(i)}", "--checkpoint_interval=0")
               for i in range(3)]
    named = [{"target": d.target, "identity": f"optstated-{i}"} for i, d in enumerate(daemons)]
    client, groups = checkpointed_at_one_then_at_two(named[:2], "r/")
    moved = client.rebalance(named)["moved"]
    assert moved > 0
    old_list = optstate.Client(named[:2], lease_holder="job", **WIRE)
    before = sorted((g.name, g.member, g.max_step) for g in old_list.list_groups())
    with pytest.raises(optstate.FailedPrecondition, match="moved to daemon 'optstated-2'") as e:
        old_list.rewind_job("r/", step=1)
    assert "nothing was rewound" in str(e.value)
    assert sorted((g.name, g.member, g.max_step) for g in old_list.list_groups()) == before
    assert sum(g.member == "optstated-2" for g in client.list_groups()) == moved
    # And after every daemon restarted. (The notes were in memory alone once, and the
    # rewind through the old list then made the moved groups again, at the checkpoint's
    # step, beside the third daemon's copies; a later Rebalance kept the stale ones.)
    for i, d in enumerate(daemons):
        d.process.kill()
        d.process.wait(timeout=20)
        named[i]["target"] = fresh_daemons(f"--state_dir={tmp_path / str(i)}",
                                           "--checkpoint_interval=0").target
    old_list = optstate.Client(named[:2], lease_holder="job", **WIRE)
    # The old daemons restored their checkpoints of step 1, which hold the moved groups:
    # those copies are sealed again (stale: they step nowhere).
    stale = [g for g in old_list.list_groups() if g.moved_to]
    assert len(stale) == moved and {g.moved_to for g in stale} == {"optstated-2"}
    with pytest.raises(optstate.FailedPrecondition, match="move to daemon 'optstated-2'"):
        old_list.rewind_job("r/", step=1)
    # The next Rebalance deletes them and keeps the third daemon's, which its checkpoint
    # at the move restored.
    new_list = optstate.Client(named, lease_holder="job", **WIRE)
    assert new_list.rebalance(named)["copies_deleted"] == moved
    held = new_list.list_groups()
    assert sorted(g.name for g in held) == sorted(groups)
    assert {g.max_step for g in held if g.member == "optstated-2"} == {2}


def test_groups_moved_to_a_daemon_that_crashes_after_the_rebalance_are_restored_there(
        fresh_daemons, tmp_path):
    # The old copies were deleted as soon as each import was done: the new owner, killed
    # before its next checkpoint, restarted without the moved groups, and no daemon held
    # them any more (its old owners' checkpoints did, but a rewind there was refused: they
    # had moved away).
    flags = ("--checkpoint_interval=0",)
    daemons = [fresh_daemons(f"--state_dir={tmp_path / str(i)}", *flags) for i in range(3)]
    named = [{"target": d.target, "identity": f"optstated-{i}"} for i, d in enumerate(daemons)]
    client, groups = checkpointed_at_one_then_at_two(named[:2], "m/")
    expected = states(client, groups)
    result = client.rebalance(named)
    assert result["moved"] > 0
    assert "checkpoint optstated-2" in result["log"]
    last_checkpoint = result["log"].index("checkpoint optstated-2")
    deletes = [i for i, line in enumerate(result["log"]) if line.startswith("delete ")]
    assert deletes and min(deletes) > last_checkpoint, result["log"]
    daemons[2].process.kill()
    daemons[2].process.wait(timeout=20)
    restarted = fresh_daemons(f"--state_dir={tmp_path / '2'}", *flags)
    named[2]["target"] = restarted.target
    after = optstate.Client(named, lease_holder="job", **WIRE)
    on_third = [g for g in after.list_groups() if g.member == "optstated-2"]
    assert len(on_third) == result["moved"]
    assert_whole = {n: after.export_state(n) for n in groups}
    for name, state in expected.items():
        for field in ("params", "exp_avg", "exp_avg_sq", "page_steps"):
            assert np.array_equal(getattr(assert_whole[name], field), getattr(state, field)), (
                name, field)
    step_all(after, groups, 3)
    assert {(g.min_step, g.max_step) for g in after.list_groups()} == {(3, 3)}


def test_a_rebalance_whose_owner_cannot_checkpoint_deletes_no_copy(fresh_daemons, tmp_path):
    # The new owner keeps checkpoints but cannot write one (its LOCK file removed): the
    # old copies stay, sealed, until a Rebalance that can make the moves durable.
    daemons = [fresh_daemons(f"--state_dir={tmp_path / str(i)}", "--checkpoint_interval=0")
               for i in range(3)]
    named = [{"target": d.target, "identity": f"optstated-{i}"} for i, d in enumerate(daemons)]
    client, groups = checkpointed_at_one_then_at_two(named[:2], "k/")
    expected = states(client, groups)
    os.remove(tmp_path / "2" / "LOCK")
    with pytest.raises(optstate.FailedPrecondition, match="daemon 'optstated-2'") as e:
        client.rebalance(named)
    assert "no copy was deleted" in str(e.value)
    held = {}
    for d in daemons[:2]:
        for g in optstate.Client(d.target, **WIRE).list_groups():
            held[g.name] = g
    assert sorted(held) == sorted(groups)  # every old copy still there
    assert any(g.moved_to for g in held.values())
    # Restarted (a LOCK of its own again), the owner takes the moves the next Rebalance
    # finishes.
    daemons[2].process.kill()
    daemons[2].process.wait(timeout=20)
    named[2]["target"] = fresh_daemons(f"--state_dir={tmp_path / '2'}",
                                       "--checkpoint_interval=0").target
    finished = optstate.Client(named, lease_holder="job", **WIRE)
    # Its imports went with its restart (no checkpoint held them): moved again.
    to_third = [n for n in groups if finished.member_of(n) == "optstated-2"]
    assert to_third and finished.rebalance(named)["moved"] == len(to_third)
    for name, state in expected.items():
        now = finished.export_state(name)
        for field in ("params", "exp_avg", "exp_avg_sq", "page_steps"):
            assert np.array_equal(getattr(now, field), getattr(state, field)), (name, field)
    assert sum(len(optstate.Client(d["target"], **WIRE).list_groups()) for d in named) == len(
        groups)


def test_a_checkpoint_one_member_cannot_write_is_written_on_none(fresh_daemons, tmp_path):
    # One of three daemons down (or without --state_dir): the others wrote their
    # checkpoints anyway, each pushing its only older one out (--checkpoints_to_keep=1),
    # and the job could no longer be rewound to a step every member held.
    keep = ["--checkpoint_interval=0", "--checkpoints_to_keep=1"]
    daemons = [fresh_daemons(f"--state_dir={tmp_path / str(i)}", *keep) for i in range(2)]
    daemons.append(fresh_daemons())  # no --state_dir
    named = [{"target": d.target, "identity": f"optstated-{i}"} for i, d in enumerate(daemons)]
    client, groups = checkpointed_at_one_then_at_two(named[:2], "c/")

    def stored():
        return [sorted(os.listdir(tmp_path / str(i))) for i in range(2)]

    before = stored()
    with_third = optstate.Client(named, lease_holder="job", reconnect_timeout=0, **WIRE)
    with pytest.raises(optstate.FailedPrecondition, match="optstated-2.*without --state_dir") as e:
        with_third.checkpoint()
    assert "no checkpoint was written on any daemon" in str(e.value)
    daemons[1].process.kill()
    daemons[1].process.wait()
    with pytest.raises(optstate.Unavailable, match="optstated-1") as e:
        optstate.Client(named[:2], lease_holder="job", reconnect_timeout=0,
                        **WIRE).checkpoint(wait_for_step=2)
    assert "no checkpoint was written on any daemon" in str(e.value)
    assert stored() == before


def test_a_job_restarted_with_a_daemon_added_but_no_rebalance_is_told_to_rebalance(
        fresh_daemons):
    # Trained on one daemon, restarted with a second in its list: the groups the new list
    # places on the second were "parameters the job has no groups for ... renamed
    # parameters", though every group was there, on the first daemon.
    daemons = [fresh_daemons(), fresh_daemons()]
    named = [{"target": d.target, "identity": f"optstated-{i}"} for i, d in enumerate(daemons)]
    net = MLP()
    opt = RemoteAdamW(net.named_parameters(), target=named[:1], name_prefix="grown.", **WIRE)
    train(opt, net, steps=2)
    holder = opt.lease_holder
    opt.close()
    with pytest.raises(optstate.FailedPrecondition, match="without a Rebalance") as e:
        RemoteAdamW(MLP(seed=3).named_parameters(), target=named, name_prefix="grown.",
                    resume="daemon", lease_holder=holder, **WIRE)
    assert "renamed" not in str(e.value) and "on daemon 'optstated-0'" in str(e.value)
    assert optstate.Client(named[1:], **WIRE).list_groups() == []  # the call's groups went
    optstate.Client(named, lease_holder=holder, **WIRE).rebalance(named)
    resumed = RemoteAdamW(MLP(seed=3).named_parameters(), target=named, name_prefix="grown.",
                          resume="daemon", lease_holder=holder, **WIRE)
    assert resumed.resumed_step == 2
    assert {g.member for g in resumed.client.list_groups()} == {"optstated-0", "optstated-1"}
    # A member's refusal of one group's call names that member.
    member = resumed.client.member_of("grown.nothing")
    with pytest.raises(optstate.NotFound, match=f"daemon '{member}' \\("):
        resumed.client.describe("grown.nothing")
    with pytest.raises(optstate.NotFound, match=f"daemon '{member}' \\("):
        resumed.client.delete("grown.nothing")
    resumed.close()


def test_a_job_restarted_without_a_daemon_it_had_is_told_of_an_unfinished_rebalance(
        fresh_daemons):
    # Trained on two daemons, restarted with one of them left out of its list (a Rebalance
    # to that list not run, or not finished): the groups left on the missing daemon are
    # new where the list places them, which reads as renamed parameters; the refusal must
    # also name the way on of several daemons, the Rebalance run again.
    daemons = [fresh_daemons(), fresh_daemons()]
    named = [{"target": d.target, "identity": f"optstated-{i}"} for i, d in enumerate(daemons)]
    net = MLP()
    opt = RemoteAdamW(net.named_parameters(), target=named, name_prefix="shrunk.", **WIRE)
    train(opt, net, steps=2)
    holder = opt.lease_holder
    opt.close()
    assert {g.member for g in optstate.Client(named, **WIRE).list_groups()} == {
        "optstated-0", "optstated-1"}
    with pytest.raises(optstate.FailedPrecondition, match="renamed") as e:
        RemoteAdamW(MLP(seed=3).named_parameters(), target=named[:1], name_prefix="shrunk.",
                    resume="daemon", lease_holder=holder, **WIRE)
    assert "a Rebalance to this list that did not finish" in str(e.value)
    assert "Client.rebalance() again" in str(e.value)
    # The refused attach left no step-0 copies on the daemon kept.
    assert {g.max_step for g in optstate.Client(named[:1], **WIRE).list_groups()} == {2}


def test_a_seal_outlives_a_restart_of_its_daemon(fresh_daemons, tmp_path):
    # A Rebalance killed after its first export sealed a group, then the group's daemon
    # restarted: the seal was in memory alone, so the stale copy was steppable again
    # beside the one the next Rebalance made, and a client on the old member list was
    # told its state was gone when that copy was deleted.
    flags = ("--checkpoint_interval=0",)
    daemons = [fresh_daemons(f"--state_dir={tmp_path / str(i)}", *flags) for i in range(3)]
    named = [{"target": d.target, "identity": f"optstated-{i}"} for i, d in enumerate(daemons)]
    client, groups = checkpointed_at_one_then_at_two(named[:2], "s/")
    client.checkpoint(wait_for_step=2)
    killed_at = rebalance_killed_at(named[:2], named, "import", 1, lease_holder="job")
    moving = killed_at.split()[1]
    source = client.member_of(moving)
    index = int(source.split("-")[1])
    daemons[index].process.kill()
    daemons[index].process.wait(timeout=20)
    named[index]["target"] = fresh_daemons(f"--state_dir={tmp_path / str(index)}", *flags).target
    on_source = {g.name: g for g in optstate.Client(named[index]["target"], **WIRE).list_groups()}
    assert on_source[moving].moved_to == "optstated-2"
    with pytest.raises(optstate.FailedPrecondition, match="moved to daemon 'optstated-2'"):
        step_all(optstate.Client(named[:2], lease_holder="job", **WIRE), {moving: groups[moving]},
                 3)
    finished = optstate.Client(named, lease_holder="job", **WIRE)
    finished.rebalance(named)
    # Deleted after the move: a client on the old list is told where it went.
    with pytest.raises(optstate.FailedPrecondition, match="moved to daemon 'optstated-2'"):
        optstate.Client(named[:2], lease_holder="job", **WIRE).describe(moving)
    assert finished.describe(moving).max_step == 2


def test_a_seal_the_daemon_cannot_keep_is_refused_and_moves_nothing(fresh_daemons, tmp_path):
    # <state_dir>/MOVES could not be written (here: a directory in the way of its new
    # version): the seal stood in memory alone, the Rebalance went on, and after a restart
    # the old copies stepped again beside the moved ones.
    flags = ("--checkpoint_interval=0",)
    daemons = [fresh_daemons(f"--state_dir={tmp_path / str(i)}", *flags) for i in range(3)]
    named = [{"target": d.target, "identity": f"optstated-{i}"} for i, d in enumerate(daemons)]
    client, groups = checkpointed_at_one_then_at_two(named[:2], "u/")
    for i in (0, 1):
        os.mkdir(tmp_path / str(i) / "MOVES.new")
    with pytest.raises(optstate.FailedPrecondition, match="cannot keep the note of a move"):
        client.rebalance(named)
    held = optstate.Client(named, **WIRE).list_groups()
    assert sorted(g.name for g in held) == sorted(groups)
    assert not [g for g in held if g.moved_to or g.member == "optstated-2"]
    step_all(client, groups, 3)  # every group steps where it was


@pytest.mark.parametrize("action", ["import", "delete"])
def test_a_rebalance_killed_part_way_can_be_undone_by_a_rebalance_back(fresh_daemons, action):
    # Killed after the seal (before the import, or before the delete), then the operator
    # goes back to the old member list: the old owner's copy is the current one, but it was
    # sealed for the move. It was kept as it was, sealed, the other copy deleted: the group
    # could be stepped nowhere ("moved to daemon ...").
    daemons = [fresh_daemons() for _ in range(3)]
    two = [d.target for d in daemons[:2]]
    three = two + [daemons[2].target]
    groups = model([int(s) for s in np.random.default_rng(61).integers(1, 5_000, 24)])
    multi = optstate.Client(two, **WIRE)
    register(multi, groups)
    for step in (1, 2):
        step_all(multi, groups, step)
    expected = states(multi, groups)
    killed_at = rebalance_killed_at(two, three, action, 1)
    moving = killed_at.split()[1]
    back = optstate.Client(three, **WIRE).rebalance(two)
    assert back["moved"] + back["copies_deleted"] + back["untouched"] >= 1, (killed_at, back)
    multi = optstate.Client(two, **WIRE)
    holders = {}
    for d in daemons:
        for g in optstate.Client(d.target, **WIRE).list_groups():
            assert not g.moved_to, (killed_at, g.name, g.moved_to)
            holders.setdefault(g.name, []).append(d.target)
    assert sorted(holders) == sorted(groups) and all(len(h) == 1 for h in holders.values())
    for name, state in expected.items():
        now = multi.export_state(name)
        for field in ("params", "exp_avg", "exp_avg_sq", "page_steps"):
            assert np.array_equal(getattr(now, field), getattr(state, field)), (name, field)
    outs = step_all(multi, groups, 3)  # refused before: "moved to daemon ..."
    assert moving in outs
    reference = optstate.Client(fresh_daemons().target, **WIRE)
    register(reference, groups)
    for step in (1, 2):
        step_all(reference, groups, step)
    assert_bit_identical(outs, step_all(reference, groups, 3))


def moving_and_alone(fresh_daemons):
    """16 groups of 1000 elements registered on the first of two daemons (`moving`, the
    member list a Rebalance moves them over, through `client`) and on a third daemon
    alone (`alone`), to step the same groups as a reference."""
    daemons = [fresh_daemons() for _ in range(3)]
    moving = [{"target": d.target, "identity": f"optstated-{i}"}
              for i, d in enumerate(daemons[:2])]
    alone = optstate.Client(daemons[2].target, **WIRE)
    client = optstate.Client(moving[:1], **WIRE)
    groups = model([1000] * 16)
    register(client, groups)
    register(alone, groups)
    return moving, alone, client, groups


def test_a_group_whose_exp_avg_sq_overflowed_moves_and_steps_on(fresh_daemons):
    # A finite gradient of 1e22 squares past float32's range: exp_avg_sq holds inf, in
    # torch's AdamW as in the daemon. ImportState refused that inf, so Rebalance stopped at
    # the import with the group sealed on its old daemon, where no step could reach it.
    moving, alone, client, groups = moving_and_alone(fresh_daemons)
    for c in (client, alone):
        batch = []
        for name, values in groups.items():
            grad = gradient(sum(map(ord, name)), values.size).copy()
            grad[7] = 1e22
            batch.append((name, grad, np.empty_like(grad)))
        c.step(batch, 1)
    done = client.rebalance(moving)
    assert done["moved"] > 0, done
    moved = [g.name for g in client.list_groups() if g.member == "optstated-1"]
    assert moved, "no group moved to the second daemon"
    after = step_all(optstate.Client(moving, **WIRE), groups, 2)
    assert_bit_identical(after, step_all(alone, groups, 2))


def test_a_diverged_group_moves_as_it_is_and_steps_on(fresh_daemons):
    # Finite gradients of 3.4e38 then -3.4e38 leave exp_avg -inf and params nan (torch's
    # AdamW too). A plain ImportState refuses such values; a Rebalance's import says it
    # takes whatever a step left, so the group moves bit for bit and steps on as before.
    moving, alone, client, groups = moving_and_alone(fresh_daemons)
    for step, edge in ((1, 3.4e38), (2, -3.4e38)):
        for c in (client, alone):
            batch = []
            for name, values in groups.items():
                grad = gradient(sum(map(ord, name)), values.size).copy()
                grad[7] = edge
                batch.append((name, grad, np.empty_like(grad)))
            c.step(batch, step)
    state = alone.export_state(next(iter(groups)))
    assert np.isnan(state.params[7]) and np.isinf(state.exp_avg[7])
    done = client.rebalance(moving)
    assert done["moved"] > 0, done
    moved = [g.name for g in client.list_groups() if g.member == "optstated-1"]
    assert moved, "no group moved to the second daemon"
    for name in moved:
        here = optstate.Client(moving[1]["target"], **WIRE).export_state(name)
        there = alone.export_state(name)
        assert here.params.tobytes() == there.params.tobytes()
        assert here.exp_avg.tobytes() == there.exp_avg.tobytes()
    after = step_all(optstate.Client(moving, **WIRE), groups, 3)
    assert_bit_identical(after, step_all(alone, groups, 3))
