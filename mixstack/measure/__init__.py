"""Measuring, for the tuner and the benches alike: the one timing loop, run environments, FLOP and
byte counts, the standard shapes, compiling ahead (prewarm, the compile log), the offline
compiler report and the result writers."""
