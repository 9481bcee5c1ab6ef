"""The flow network's link statistics (`FlowNetwork.link_stats`, `--links`, the JSON's
"links") and trace counters (`counter_columns`) against sample-by-sample references:
the network's log expanded one sample at a time and sorted by time; a channel's busy
time summed from each sample with a load to the next, its peak the largest load; a
counter shown where a channel's last sample at an instant changes its value."""

from __future__ import annotations

import random
from array import array
from itertools import chain

import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from commdsl.dsl import load_schedule, load_schedule_text
from commdsl.machine import resolve_machine
from commdsl.sim import simulate
from commdsl.sim.flow import FlowNetwork, time_order


def event_order(net: FlowNetwork) -> list[tuple[float, int, float]]:
    """Every (time, channel, load) sample in event order, expanded from the log one by
    one: the event samples up to each solo interval's place, then per interval its start
    on each of its channels, then its end on each."""
    out = []
    solo = sorted(range(len(net._solo_at)), key=lambda j: (net._solo_at[j], j))
    i = 0
    for j in solo:
        while i < net._solo_at[j]:
            out.append((net._s_t[i], net._s_c[i], net._s_v[i]))
            i += 1
        demands = net._solo_demands[j]
        out += [(net._solo_t0[j], c, w * net._solo_rate[j]) for c, w in demands]
        out += [(net._solo_t1[j], c, 0.0) for c, _w in demands]
    out += zip(net._s_t[i:], net._s_c[i:], net._s_v[i:])
    return out


def reference_stats(samples: list[tuple[float, int, float]]) -> dict[int, tuple[float, float]]:
    """Per channel, (busy us, largest load) from the samples of every channel in time order."""
    busy: dict[int, float] = {}
    top: dict[int, float] = {}
    since: dict[int, float] = {}
    for t, c, v in sorted(samples, key=lambda s: s[0]):
        if c in since:
            busy[c] = busy.get(c, 0.0) + (t - since.pop(c))
        if v > 0.0:
            since[c] = t
        top[c] = max(top.get(c, 0.0), v)
    return {c: (busy.get(c, 0.0), top[c]) for c in top}


def reference_counters(net: FlowNetwork, samples: list[tuple[float, int, float]]) -> list[tuple[float, str, float]]:
    """Trace counters: per instant, each channel's last sample, shown where it changes."""
    out = []
    shown: dict[int, float] = {}
    by_time: dict[float, dict[int, float]] = {}
    for t, c, v in sorted(samples, key=lambda s: s[0]):
        by_time.setdefault(t, {})[c] = v
    for t, last in by_time.items():
        for c, v in last.items():
            if (shown[c] != v) if c in shown else (v != 0.0):
                shown[c] = v
                out.append((t, net.fabric.names[c], v / net.fabric.capacity[c]))
    return out


def check(net: FlowNetwork, makespan_us: float) -> int:
    """_sample_arrays, _channel_samples, link_stats and counter_columns against the
    references; the links compared."""
    samples = event_order(net)
    t, c, v = net._sample_arrays()
    assert list(zip(t, c, v)) == samples
    assert [samples[k] for k in chain.from_iterable(time_order(t))] == sorted(samples, key=lambda s: s[0])
    for ch, (times, loads) in enumerate(net._channel_samples()):
        assert list(zip(times, loads)) == [(tk, vk) for tk, ck, vk in samples if ck == ch], ch
    counters = reference_counters(net, samples)
    for chunk in (1, 1 << 14):  # a chunk per instant; all in one
        assert list(chain.from_iterable(zip(*columns) for columns in net.counter_columns(chunk))) == counters, chunk
    want = reference_stats(samples)
    stats = net.link_stats(makespan_us)
    names = net.fabric.names
    for s in stats:
        ch = names.index(s.name)
        busy, top = want.get(ch, (0.0, 0.0))
        assert s.busy_us == busy, s
        assert s.peak_utilization == top / net.fabric.capacity[ch], s
    return len(stats)


CHAIN = """
name: chain
params: {ranks: 8, count: 30}
world: ranks
streams: [s]
program: |
  for i in range(count):
      all_reduce x[i] 4MiB algo=ring
"""


def test_chained_collectives_match_the_reference():
    """A chain of identical collectives: long runs of one flow's solo intervals."""
    program = load_schedule_text(CHAIN, "chain.yaml")
    for network in ("flow", "flow-steps"):
        result = simulate(program, resolve_machine("h100-nvlink"), network)
        assert len(result.network_model._solo_at) >= 30
        assert check(result.network_model, result.makespan_us) == 16


def test_contended_transfers_match_the_reference():
    """Copies and NCCL sends sharing links: event samples between solo intervals."""
    result = simulate(load_schedule("memcpy_vs_nccl"), resolve_machine("pcie-nvlink-pairs"), "flow")
    assert len(result.network_model._s_t) > 0 and len(result.network_model._solo_at) > 0
    assert check(result.network_model, result.makespan_us) > 0


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_random_sample_logs_match_the_reference(seed: int):
    """Logs of every shape: event samples, runs of solo intervals of one flow's demands
    (long ones are expanded in whole arrays), other flows' intervals between them, ties,
    and intervals whose samples fall out of time order."""
    rng = random.Random(seed)
    net = FlowNetwork(simpy.Environment(), resolve_machine("h100-nvlink"), 8)
    nch = len(net.fabric.names)
    legs = [tuple((c, rng.choice([0.25, 0.5, 1.0, 2.0])) for c in rng.sample(range(nch), rng.randint(1, 6))) for _ in range(4)]
    now = 0.0
    for _ in range(rng.randint(0, 40)):
        if rng.random() < 0.4:
            for _ in range(rng.randint(1, 3)):
                net._s_t.append(now)
                net._s_c.append(rng.randrange(nch))
                net._s_v.append(rng.choice([0.0, rng.random() * 100]))
        else:
            demands = rng.choice(legs)
            for _ in range(rng.choice([1, 2, 7, 8, 9, 20])):
                start = now + (5.0 if rng.random() < 0.1 else 0.0)
                now += rng.choice([0.0, rng.random()])
                net._solo_at.append(len(net._s_t))
                net._solo_demands.append(demands)
                net._solo_t0.append(start)
                net._solo_t1.append(now)
                net._solo_rate.append(rng.random() * 10)
        now += rng.choice([0.0, rng.random()])
    for ch in range(nch):
        net._bytes[ch] = 1.0
    check(net, now + 1.0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 30), max_size=300), st.integers(1, 40))
def test_time_order_is_a_stable_sort_by_time(times: list[int], block: int):
    """`time_order`, a block at a time, lists what one stable sort does, whatever the
    disorder: times drawn from a few values (many ties), blocks of 1 to 40."""
    t = array("d", times)
    blocks = list(time_order(t, block))
    assert list(chain.from_iterable(blocks)) == sorted(range(len(t)), key=t.__getitem__)
    assert all(blocks)  # no empty list
