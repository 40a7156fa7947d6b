"""Import deepmd-kit's PyTorch backend, also where its compiled op library cannot load.

``import deepmd.pt`` loads ``libdeepmd_op_pt.so`` first (``deepmd.pt.cxx_op``). A wheel built
against another torch than the one installed raises there, and the whole backend with it,
although those ops serve only model compression and the LAMMPS plugin: nothing the SeZM
models, their training or ``dp --pt test`` call.  ``deepmd_pt`` imports the backend as usual
and, only when that load fails with deepmd-kit's own version or ABI message (or, for a wheel,
when the ``mpich`` package its op library links against is missing, or its MPI library cannot
be opened), imports it again
with a stand-in ``deepmd.pt.cxx_op`` that reports the ops as absent
(``ENABLE_CUSTOMIZED_OP = False``, the value deepmd-kit itself uses when the library file is
missing), and logs why.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import sys
import types

logger = logging.getLogger(__name__)

INSTALL_HINT = 'pip install -e ".[deepmd]" from a clone of mixstack'
_OP_LIBRARY = "deepmd_op_pt"
_STAND_IN = "deepmd.pt.cxx_op"
_MPI_PACKAGE = "mpich"                # a wheel-built deepmd-kit loads libmpi from it before its ops


def deepmd_pt():
    """Import and return ``deepmd.pt``; raise an ``ImportError`` naming the fix when deepmd-kit
    is not installed."""
    try:
        return importlib.import_module("deepmd.pt")
    except importlib.metadata.PackageNotFoundError as err:
        if err.name != _MPI_PACKAGE:
            raise
        reason = f"the {_MPI_PACKAGE} package its MPI library comes from is not installed"
    except ModuleNotFoundError as err:
        if err.name and err.name.split(".")[0] in {"deepmd", "torch"}:
            raise ImportError(f"mixstack.deepmd needs deepmd-kit >= 3.2 with its PyTorch backend "
                              f"({INSTALL_HINT})") from err
        raise
    except RuntimeError as err:
        if _OP_LIBRARY not in str(err):
            raise
        reason = str(err).splitlines()[0]
    except (OSError, StopIteration) as err:
        # the MPI library a wheel's ops link against, found in mpich's files and opened with
        # ctypes before the ops: missing (StopIteration) or missing what it links (OSError)
        if not _raised_in_op_loader(err):
            raise
        reason = f"the MPI library its ops link against did not load ({type(err).__name__}: {err})"
    stand_in = types.ModuleType(_STAND_IN, "Stand-in for deepmd-kit's compiled op library, which did not load: "
                                           "its ops (model compression, the LAMMPS plugin) are absent.")
    stand_in.ENABLE_CUSTOMIZED_OP = False
    sys.modules[_STAND_IN] = stand_in
    logger.warning("deepmd-kit's op library %s did not load (%s); deepmd.pt runs without it "
                   "(model compression and deepmd's LAMMPS ops are unavailable, the models are not)",
                   _OP_LIBRARY, reason)
    return importlib.import_module("deepmd.pt")


def _raised_in_op_loader(err: BaseException) -> bool:
    """Whether ``err`` came out of deepmd-kit's op-library loader (``deepmd/pt/cxx_op.py``)."""
    tb = err.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.replace("\\", "/").endswith("deepmd/pt/cxx_op.py"):
            return True
        tb = tb.tb_next
    return False


def op_library_stood_in() -> bool:
    """True when ``deepmd_pt`` imported the backend with the stand-in op library."""
    module = sys.modules.get(_STAND_IN)
    return module is not None and getattr(module, "__file__", None) is None
