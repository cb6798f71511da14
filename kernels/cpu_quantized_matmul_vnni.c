/* y = x W^T with W in llama.cpp's Q8_0, Q4_0 or Q4_1 blocks and x rounded to int8 blocks of 32:
 * AVX-512 VNNI with 16 output features in each vector (cpu_quantized_matmul_vnni.py builds and
 * calls this file; its docstring says why it exists beside cpu_quantized_matmul_int8.c).
 *
 * x's rounding is the int8 kernel's (quantize_rows_q8): per row and block of 32, dx = amax / 127,
 * qx = roundf(x / dx) in -127..127 (signed bytes here), s = sum(qx) in int32, sx = dx * s.
 *
 * vpdpbusd multiplies UNSIGNED bytes by SIGNED bytes, four products into each int32 lane. The
 * weights are the unsigned side: Q8_0's quants + 128 (q ^ 0x80), Q4's nibbles 0..15 as stored.
 * What the offset adds comes back on x's side, once per (row, block), exact in int32:
 *
 *     Q8_0   sum_j qx_j q_j       = sum_j qx_j (q_j + 128) - 128 s
 *     Q4_0   sum_j qx_j (n_j - 8) = sum_j qx_j n_j - 8 s
 *     Q4_1   sum_j x_j w_j ~ dx dw sum_j qx_j n_j + mw sx          (w = dw n + mw)
 *
 * Layout. Output features go in panels of NR = 32 (two zmm of 16 features). A panel is packed
 * (pack_panel) block by block into the same number of bytes as its 32 rows' blocks, permuted:
 *
 *     Q8_0   wq [8 quads][32 features][4 bytes] (q + 128)   quad j: quants 4j..4j+3
 *     Q4     wq [4 dwords][32 features][4 bytes]            dword j's low nibbles: quad j (quants
 *                                                           4j..4j+3), its high ones: quad j + 4
 *     then   d [32] float16 (and Q4_1's m [32] float16)
 *
 * so that one vpdpbusd takes a row of wq (16 features x one quad; Q4's nibbles split by an AND
 * and a shift in the micro-kernel) and x's quad broadcast to all 16 lanes: 64 products of one
 * row of x, each lane a different feature. Either every panel is packed once beforehand
 * (pack_vnni; quantized_matmul_vnni_packed multiplies by them) or each call packs each panel
 * into the thread's scratch (quantized_matmul_vnni). The micro-kernel holds
 * RX = 4 rows x 2 zmm: per block its 8 int32 accumulators start at the rows' offset terms, take
 * 8 quads x 8 vpdpbusd, then per (row, zmm) a conversion, the scales' product dw * dx and an FMA
 * into a float32 accumulator (+ an FMA of mw * sx for Q4_1): 64 vpdpbusd + 24 float ops per
 * 4 x 32 x 32 products, where float32 needs 256 FMAs and the row-by-row int8 kernel about 128
 * vector instructions.
 *
 * The packing transposes feature-major bytes (a feature's 32 quants = 8 dwords) into quad-major
 * dwords with vpermt2d: 16 features x 8 dwords in 8 zmm is a 128-dword array whose index bits
 * are (feature:4, quad:3); taking the even then the odd dwords of each pair of registers rotates
 * the index right by one bit, and three such passes give (quad:3, feature:4), the layout wanted
 * (24 vpermt2d per 16 features and block). Q4's 16 packed bytes (4 dwords) are transposed the
 * same way in two passes. The float16 scales come with one gather of 16 dwords (d; Q4_1's m in
 * the upper half). The packing asks for the panel after next with software prefetches.
 *
 * Threads (OpenMP) share out the panels; rows of x go in blocks of MB so that a block's quants
 * stay in the core's cache while every panel passes over them (a panel is packed, where it is
 * packed per call, once per row block). ZN and RX (-D at compile time) change the panel's width and the micro-kernel's rows;
 * 2 and 4 were as fast as any other choice measured (kernels/README.md).
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define QK 32 /* weights in a block */
#ifndef ZN
#define ZN 2 /* zmm of 16 features in a panel */
#endif
#ifndef RX
#define RX 4 /* rows of x in the micro-kernel */
#endif
#define NR (16 * ZN) /* features in a panel */
#define MB 256       /* rows of x in a row block */
static const int BLOCK_BYTES[3] = {34, 18, 20}; /* Q8_0, Q4_0, Q4_1 */
/* one block of a packed panel: NR blocks' bytes, permuted; of them the quants (the rest: d, m) */
#define PANEL_BLOCK_BYTES(qtype) (NR * BLOCK_BYTES[qtype])
#define QUANT_BYTES(qtype) ((qtype) == 0 ? NR * 32 : NR * 16)

