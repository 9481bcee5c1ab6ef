"""Draw the README's picture: a bundled schedule predicted and measured, on one time axis.

    python tools/readme_figure.py                  # calibrate (--quick), simulate, run, compare, draw
    python tools/readme_figure.py --machine M.yaml # skip calibration: use this machine file

It does what a user does, through the real command lines, on this machine (2 gloo ranks):
`commdsl calibrate -n 2 --quick`, `commdsl simulate 1f1b --samples 25 --trace`,
`commdsl run 1f1b -n 2 --out`, then draws both timelines with `commdsl.report.timeline_svg`
into docs/images/1f1b_predicted_vs_measured.svg, titled with the makespans, the error, the
machine and the date. It takes a few minutes (the calibration most of them).
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "images" / "1f1b_predicted_vs_measured.svg"
PARAMS = ["-p", "stages=2", "-p", "microbatches=4", "-p", "act=4MiB", "-p", "t_fwd=10ms", "-p", "t_bwd=20ms"]


def _commdsl(*args: str) -> None:
    print("$ commdsl " + " ".join(args), flush=True)
    subprocess.run([sys.executable, "-m", "commdsl.cli", *args], check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--machine", help="a calibrated machine file (default: calibrate now, --quick)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()

    import commdsl
    from commdsl.report import timeline_svg

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        machine = args.machine or str(work / "machine.yaml")
        if args.machine is None:
            _commdsl("calibrate", "-n", "2", "--quick", "--out", machine)
        _commdsl("simulate", "1f1b", *PARAMS, "--machine", machine, "--samples", "25", "--trace", str(work / "predicted.json"),
                 "--gantt", "never")  # fmt: skip
        _commdsl("run", "1f1b", "-n", "2", *PARAMS, "--out", str(work / "measured.json"))
        predicted = commdsl.read_timeline(work / "predicted.json")
        measured = commdsl.read_timeline(work / "measured.json")
        cmp = commdsl.compare(predicted, measured)
        how = f"({args.machine})" if args.machine else "calibrated on this machine with --quick"
    day = datetime.date.today().isoformat()
    title = (f"1f1b, 2 stages x 4 microbatches, on 2 gloo ranks: predicted {cmp.predicted_makespan_us / 1e3:.1f} ms, "
             f"measured {cmp.measured_makespan_us / 1e3:.1f} ms, error {cmp.makespan_error_pct:+.1f}%",
             f"predicted on a machine file {how}; measured with commdsl run; {day}, tools/readme_figure.py")  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(timeline_svg(cmp, predicted, measured, title=title) + "\n")
    print(f"wrote {args.out}: {title[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
