/*
 * The ggml side of the Arm static-analysis report (benches/arm/run.sh): calls one of ggml's
 * aarch64 matrix-vector kernels for the same work as nightshift's `arm_trace` example (ROWS
 * weight rows of K elements against BATCH activation rows), bracketed by two marker functions
 * so that a qemu-aarch64 execution trace can cut out exactly the kernel's instructions.
 * ggml's sources are not part of this repository: run.sh compiles them from the llama-cpp-sys-2
 * crate in the cargo registry and links them with this file.
 *
 *     ggml_trace PATH TYPE K ROWS BATCH
 *
 * PATH is how ggml's mul_mat would drive the kernel:
 *   dot     ggml_vec_dot_<type>_<vec_dot_type>(nrc = 1) for every (row, activation) pair;
 *   mmla    the same with nrc = 2 (2 rows x 2 activations per call, SMMLA), BATCH and ROWS even;
 *   repack  the interleaved-weight kernels: ggml_gemm_* on groups of 4 activation rows and
 *           ggml_gemv_* on the rest (the variant ggml picks on a CPU with i8mm).
 * The data are pseudo-random bytes: these kernels have no value-dependent branches, so the
 * executed instruction stream does not depend on the values.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>

#ifndef PR_SVE_GET_VL
#define PR_SVE_GET_VL 51
#endif

typedef void (*vec_dot_fn)(int n, float *s, size_t bs, const void *vx, size_t bx, const void *vy,
                           size_t by, int nrc);
typedef void (*gemx_fn)(int n, float *s, size_t bs, const void *vx, const void *vy, int nr, int nc);

/* ggml's kernels (compiled from the registry copy of llama.cpp by run.sh). */
#define DOT(name) void name(int, float *, size_t, const void *, size_t, const void *, size_t, int);
#define GEMX(name) void name(int, float *, size_t, const void *, const void *, int, int);
DOT(ggml_vec_dot_q2_K_q8_K)
DOT(ggml_vec_dot_q3_K_q8_K)
DOT(ggml_vec_dot_q4_K_q8_K)
DOT(ggml_vec_dot_q5_K_q8_K)
DOT(ggml_vec_dot_q6_K_q8_K)
DOT(ggml_vec_dot_q8_0_q8_0)
DOT(ggml_vec_dot_q4_0_q8_0)
DOT(ggml_vec_dot_q5_0_q8_0)
DOT(ggml_vec_dot_q4_1_q8_1)
DOT(ggml_vec_dot_q5_1_q8_1)
DOT(ggml_vec_dot_iq1_s_q8_K)
DOT(ggml_vec_dot_iq1_m_q8_K)
DOT(ggml_vec_dot_iq2_xxs_q8_K)
DOT(ggml_vec_dot_iq2_xs_q8_K)
DOT(ggml_vec_dot_iq2_s_q8_K)
DOT(ggml_vec_dot_iq3_xxs_q8_K)
DOT(ggml_vec_dot_iq3_s_q8_K)
DOT(ggml_vec_dot_iq4_nl_q8_0)
DOT(ggml_vec_dot_iq4_xs_q8_K)
DOT(ggml_vec_dot_tq1_0_q8_K)
DOT(ggml_vec_dot_tq2_0_q8_K)
DOT(ggml_vec_dot_mxfp4_q8_0)
DOT(ggml_vec_dot_nvfp4_q8_0)
DOT(ggml_vec_dot_q1_0_q8_0)
DOT(ggml_vec_dot_q2_0_q8_0)
GEMX(ggml_gemv_q4_K_8x8_q8_K)
GEMX(ggml_gemm_q4_K_8x8_q8_K)
GEMX(ggml_gemv_q5_K_8x8_q8_K)
GEMX(ggml_gemm_q5_K_8x8_q8_K)
GEMX(ggml_gemv_q6_K_8x8_q8_K)
GEMX(ggml_gemm_q6_K_8x8_q8_K)
GEMX(ggml_gemv_q8_0_4x8_q8_0)
GEMX(ggml_gemm_q8_0_4x8_q8_0)
GEMX(ggml_gemv_q4_0_4x8_q8_0)
GEMX(ggml_gemm_q4_0_4x8_q8_0)
GEMX(ggml_gemv_iq4_nl_4x4_q8_0)
GEMX(ggml_gemm_iq4_nl_4x4_q8_0)
GEMX(ggml_gemv_mxfp4_4x4_q8_0)
GEMX(ggml_gemm_mxfp4_4x4_q8_0)
GEMX(ggml_gemv_q1_0_4x8_q8_0)
GEMX(ggml_gemm_q1_0_4x8_q8_0)