/* x [M, K] float32 -> qx [M, K] int8, dx [M, nb], sx [M, nb] (dx * s), off [M, nb] int32 (the
 * offset term: -128 s for Q8_0, -8 s for Q4_0, 0 for Q4_1). roundf's halves away from zero, in
 * vectors: t = trunc(v), then t +- 1 where |v - t| >= 0.5 (v - t is exact). */
static void quantize_x(const float *x, int64_t M, int64_t K, int qtype, int8_t *qx, float *dx, float *sx,
                       int32_t *off) {
    const int64_t nb = K / QK;
    const int32_t factor = qtype == 0 ? -128 : (qtype == 1 ? -8 : 0);
#pragma omp for schedule(static)
    for (int64_t i = 0; i < M * nb; i++) {
        const float *v = x + i * QK;
        __m512 a = _mm512_loadu_ps(v), b = _mm512_loadu_ps(v + 16);
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        __m512i q[2];
        for (int h = 0; h < 2; h++) {
            __m512 y = _mm512_mul_ps(h ? b : a, _mm512_set1_ps(id));
            __m512 t = _mm512_roundscale_ps(y, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
            __mmask16 up = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(y, t)), _mm512_set1_ps(0.5f), _CMP_GE_OQ);
            __m512 one = _mm512_or_ps(_mm512_set1_ps(1.0f), _mm512_and_ps(y, _mm512_set1_ps(-0.0f)));
            q[h] = _mm512_cvttps_epi32(_mm512_mask_add_ps(t, up, t, one));
        }
        _mm_storeu_si128((__m128i *)(qx + i * QK), _mm512_cvtepi32_epi8(q[0]));
        _mm_storeu_si128((__m128i *)(qx + i * QK + 16), _mm512_cvtepi32_epi8(q[1]));
        int32_t s = _mm512_reduce_add_epi32(_mm512_add_epi32(q[0], q[1]));
        dx[i] = d;
        sx[i] = d * (float)s;
        off[i] = factor * s;
    }
}

/* 3 (Q8_0) or 2 (Q4) passes of "evens, then odds" over 8 or 4 zmm: see the header */
static inline void unzip(__m512i *v, int n) {
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    __m512i t[8];
    for (int r = 0; r < n / 2; r++) {
        t[r] = _mm512_permutex2var_epi32(v[2 * r], even, v[2 * r + 1]);
        t[r + n / 2] = _mm512_permutex2var_epi32(v[2 * r], odd, v[2 * r + 1]);
    }
    for (int r = 0; r < n; r++) v[r] = t[r];
}

/* The panel of features n0..n0 + NR - 1 (past N: copies of row N - 1) packed into
 * p [nb][PANEL_BLOCK_BYTES(qtype)] (the header's layout: a permutation of the panel's bytes) */
