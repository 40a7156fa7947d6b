"""The mixing stack, from its math up to its module: the plain-PyTorch reference, the launchers
and ``torch.library`` operators over ``mixstack.kernels``, the level-3 decision, the public
function and ``MixingStack`` (docs/architecture.md)."""
