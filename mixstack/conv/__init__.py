"""The SO(2) convolution around the stack: edge frames and packed Wigner rows, rotate-in and
rotate-out-sum, each as plain PyTorch, launchers and ``torch.library`` operators, and the public
functions (docs/architecture.md)."""