/* ggml-cpu.c defines this (not compiled here): the SVE vector length in bytes. */
int ggml_cpu_get_sve_cnt(void) {
    int vl = prctl(PR_SVE_GET_VL);
    return vl < 0 ? 0 : (vl & 0xffff);
}

/* ggml-cpu.c defines and fills this lookup table at init (not compiled here): UE4M3 -> float
 * (4-bit exponent with bias 7, 3-bit mantissa), read by NVFP4's dot. */
float ggml_table_f32_ue4m3[1 << 8];

static void init_ue4m3(void) {
    for (int i = 0; i < 256; i++) {
        int e = (i >> 3) & 15, m = i & 7;
        float v = e ? (1.0f + m / 8.0f) : m / 8.0f;
        for (int j = 7; j < (e ? e : 1); j++) v *= 2.0f;
        for (int j = (e ? e : 1); j < 7; j++) v *= 0.5f;
        ggml_table_f32_ue4m3[i] = v;
    }
}

struct kind {
    const char *name;
    int block_len;      /* elements per weight block */
    size_t wbytes;      /* bytes per weight block */
    size_t xbytes;      /* bytes per activation block (q8_K or q8_0) */
    vec_dot_fn dot;
    int has_mmla;       /* the dot has an nrc == 2 (SMMLA) path */
    gemx_fn gemv, gemm; /* repacked kernels, or NULL */
    int interleave;     /* weight rows per repacked block */
    size_t rbytes;      /* bytes per repacked weight block (interleave rows) */
    size_t x4bytes;     /* bytes per 4-row interleaved activation block */
};

/* Block sizes from ggml-common.h and ggml-cpu/repack.h (block_q4_Kx8 = 8 x 144 bytes, ...).
 * xbytes is the activation per weight block: Q1_0's 128 elements take four Q8_0 blocks, NVFP4's
 * and Q2_0's 64 two. The repacked paths are the ones ggml-cpu/repack.cpp picks on a CPU with
 * NEON, dotprod and i8mm (IQ4_NL and MXFP4: 4x4 on dotprod; Q1_0: 4x8 on i8mm). */
