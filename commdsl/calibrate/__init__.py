"""Calibration: measure this machine with torch.distributed and fit the machine model.

`torchrun --nproc_per_node=N -m commdsl.calibrate --out machine.yaml`; the fitting
itself (commdsl.calibrate.fit) needs no torch.
"""
