"""Triton ``@triton.jit`` bodies of the mixing stack (no launch logic here).

``activations`` holds the one copy of each pointwise derivative; ``gemm`` the
block-diagonal GEMM with its epilogues; ``gate`` the gate and the pointwise
backward; ``reduce`` the alpha gradient; ``curvature`` the second derivatives and the
double backward's tangent step; ``wgrad`` the weight gradients' chunked reductions.
"""
