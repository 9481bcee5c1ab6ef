"""nccl-tests' time per op of back-to-back chain ops (NCCL's ring broadcast and reduce).

`calibrate --from-nccl-tests` fits a machine to a log by timing every point of it with a
closed form, thousands of times over. A broadcast or reduce point is a chain (`nccl.Chain`:
on each ring the members go one after another, no barrier) replayed over nccl-tests' timed
loop, rings x members x ops steps, where any other op is a formula. `ChainTerms` keeps a
chain point's positions as flat columns, each lead and part a linear form in the fitted
latencies and in 1 / rate, and `run_us` evaluates it: compiled (`chain_times.pxd`,
`commdsl.native`), a C loop; as Python, the same arithmetic in the same order, so both
give the very same floats.
"""

from __future__ import annotations

from array import array

Rows = tuple[tuple[float, ...], ...]
"""Per ring, per position: a float."""


class ChainTerms:
    """A chain op's rings, each position's lead and part as `unit . coefficients + bytes /
    rate + fixed` (`unit`: the fitted latencies, per entry of the fit's latency list)."""

    def __init__(self, orders: tuple[tuple[int, ...], ...], lead_latency: tuple[tuple[tuple[float, ...], ...], ...],
                 lead_bytes: Rows, lead_fixed: Rows, part_latency: tuple[tuple[tuple[float, ...], ...], ...],
                 part_bytes: Rows, part_fixed: Rows) -> None:  # fmt: skip
        self.rings = len(orders)
        """How many distinct rings the op's channels run."""
        self.members = len(orders[0])
        """The chain's members (every ring visits each once)."""
        self.latencies = len(lead_latency[0][0]) if self.members else 0
        """Fitted latencies a lead or a part may scale (the columns of `lead_coefficients`)."""
        index = {rank: i for i, rank in enumerate(orders[0])}
        self.member_at = array("q", [index[rank] for order in orders for rank in order])
        """Per ring and position (ring-major), the member there (an index into the first ring's order)."""
        self.lead_coefficients = array("d", [c for ring in lead_latency for row in ring for c in row])
        """Per ring, position and latency: the lead's us per us of that latency."""
        self.part_coefficients = array("d", [c for ring in part_latency for row in ring for c in row])
        """The same for the part."""
        self.lead_bytes = array("d", [v for ring in lead_bytes for v in ring])
        """Per ring and position: the lead's bytes (us at 1 B/us)."""
        self.lead_fixed = array("d", [v for ring in lead_fixed for v in ring])
        """Per ring and position: the lead's part that scales with nothing fitted."""
        self.part_bytes = array("d", [v for ring in part_bytes for v in ring])
        """The same as `lead_bytes` for the part."""
        self.part_fixed = array("d", [v for ring in part_fixed for v in ring])
        """The same as `lead_fixed` for the part."""

    def run_us(self, unit: array, rate: float, launch_us: float, iters: int) -> float:
        """nccl-tests' time per op of `iters` such ops back to back at `rate` (B/us) with
        the latencies `unit` (`array('d')`, one per coefficient column), each rank's host
        launching an op every `launch_us`, its first at `launch_us`: each member's end of
        its last op, averaged over the members, over `iters` (as `commdsl.sim.chains` runs
        them and nccl-tests reports them)."""
        size = self.rings * self.members
        lead = array("d", bytes(8 * size))
        part = array("d", bytes(8 * size))
        _forms(self.lead_coefficients, self.lead_bytes, self.lead_fixed, unit, rate, self.latencies, lead)
        _forms(self.part_coefficients, self.part_bytes, self.part_fixed, unit, rate, self.latencies, part)
        end = array("d", bytes(8 * self.members))
        arrival = array("d", bytes(8 * self.members))
        _replay(self.member_at, lead, part, self.rings, self.members, launch_us, iters, end, arrival)
        total = 0.0
        for i in range(self.members):
            total += end[i]
        return total / self.members / iters


def _forms(coefficients: array, moved: array, fixed: array, unit: array, rate: float, latencies: int, out: array) -> None:
    """out[p] = sum of coefficients[p, l] x unit[l], + moved[p] / rate, + fixed[p]."""
    for p in range(len(out)):
        value = 0.0
        for col in range(latencies):
            value += coefficients[p * latencies + col] * unit[col]
        out[p] = value + moved[p] / rate + fixed[p]


def _replay(member_at: array, lead: array, part: array, rings: int, members: int, launch_us: float, iters: int,
            end: array, arrival: array) -> None:  # fmt: skip
    """`iters` ops back to back (`ChainTerms.run_us`); `end` ends with each member's end of
    the last. On ring j, position k begins at its member's arrival, and not before position
    k-1 began plus k's lead; it ends its part after, and not before k-1 ended."""
    for i in range(1, iters + 1):
        issue = i * launch_us
        for m in range(members):
            arrival[m] = end[m] if end[m] > issue else issue
        for j in range(rings):
            begin_before = 0.0
            end_before = 0.0
            for k in range(members):
                p = j * members + k
                m = member_at[p]
                if k == 0:
                    begin = arrival[m]
                    finish = begin + part[p]
                else:
                    begin = begin_before + lead[p]
                    if arrival[m] > begin:
                        begin = arrival[m]
                    finish = begin + part[p]
                    if end_before > finish:
                        finish = end_before
                if j == 0 or finish > end[m]:
                    end[m] = finish
                begin_before = begin
                end_before = finish
