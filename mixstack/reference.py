"""``mixstack.reference``: every operator in plain PyTorch, for any float dtype and device.

Level 0 runs these, and every test holds the kernels to them: the mixing stack
(``mixing_stack``, and ``forward`` / ``backward`` / ``double_backward`` spelled out from the
saved values; ``mixstack.stack.reference``) and the convolution's rotations (``rotate_in``,
``rotate_out_sum``; ``mixstack.conv.reference``).
"""

from .conv.reference import rotate_in, rotate_out_sum
from .stack.reference import backward, double_backward, forward, forward_state, mixing_stack

__all__ = ["backward", "double_backward", "forward", "forward_state", "mixing_stack", "rotate_in", "rotate_out_sum"]
