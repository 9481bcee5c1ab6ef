"""NCCL's SHM (host-memory) transport between GPUs without peer access: its rate comes
from the machine's host link where the machine file does not give it
(`Machine.nccl_shm_link`), every staged NCCL transfer of a GPU shares it, and machines
whose GPUs all have peer access are untouched."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from commdsl.calibrate.nccl_tests import Run, busbw_gb_per_s, simulate_run
from commdsl.dsl import load_schedule_text
from commdsl.ir import OpKind, Transport
from commdsl.machine import load_machine_text, resolve_machine
from commdsl.machine.model import SHM_SHARE_OF_HOST_LINK, LinkSpec
from commdsl.sim import simulate

REPO = Path(__file__).resolve().parents[1]
PRESETS = REPO / "commdsl" / "machine" / "presets"


def _bench():
    spec = importlib.util.spec_from_file_location("shm_pcie", REPO / "bench" / "shm_pcie.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BENCH = _bench()


def op_time_us(machine, op: OpKind, size: int, network: str = "flow") -> float:
    return simulate_run(machine, Run(op, 8), size, network)



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
    direct = BENCH.direct_rate(m)
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


def test_calibrate_from_nccl_tests_fits_the_shm_rate(tmp_path):
    """A log of an 8-GPU box whose SHM path runs at half the derived rate: calibrate with
    `pcie-rtx4090` as the base fits the SHM rate (and reports it fitted, writing the
    derived rate scaled), and the fitted machine reproduces the log."""
    from commdsl.calibrate.nccl_tests import fitted_machine_text, from_nccl_tests
    from tests.test_nccl_tests_calibrate import _log_text

    base = resolve_machine("pcie-rtx4090")
    truth = load_machine_text(fitted_machine_text((PRESETS / "pcie-rtx4090.yaml").read_text(), {"scale.shm": 0.5}, ["truth"]), "truth.yaml")
    assert truth.staged_transport(Transport.NCCL).bandwidth_gb_per_s == pytest.approx(0.5 * base.staged_transport(Transport.NCCL).bandwidth_gb_per_s)
    run = Run(OpKind.ALL_REDUCE, 8)
    sizes = [2**k for k in range(20, 30, 2)]
    log = tmp_path / "all_reduce_4090.log"
    log.write_text(_log_text("all_reduce_perf", run, [(s, simulate_run(truth, run, s)) for s in sizes]))
    lines: list[str] = []
    fitted = from_nccl_tests([str(log)], str(tmp_path / "m.yaml"), "pcie-rtx4090", echo=lines.append)
    assert "scale.shm" in next(line for line in lines if line.startswith("    fitted: "))
    # One ring log fixes the SHM rate times Simple's efficiency, not each: the rate moves
    # from the derived one towards the truth, the efficiency takes the rest.
    shm = fitted.staged_transport(Transport.NCCL).bandwidth_gb_per_s
    assert truth.staged_transport(Transport.NCCL).bandwidth_gb_per_s * 0.95 <= shm < 0.8 * base.staged_transport(Transport.NCCL).bandwidth_gb_per_s
    for s in sizes:
        assert simulate_run(fitted, run, s) == pytest.approx(simulate_run(truth, run, s), rel=0.05), s