static void pack_panel(const uint8_t *w, int64_t n0, int64_t N, int64_t nb, int qtype, uint8_t *p) {
    const int64_t bb = BLOCK_BYTES[qtype], row_bytes = nb * bb, qbytes = QUANT_BYTES(qtype);
    const uint8_t *rows[NR];
    for (int f = 0; f < NR; f++) rows[f] = w + (n0 + f < N ? n0 + f : N - 1) * row_bytes;
    /* the panel after next (its rows are one run of memory) asked for now: it arrives while
     * this panel and the next are packed and multiplied (the packing reads 32 rows at once,
     * more streams than the hardware prefetcher follows) */
    const int64_t next = n0 + 2 * NR < N ? n0 + 2 * NR : N, next_end = n0 + 3 * NR < N ? n0 + 3 * NR : N;
    for (int64_t at = next * row_bytes; at < next_end * row_bytes; at += 64) _mm_prefetch((const char *)w + at, _MM_HINT_T1);
    __m512i index[ZN]; /* each feature's row, from the first of its 16 */
    for (int h = 0; h < ZN; h++) {
        int32_t at[16];
        for (int f = 0; f < 16; f++) at[f] = (int32_t)(rows[16 * h + f] - rows[16 * h]);
        index[h] = _mm512_loadu_si512(at);
    }
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *out = p + b * PANEL_BLOCK_BYTES(qtype);
        uint16_t *dw = (uint16_t *)(out + qbytes), *mw = dw + NR;
        for (int h = 0; h < NR / 16; h++) { /* the scales: one gather of 16 dwords (d, and m) */
            __m512i dm = _mm512_i32gather_epi32(index[h], rows[16 * h] + b * bb, 1);
            _mm256_storeu_si256((__m256i *)(dw + 16 * h), _mm512_cvtepi32_epi16(dm));
            if (qtype == 2) _mm256_storeu_si256((__m256i *)(mw + 16 * h), _mm512_cvtepi32_epi16(_mm512_srli_epi32(dm, 16)));
        }
        for (int h = 0; h < NR / 16; h++) { /* 16 features at a time */
            const uint8_t *const *r16 = rows + 16 * h;
            __m512i v[8];
            if (qtype == 0) { /* zmm i: features 2i, 2i + 1, 32 quants each (8 dwords) */
                for (int i = 0; i < 8; i++) {
                    __m256i lo = _mm256_loadu_si256((const __m256i *)(r16[2 * i] + b * bb + 2));
                    __m256i hi = _mm256_loadu_si256((const __m256i *)(r16[2 * i + 1] + b * bb + 2));
                    v[i] = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1),
                                            _mm512_set1_epi8((char)0x80));
                }
                unzip(v, 8); /* (feature:4, quad:3) -> (quad:3, feature:4) */
                unzip(v, 8);
                unzip(v, 8);
                for (int j = 0; j < 8; j++) _mm512_storeu_si512(out + (j * NR + 16 * h) * 4, v[j]);
            } else { /* zmm i: features 4i..4i + 3, 16 packed bytes (4 dwords) each */
                const int at = qtype == 1 ? 2 : 4;
                for (int i = 0; i < 4; i++) {
                    __m512i z = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(r16[4 * i] + b * bb + at)));
                    z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(r16[4 * i + 1] + b * bb + at)), 1);
                    z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(r16[4 * i + 2] + b * bb + at)), 2);
                    v[i] = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(r16[4 * i + 3] + b * bb + at)), 3);
                }
                unzip(v, 4); /* (feature:4, dword:2) -> (dword:2, feature:4) */
                unzip(v, 4);
                for (int j = 0; j < 4; j++) _mm512_storeu_si512(out + (j * NR + 16 * h) * 4, v[j]);
            }
        }
    }
}

/* out[r, 0..NR) for R rows (R <= RX) of x times one packed panel p; ldo: out's row stride,
 * store: the panel's features that exist (a mask of 32 bits) */
