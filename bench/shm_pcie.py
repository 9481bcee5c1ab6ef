"""NCCL through host memory (its SHM transport) on a PCIe box without peer access: the bus
bandwidth the simulator predicts on `pcie-rtx4090` (8 RTX 4090, PCIe 4.0 x16, no peer
access) by op and size, as nccl-tests runs them (`simulate_run`), with the SHM path's rate derived from the host link, and with
NCCL at its direct rate on staged paths (the model before SHM had a rate of its own).
docs/validation.md quotes its table.

    python bench/shm_pcie.py
"""

from __future__ import annotations

from dataclasses import replace

from commdsl.calibrate.nccl_tests import Run, busbw_gb_per_s, simulate_run
from commdsl.ir import OpKind, Transport
from commdsl.machine import resolve_machine
from commdsl.machine.model import Machine

OPS = (OpKind.ALL_REDUCE, OpKind.ALL_GATHER, OpKind.SEND)
SIZES = (1 << 20, 64 << 20, 512 << 20)


def direct_rate(machine: Machine) -> Machine:
    """The machine with NCCL at its direct rate on host-staged paths."""
    return replace(machine, staged=(*machine.staged, (Transport.NCCL, machine.transport(Transport.NCCL))))


def main() -> None:
    m = resolve_machine("pcie-rtx4090")
    print(f"SHM path: {m.staged_transport(Transport.NCCL)}")
    print("| op | size | busbw, SHM path (GB/s) | busbw, NCCL at its direct rate (GB/s) |")
    print("| --- | --- | --- | --- |")
    for op in OPS:
        for size in SIZES:
            shm = busbw_gb_per_s(op, 8, size, simulate_run(m, Run(op, 8), size))
            direct = busbw_gb_per_s(op, 8, size, simulate_run(direct_rate(m), Run(op, 8), size))
            print(f"| {op.value} | {size >> 20} MiB | {shm:.2f} | {direct:.2f} |")


if __name__ == "__main__":
    main()
