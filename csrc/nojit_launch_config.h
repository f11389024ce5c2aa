/*
 * The one launch configuration of every nojit launch path: nojit_launch (nojit_cuda.c), the Triton fast path
 * (nojit_fast.c) and the TileLang fast path (nojit_fast_tilelang.h) all fill cuLaunchKernelEx's config here.
 *
 * Attributes, in this order, as Triton's launcher sets them: a cluster of more than one block (with the spread
 * scheduling policy), programmatic stream serialization (PDL), cooperative. The callers check their cluster
 * (1..NOJIT_MAX_CLUSTER_BLOCKS blocks) before; the product is taken in 64 bits so it cannot wrap here.
 */
#ifndef NOJIT_LAUNCH_CONFIG_H
#define NOJIT_LAUNCH_CONFIG_H

#include <stdint.h>
#include <string.h>

#include "nojit_cuda_abi.h"

#define NJ_MAX_LAUNCH_ATTRS 4 /* cluster, its scheduling policy, PDL, cooperative */

/* attrs holds NJ_MAX_LAUNCH_ATTRS; grid, block and cluster are (x, y, z). */
static inline void nj_launch_config(NjLaunchConfig *cfg, NjLaunchAttribute *attrs, const uint32_t grid[3],
                                    const uint32_t block[3], uint32_t shared_bytes, uint64_t stream,
                                    const uint32_t cluster[3], int pdl, int cooperative) {
  unsigned n = 0;
  memset(attrs, 0, NJ_MAX_LAUNCH_ATTRS * sizeof(NjLaunchAttribute));
  if ((uint64_t)cluster[0] * cluster[1] * cluster[2] > 1) {
    attrs[n].id = NJ_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attrs[n].value.clusterDim.x = cluster[0];
    attrs[n].value.clusterDim.y = cluster[1];
    attrs[n].value.clusterDim.z = cluster[2];
    n++;
    attrs[n].id = NJ_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE;
    attrs[n].value.clusterSchedulingPolicyPreference = NJ_CLUSTER_SCHEDULING_POLICY_SPREAD;
    n++;
  }
  if (pdl) {
    attrs[n].id = NJ_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attrs[n].value.programmaticStreamSerializationAllowed = 1;
    n++;
  }
  if (cooperative) {
    attrs[n].id = NJ_LAUNCH_ATTRIBUTE_COOPERATIVE;
    attrs[n].value.cooperative = 1;
    n++;
  }
  memset(cfg, 0, sizeof(*cfg));
  cfg->gridDimX = grid[0];
  cfg->gridDimY = grid[1];
  cfg->gridDimZ = grid[2];
  cfg->blockDimX = block[0];
  cfg->blockDimY = block[1];
  cfg->blockDimZ = block[2];
  cfg->sharedMemBytes = shared_bytes;
  cfg->hStream = (NjStream)(uintptr_t)stream;
  cfg->attrs = n ? attrs : NULL;
  cfg->numAttrs = n;
}

#endif
