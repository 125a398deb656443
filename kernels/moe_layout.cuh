// moe_layout.cuh — the grouping's int layout (moe_route.h) as device and host code reads it, shared
// by the selection that writes it (moe_route.cu) and the expert launches that read it (moe_experts.cu).
#pragma once

// The grouping of T·K entries (moe_route.h: sd_cuda_moe_groups_ints).
struct moe_layout {
    int n, gc;
    __host__ __device__ moe_layout(int T, int K, int E) : n(T * K), gc(T * K < E ? T * K : E) {}
    __host__ __device__ int *gexp(int *g) const { return g + 1; }
    __host__ __device__ int *gstart(int *g) const { return g + 1 + gc; }
    __host__ __device__ int *ent(int *g) const { return g + 2 + 2 * gc; }
    __host__ __device__ int *ent_e(int *g) const { return g + 2 + 2 * gc + n; }
    __host__ __device__ const int *gexp(const int *g) const { return g + 1; }
    __host__ __device__ const int *gstart(const int *g) const { return g + 1 + gc; }
    __host__ __device__ const int *ent(const int *g) const { return g + 2 + 2 * gc; }
    __host__ __device__ const int *ent_e(const int *g) const { return g + 2 + 2 * gc + n; }
    __host__ __device__ size_t ints() const { return 2 + 2 * (size_t)gc + 2 * (size_t)n; }
};

