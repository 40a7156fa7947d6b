"""The ground floor every room stands on: the ``MIXSTACK_*`` settings (``config``), the version,
and the stack's row layout with the argument checks both halves share (``layout``)."""
