"""NCCL's SHM (host-memory) transport between GPUs without peer access: its rate comes
from the machine's host link where the machine file does not give it
(`Machine.nccl_shm_link`), every staged NCCL transfer of a GPU shares it, and machines
whose GPUs all have peer access are untouched."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from commdsl.calibrate.nccl_tests import _SCHEDULE, Run, _body, busbw_gb_per_s
from commdsl.dsl import load_schedule_text
from commdsl.ir import OpKind, Transport
from commdsl.machine import load_machine_text, resolve_machine
from commdsl.machine.model import SHM_SHARE_OF_HOST_LINK, LinkSpec
from commdsl.sim import simulate

PRESETS = Path(__file__).resolve().parents[1] / "commdsl" / "machine" / "presets"


def op_time_us(machine, op: OpKind, size: int, network: str = "flow", ranks: int = 8) -> float:
    """Steady-state time of one op of `size` on `ranks` ranks (five in a row, as nccl-tests runs them)."""
    program = load_schedule_text(_SCHEDULE.format(iters=5, ranks=ranks, body=_body(Run(op, ranks), size)), "<shm>")
    raw = simulate(program, machine, network).raw
    ends = sorted(raw.end[g] for g, o in enumerate(raw.ops) if o.rank == 0 and o.kind.is_comm)
    if op is OpKind.SEND:
        ends = ends[1::2]  # a batch's send and recv end together
    return (ends[-1] - ends[0]) / (len(ends) - 1)


def test_shm_link_derived_from_the_host_link():
    m = resolve_machine("pcie-rtx4090")
    assert m.topology.peer_access == ()  # `peer_access: none`
    assert all(t is not Transport.NCCL for t, _ in m.staged)  # the file gives no SHM rate: the simulator derives it
    shm = m.staged_transport(Transport.NCCL)
    nccl = m.transport(Transport.NCCL)
    assert shm == LinkSpec(nccl.latency_us + 2 * m.host_link.latency_us, SHM_SHARE_OF_HOST_LINK * m.host_link.bandwidth_gb_per_s)
    assert shm.bandwidth_gb_per_s < m.host_link.bandwidth_gb_per_s / 2


def test_the_derivation_reproduces_the_forum_posts_machine():
    """pcie-nvlink-pairs writes its SHM rate from its source's measurements; the share the
    derivation uses gives the same rate from its host link."""
    m = resolve_machine("pcie-nvlink-pairs")
    written = m.staged_transport(Transport.NCCL).bandwidth_gb_per_s
    assert m.nccl_shm_link().bandwidth_gb_per_s == pytest.approx(written, rel=0.01)


@pytest.mark.parametrize("network", ["flow", "analytic"])
@pytest.mark.parametrize("op", [OpKind.ALL_REDUCE, OpKind.ALL_GATHER, OpKind.SEND])
def test_collectives_run_at_the_shm_rate_not_the_pcie_rate(op, network):
    m = resolve_machine("pcie-rtx4090")
    shm = m.staged_transport(Transport.NCCL).bandwidth_gb_per_s
    busbw = busbw_gb_per_s(op, 8, 64 << 20, op_time_us(m, op, 64 << 20, network))
    assert 0.9 * shm <= busbw <= shm * 1.001, (busbw, shm)
    # The same machine with NCCL at its direct rate on staged paths (the model before SHM had its
    # own rate) runs at least twice as fast, bound by PCIe and host memory: the SHM path is what binds.
    direct = replace(m, staged=(*m.staged, (Transport.NCCL, m.transport(Transport.NCCL))))
    fast = busbw_gb_per_s(op, 8, 64 << 20, op_time_us(direct, op, 64 << 20, network))
    assert fast > 2 * busbw, (fast, busbw)


def test_a_written_shm_rate_wins():
    text = (PRESETS / "pcie-rtx4090.yaml").read_text()
    old = "  nccl: {latency_us: 6, bandwidth_gb_per_s: 24}"
    assert text.count(old) == 1
    m = load_machine_text(text.replace(old, old[:-1] + ", staged: {latency_us: 10, bandwidth_gb_per_s: 3}}"), "mine.yaml")
    assert m.staged_transport(Transport.NCCL) == LinkSpec(10, 3)
    busbw = busbw_gb_per_s(OpKind.ALL_REDUCE, 8, 64 << 20, op_time_us(m, OpKind.ALL_REDUCE, 64 << 20))
    assert 2.7 <= busbw <= 3.001, busbw


def test_a_gpus_shm_path_is_shared_by_its_sends():
    """Two sends out of one GPU to two peers share its SHM path: one alone runs at the
    path's rate, two take twice as long (their PCIe link alone would let each run at 12
    GB/s, twice the SHM rate)."""
    m = resolve_machine("pcie-rtx4090")

    def sends(peers: int) -> float:
        text = f"""
name: sends
world: 3
streams: [s]
program: |
  if rank == 0:
      hs = batch:
          for p in range({peers}):
              isend x[p] 64MiB to p + 1
      wait hs
  elif rank <= {peers}:
      recv x 64MiB from 0
"""
        return max(simulate(load_schedule_text(text, "<sends>"), m, "flow").raw.end)

    one, two = sends(1), sends(2)
    alone_us = (64 << 20) / (m.staged_transport(Transport.NCCL).bandwidth_gb_per_s * 1e3)
    assert one == pytest.approx(alone_us, rel=0.05), (one, alone_us)
    assert two == pytest.approx(2 * one, rel=0.05), (one, two)


def test_peer_access_everywhere_is_untouched():
    for name in ("dgx-h100", "dgx-a100", "hgx-h800", "dgx-h200"):
        m = resolve_machine(name)
        assert m.topology.peer_access is None
        assert m.staged_transport(Transport.NCCL) == m.transport(Transport.NCCL)


def test_calibration_scales_a_derived_shm_rate():
    """calibrate --from-nccl-tests scales the SHM rate where a log depends on it; on a machine
    that derives it (no `staged:`), the fitted file writes the derived rate, scaled."""
    import yaml

    from commdsl.calibrate.nccl_tests import RATES

    text = (PRESETS / "pcie-rtx4090.yaml").read_text()
    shm = next(r for r in RATES if r.name == "shm")
    doc = yaml.safe_load(text)
    shm.write(doc, 0.5)
    fitted = load_machine_text(yaml.safe_dump(doc, sort_keys=False), "fitted.yaml")
    derived = resolve_machine("pcie-rtx4090").staged_transport(Transport.NCCL)
    assert fitted.staged_transport(Transport.NCCL) == LinkSpec(derived.latency_us, 0.5 * derived.bandwidth_gb_per_s)
    untouched = yaml.safe_load(text)
    shm.write(untouched, 1.0)
    assert "staged" not in untouched["transports"]["nccl"]
