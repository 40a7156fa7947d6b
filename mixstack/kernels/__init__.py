"""Triton ``@triton.jit`` bodies of the mixing stack (no launch logic here).

``activations`` holds the one copy of each pointwise derivative; ``gemm`` the
block-diagonal GEMM with its epilogues; ``gate`` the gate and the pointwise
backward; ``reduce`` the alpha gradient; ``curvature`` the second derivatives and the
double backward's tangent step; ``wgrad`` the weight gradients' chunked reductions.  The
convolution around the stack: ``rotation`` holds its three rotations once, ``rotate_in`` and
``rotate_out`` the edge-parallel kernels, ``segment_sum`` the per-atom sums in a fixed order.
"""
