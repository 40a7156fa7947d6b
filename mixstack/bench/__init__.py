"""``mixstack bench``: how fast, how much memory, how exact.

- ``timing``: the one timing loop (variants interleaved in rotating order), shared with the tuner;
- ``counts``: counted FLOPs and minimum bytes of a pass;
- ``shapes``: the docs/contract.md §8 shapes, small CPU shapes, random inputs;
- ``runner``: runs variants x shapes x passes with peak memory, accuracy and dispatch paths;
- ``report``: JSON, Markdown and PNG results files;
- ``env``: the environment record (device, versions, git, date) of results and ``mixstack info``.

Importing this package imports neither matplotlib nor rich.
"""

from ..measure.counts import flops, min_bytes
from ..measure.shapes import SMALL, STANDARD, BenchShape, make_inputs
from ..measure.timing import Samples, Task, beats, time_interleaved
from .stack_bench import BenchConfig, default_config, run_bench

__all__ = [
    "SMALL", "STANDARD", "BenchConfig", "BenchShape", "Samples", "Task", "beats", "default_config",
    "flops", "make_inputs", "min_bytes", "run_bench", "time_interleaved",
]