#define Q8K 292
#define Q80 34
#define Q81 36
#define NONE 0, NULL, NULL, 0, 0, 0
static const struct kind KINDS[] = {
    {"q2_k", 256, 84, Q8K, ggml_vec_dot_q2_K_q8_K, NONE},
    {"q3_k", 256, 110, Q8K, ggml_vec_dot_q3_K_q8_K, NONE},
    {"q4_k", 256, 144, Q8K, ggml_vec_dot_q4_K_q8_K, 1, ggml_gemv_q4_K_8x8_q8_K,
     ggml_gemm_q4_K_8x8_q8_K, 8, 8 * 144, 4 * Q8K},
    {"q5_k", 256, 176, Q8K, ggml_vec_dot_q5_K_q8_K, 0, ggml_gemv_q5_K_8x8_q8_K,
     ggml_gemm_q5_K_8x8_q8_K, 8, 8 * 176, 4 * Q8K},
    {"q6_k", 256, 210, Q8K, ggml_vec_dot_q6_K_q8_K, 1, ggml_gemv_q6_K_8x8_q8_K,
     ggml_gemm_q6_K_8x8_q8_K, 8, 8 * 210, 4 * Q8K},
    {"q8_0", 32, 34, Q80, ggml_vec_dot_q8_0_q8_0, 1, ggml_gemv_q8_0_4x8_q8_0,
     ggml_gemm_q8_0_4x8_q8_0, 4, 4 * 34, 4 * Q80},
    {"q4_0", 32, 18, Q80, ggml_vec_dot_q4_0_q8_0, 1, ggml_gemv_q4_0_4x8_q8_0,
     ggml_gemm_q4_0_4x8_q8_0, 4, 4 * 18, 4 * Q80},
    {"q5_0", 32, 22, Q80, ggml_vec_dot_q5_0_q8_0, NONE},
    {"q4_1", 32, 20, Q81, ggml_vec_dot_q4_1_q8_1, 1, NULL, NULL, 0, 0, 0},
    {"q5_1", 32, 24, Q81, ggml_vec_dot_q5_1_q8_1, NONE},
    {"iq1_s", 256, 50, Q8K, ggml_vec_dot_iq1_s_q8_K, NONE},
    {"iq1_m", 256, 56, Q8K, ggml_vec_dot_iq1_m_q8_K, NONE},
    {"iq2_xxs", 256, 66, Q8K, ggml_vec_dot_iq2_xxs_q8_K, NONE},
    {"iq2_xs", 256, 74, Q8K, ggml_vec_dot_iq2_xs_q8_K, NONE},
    {"iq2_s", 256, 82, Q8K, ggml_vec_dot_iq2_s_q8_K, NONE},
    {"iq3_xxs", 256, 98, Q8K, ggml_vec_dot_iq3_xxs_q8_K, NONE},
    {"iq3_s", 256, 110, Q8K, ggml_vec_dot_iq3_s_q8_K, NONE},
    {"iq4_nl", 32, 18, Q80, ggml_vec_dot_iq4_nl_q8_0, 0, ggml_gemv_iq4_nl_4x4_q8_0,
     ggml_gemm_iq4_nl_4x4_q8_0, 4, 4 * 18, 4 * Q80},
    {"iq4_xs", 256, 136, Q8K, ggml_vec_dot_iq4_xs_q8_K, NONE},
    {"tq1_0", 256, 54, Q8K, ggml_vec_dot_tq1_0_q8_K, NONE},
    {"tq2_0", 256, 66, Q8K, ggml_vec_dot_tq2_0_q8_K, NONE},
    {"mxfp4", 32, 17, Q80, ggml_vec_dot_mxfp4_q8_0, 0, ggml_gemv_mxfp4_4x4_q8_0,
     ggml_gemm_mxfp4_4x4_q8_0, 4, 4 * 17, 4 * Q80},
    {"nvfp4", 64, 36, 2 * Q80, ggml_vec_dot_nvfp4_q8_0, NONE},
    {"q1_0", 128, 18, 4 * Q80, ggml_vec_dot_q1_0_q8_0, 0, ggml_gemv_q1_0_4x8_q8_0,
     ggml_gemm_q1_0_4x8_q8_0, 4, 4 * 18, 4 * 4 * Q80},
    {"q2_0", 64, 18, 2 * Q80, ggml_vec_dot_q2_0_q8_0, NONE},
};

__attribute__((noinline, used)) void trace_begin(void) { __asm__ volatile("nop"); }
__attribute__((noinline, used)) void trace_end(void) { __asm__ volatile("nop\n\tnop"); }

static void *random_bytes(size_t n, uint64_t seed) {
    uint8_t *p = malloc(n + 64);
    if (!p) {
        fprintf(stderr, "error: out of memory\n");
        exit(2);
    }
    uint64_t s = seed | 1;
    for (size_t i = 0; i < n + 64; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        p[i] = (uint8_t)(s >> 32);
    }
    /* Keep every f16 that could be a scale finite and small: clear the top exponent bits of
     * odd bytes (an f16's high byte); the kernels do not branch on values either way. */
    for (size_t i = 1; i < n + 64; i += 2) p[i] &= 0x3b;
    return p;
}