static inline __attribute__((always_inline)) void micro_kernel(
    float *out, int64_t ldo, uint64_t store, const int R, const int8_t *qx, int64_t K, const float *dx,
    const float *sx, const int32_t *off, const uint8_t *p, int64_t nb, int qtype) {
    const int64_t qbytes = QUANT_BYTES(qtype);
    __m512 acc[RX][ZN];
    for (int r = 0; r < R; r++)
        for (int z = 0; z < ZN; z++) acc[r][z] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *wq = p + b * PANEL_BLOCK_BYTES(qtype);
        const uint16_t *dw = (const uint16_t *)(wq + qbytes), *mw = dw + NR;
        __m512i s[RX][ZN];
        for (int r = 0; r < R; r++)
            for (int z = 0; z < ZN; z++) s[r][z] = _mm512_set1_epi32(off[r * nb + b]);
        /* Q8_0: quads 0..7 as stored; Q4: dword j's low nibbles are quad j, its high ones quad j + 4 */
        for (int j = 0; j < (qtype == 0 ? 8 : 4); j++) {
            __m512i wz[2][ZN];
            for (int z = 0; z < ZN; z++) {
                wz[0][z] = _mm512_loadu_si512(wq + (j * NR + 16 * z) * 4);
                if (qtype != 0) {
                    wz[1][z] = _mm512_and_si512(_mm512_srli_epi16(wz[0][z], 4), _mm512_set1_epi8(0x0F));
                    wz[0][z] = _mm512_and_si512(wz[0][z], _mm512_set1_epi8(0x0F));
                }
            }
            for (int half = 0; half < (qtype == 0 ? 1 : 2); half++)
                for (int r = 0; r < R; r++) {
                    int32_t quad;
                    memcpy(&quad, qx + r * K + b * QK + 4 * (j + 4 * half), 4);
                    __m512i xq = _mm512_set1_epi32(quad);
                    for (int z = 0; z < ZN; z++) s[r][z] = _mm512_dpbusd_epi32(s[r][z], wz[half][z], xq);
                }
        }
        for (int z = 0; z < ZN; z++) {
            __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(dw + 16 * z)));
            for (int r = 0; r < R; r++)
                acc[r][z] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[r][z]), _mm512_mul_ps(d, _mm512_set1_ps(dx[r * nb + b])), acc[r][z]);
        }
        if (qtype == 2)
            for (int z = 0; z < ZN; z++) {
                __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(mw + 16 * z)));
                for (int r = 0; r < R; r++) acc[r][z] = _mm512_fmadd_ps(m, _mm512_set1_ps(sx[r * nb + b]), acc[r][z]);
            }
    }
    for (int r = 0; r < R; r++)
        for (int z = 0; z < ZN; z++)
            _mm512_mask_storeu_ps(out + r * ldo + 16 * z, (__mmask16)(store >> (16 * z)), acc[r][z]);
}

/* rows m0..m1 of x times panel p (into out's columns n0..) */
static void panel_rows(float *out, int64_t N, int64_t n0, int64_t m0, int64_t m1, const int8_t *qx, int64_t K,
                       const float *dx, const float *sx, const int32_t *off, const uint8_t *p, int qtype) {
    const int64_t nb = K / QK;
    const int64_t features = N - n0 < NR ? N - n0 : NR;
    const uint64_t store = features == 64 ? ~(uint64_t)0 : (((uint64_t)1 << features) - 1);
    for (int64_t m = m0; m < m1; m += RX) {
        const int64_t rows = m1 - m < RX ? m1 - m : RX;
        float *o = out + m * N + n0;
        const int8_t *q = qx + m * K;
        const float *d = dx + m * nb, *s = sx + m * nb;
        const int32_t *f = off + m * nb;
        /* (one copy of the micro-kernel per qtype and row count: the loops unroll fully) */
#define CALL(R, T) micro_kernel(o, N, store, R, q, K, d, s, f, p, nb, T)
#define ROWS(T)                                                                                        \
    switch (rows) {                                                                                    \
    case 1: CALL(1, T); break;                                                                         \
    case 2: CALL(RX >= 2 ? 2 : 1, T); break;                                                           \
    case 3: CALL(RX >= 3 ? 3 : 1, T); break;                                                           \
    case 4: CALL(RX >= 4 ? 4 : 1, T); break;                                                           \
    case 5: CALL(RX >= 5 ? 5 : 1, T); break;                                                           \
    default: CALL(RX, T);                                                                              \
    }
        if (qtype == 0) {
            ROWS(0);
        } else if (qtype == 1) {
            ROWS(1);
        } else {
            ROWS(2);
        }
#undef ROWS
#undef CALL
    }
}

