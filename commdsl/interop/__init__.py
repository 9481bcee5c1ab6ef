"""Other tools' formats, read and written: torch.distributed.pipelining's schedule CSV
(`commdsl.interop.pipelining`) and PyTorch profiler (Kineto) traces."""