static void run(const char *path, const struct kind *t, int k, int rows, int batch, float *out,
                const uint8_t *w, const uint8_t *x, const uint8_t *wr, const uint8_t *x4) {
    int nb = k / t->block_len;
    size_t wrow = (size_t)nb * t->wbytes, xrow = (size_t)nb * t->xbytes;
    if (!strcmp(path, "dot")) {
        for (int j = 0; j < batch; j++)
            for (int r = 0; r < rows; r++)
                t->dot(k, &out[j * rows + r], 0, w + r * wrow, 0, x + j * xrow, 0, 1);
    } else if (!strcmp(path, "mmla")) {
        /* ggml's mul_mat: s[0], s[1] for the two weight rows, s[bs + ...] for the second
         * activation row. */
        for (int j = 0; j < batch; j += 2)
            for (int r = 0; r < rows; r += 2)
                t->dot(k, &out[j * rows + r], rows, w + r * wrow, wrow, x + j * xrow, xrow, 2);
    } else {
        int full = batch / 4 * 4;
        if (full) t->gemm(k, out, rows, wr, x4, full, rows);
        for (int j = full; j < batch; j++)
            t->gemv(k, out + j * rows, rows, wr, x + j * xrow, 1, rows);
    }
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: ggml_trace dot|mmla|repack TYPE K ROWS BATCH\n");
        return 2;
    }
    const char *path = argv[1];
    const struct kind *t = NULL;
    for (size_t i = 0; i < sizeof KINDS / sizeof KINDS[0]; i++)
        if (!strcmp(KINDS[i].name, argv[2])) t = &KINDS[i];
    int k = atoi(argv[3]), rows = atoi(argv[4]), batch = atoi(argv[5]);
    if (!t || k <= 0 || k % t->block_len || rows <= 0 || batch <= 0) {
        fprintf(stderr, "error: bad type or sizes\n");
        return 2;
    }
    if (strcmp(path, "dot") && strcmp(path, "mmla") && strcmp(path, "repack")) {
        fprintf(stderr, "error: unknown path %s\n", path);
        return 2;
    }
    if (!strcmp(path, "mmla") && (!t->has_mmla || rows % 2 || batch % 2)) {
        fprintf(stderr, "error: %s has no nrc=2 path for these sizes\n", t->name);
        return 2;
    }
    if (!strcmp(path, "repack") && (!t->gemm || rows % t->interleave)) {
        fprintf(stderr, "error: %s has no repacked path for these sizes\n", t->name);
        return 2;
    }
    init_ue4m3();
    int nb = k / t->block_len;
    uint8_t *w = random_bytes((size_t)rows * nb * t->wbytes, 0x9E3779B9);
    uint8_t *x = random_bytes((size_t)batch * nb * t->xbytes, 0x7F4A7C15);
    uint8_t *wr = random_bytes((size_t)(rows / (t->interleave ? t->interleave : 1)) * nb *
                                   (t->rbytes ? t->rbytes : 1), 0x85EBCA6B);
    uint8_t *x4 = random_bytes((size_t)(batch / 4 + 1) * nb * (t->x4bytes ? t->x4bytes : 1),
                               0xC2B2AE35);
    float *out = calloc((size_t)rows * batch + 64, sizeof(float));
    run(path, t, k, rows, batch, out, w, x, wr, x4);
    printf("trace_begin=%#lx trace_end=%#lx\n", (unsigned long)(uintptr_t)trace_begin,
           (unsigned long)(uintptr_t)trace_end);
    trace_begin();
    run(path, t, k, rows, batch, out, w, x, wr, x4);
    trace_end();
    double sum = 0;
    for (int i = 0; i < rows * batch; i++) sum += out[i];
    printf("checksum=%g\n", sum);
    return 0;
}