/* out [M, N] = x [M, K] W^T, W either as stored (w [N, K / 32 * block_bytes], each panel packed
 * into the thread's scratch once per row block) or packed beforehand (prepacked: w is pack_vnni's
 * [panels][nb][PANEL_BLOCK_BYTES]) */
static void matmul(float *out, const float *x, const uint8_t *w, int prepacked, int64_t M, int64_t N, int64_t K,
                   int qtype, int num_threads) {
    const int64_t nb = K / QK, panels = (N + NR - 1) / NR, panel_bytes = nb * PANEL_BLOCK_BYTES(qtype);
    int8_t *qx = malloc((size_t)(M * K) + 64);
    float *dx = malloc((size_t)(M * nb) * 4 + 64), *sx = malloc((size_t)(M * nb) * 4 + 64);
    int32_t *off = malloc((size_t)(M * nb) * 4 + 64);
    /* (few rows: x is rounded before the threads start, one barrier less; a barrier costs a
     * scheduler's time slice where the cores are shared) */
    const int serial_x = M * nb < 4096;
    if (serial_x) quantize_x(x, M, K, qtype, qx, dx, sx, off);
#pragma omp parallel num_threads(num_threads)
    {
        if (!serial_x) quantize_x(x, M, K, qtype, qx, dx, sx, off); /* (an omp for: shared out) */
        uint8_t *scratch = prepacked ? NULL : aligned_alloc(64, (size_t)panel_bytes);
        for (int64_t m0 = 0; m0 < M; m0 += MB) {
            const int64_t m1 = M - m0 < MB ? M : m0 + MB;
            /* (nowait: the row blocks write other rows of out; static: a thread gets the same
             * panels in each row block) */
#pragma omp for schedule(static) nowait
            for (int64_t panel = 0; panel < panels; panel++) {
                const uint8_t *p = w + panel * panel_bytes;
                if (prepacked) { /* the panel after next asked for now (see pack_panel) */
                    if (panel + 2 < panels)
                        for (int64_t at = 0; at < panel_bytes; at += 64) _mm_prefetch((const char *)p + 2 * panel_bytes + at, _MM_HINT_T1);
                } else {
                    pack_panel(w, panel * NR, N, nb, qtype, scratch);
                    p = scratch;
                }
                panel_rows(out, N, panel * NR, m0, m1, qx, K, dx, sx, off, p, qtype);
            }
        }
        free(scratch);
    }
    free(qx);
    free(dx);
    free(sx);
    free(off);
}

/* out [M, N] = x [M, K] W^T, W [N, K / 32 * block_bytes] in qtype's blocks (0 Q8_0, 1 Q4_0, 2 Q4_1) */
void quantized_matmul_vnni(float *out, const float *x, const uint8_t *w, int64_t M, int64_t N, int64_t K,
                           int qtype, int num_threads) {
    matmul(out, x, w, 0, M, N, K, qtype, num_threads);
}

/* The same product, W packed beforehand by pack_vnni */
void quantized_matmul_vnni_packed(float *out, const float *x, const uint8_t *packed, int64_t M, int64_t N,
                                  int64_t K, int qtype, int num_threads) {
    matmul(out, x, packed, 1, M, N, K, qtype, num_threads);
}

/* packed [ceil(N / 32)][K / 32][PANEL_BLOCK_BYTES] = every panel of W [N, K / 32 * block_bytes] packed */
void pack_vnni(uint8_t *packed, const uint8_t *w, int64_t N, int64_t K, int qtype, int num_threads) {
    const int64_t nb = K / QK, panels = (N + NR - 1) / NR;
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t panel = 0; panel < panels; panel++)
        pack_panel(w, panel * NR, N, nb, qtype, packed + panel * nb * PANEL_BLOCK_BYTES(qtype));
}

/* For the tests: x's rounding alone (qx [M, K] int8, dx, sx [M, K / 32] float32, off int32) */
void quantize_x_vnni(const float *x, int64_t M, int64_t K, int qtype, int8_t *qx, float *dx, float *sx,
                     int32_t *off) {
    quantize_x(x, M, K, qtype, qx, dx, sx, off);
}
