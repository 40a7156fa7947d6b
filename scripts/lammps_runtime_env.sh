# Sourced: unpack a LAMMPS + MPICH runtime carry (scripts/lammps_carry.sh) into $1's folder
# (default /tmp/lammps-runtime-deepmd) and put it on PYTHONPATH and PATH; its first line is echoed.
#   source scripts/lammps_runtime_env.sh .lammps-carry/lammps-runtime-deepmd.tar.xz [ROOT]
# deepmd-kit loads libmpi from where the mpich file list names it (the wheel's own layout,
# mpich-X.data/data/lib/libmpi.so.12); the carry keeps it in prefix/lib, its fabric libraries in
# prefix/lib/mpich (libmpi's RUNPATH $ORIGIN/mpich): that folder is linked in whole.
lammps_runtime_carry=$1
lammps_runtime_root=${2:-/tmp/lammps-runtime-deepmd}
rm -rf "$lammps_runtime_root" && mkdir -p "$lammps_runtime_root" && tar -xJf "$lammps_runtime_carry" -C "$lammps_runtime_root"
lammps_runtime_site=$(echo "$lammps_runtime_root"/prefix/lib/python3*/site-packages)
for info in "$lammps_runtime_site"/mpich-*.dist-info; do
  mkdir -p "${info%.dist-info}.data/data" && ln -sfn "$lammps_runtime_root/prefix/lib" "${info%.dist-info}.data/data/lib"
done
export PYTHONPATH=$lammps_runtime_site${PYTHONPATH:+:$PYTHONPATH} PATH=$lammps_runtime_root/prefix/bin:$PATH
echo "LAMMPS runtime from $lammps_runtime_carry: $(head -n 1 "$lammps_runtime_root/MANIFEST.txt")"
