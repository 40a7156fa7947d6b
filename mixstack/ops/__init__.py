"""The stack as operators: launch configs, launchers, and the ``torch.library`` ops.

| module | what |
|---|---|
| ``configs`` | level-1 launch configs and the per-kernel rules (no tables) |
| ``launchers`` | allocate the surfaces and launch the kernels of one forward / backward |
| ``training`` | launch the weight gradients, the kept chain and the double backward |
| ``stack`` | ``mixstack::stack_forward`` / ``stack_backward`` / ``stack_double_backward`` (``triton_op``) and their autograd |
| ``conv_launchers`` | launch the convolution's kernels (rotate-in, rotate-out, segment sums) |
| ``conv`` | ``mixstack::rotate_in`` / ``rotate_out_sum`` and their backward ops, with autograd |

Importing ``mixstack.ops.stack`` registers the operators; nothing here is
imported at package import so that ``mixstack.tuning`` can read ``configs``
without pulling in the operators that read the tables.
"""
