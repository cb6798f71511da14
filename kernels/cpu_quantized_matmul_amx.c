/* y = x W^T with W in llama.cpp's Q8_0, Q4_0, Q4_1, Q4_K or Q5_K blocks and x quantized to int8 blocks of
 * 32, the products summed by AMX tiles (cpu_quantized_matmul_amx.py builds and calls this file;
 * its docstring says why). The arithmetic is cpu_quantized_matmul_int8.c's:
 *
 *     Q8_0, Q4_0   sum_j x_j w_j ~ dx * dw * sum_j qx_j qw_j          (Q4_0: qw = q - 8)
 *     Q4_1                       ~ dx * dw * sum_j qx_j q_j + mw * sx  (sx = dx * sum_j qx_j)
 *
 * per block of 32, and Q4_K, Q5_K alike per sub-block of 32 (dw = d sc, mw = -dmin m); Q6_K's
 * sub-blocks of 16 would need tiles of K = 16 (not written: the VNNI kernel serves it). The
 * integer sums come from `tdpbssd`, which multiplies a 16 x 32 tile of signed bytes (A) by a
 * 32 x 16 one (B) into a 16 x 16 tile of int32 sums: 8,192 products in one instruction. A tile's
 * K is one block (32 bytes), since each block has its own scales:
 *
 *     A  16 output features x one block of their quants: the weight rows as stored (Q8_0) or
 *        decoded to int8 (the others), one row every `lda` bytes
 *     B  16 rows of x x the same block, in the layout the instruction reads ("VNNI": 8 rows of
 *        64 bytes, row r holding quants 4r..4r + 3 of each of the 16 rows of x in turn); x is
 *        packed so once per call
 *     C  16 output features x 16 rows of x, int32, exact (|sum| <= 32 * 127 * 128 < 2^24, so
 *        also exact as float32)
 *
 * C is stored to memory after each block and added into 16 float32 accumulators (one zmm per
 * output feature, a lane per row of x) with AVX-512: acc += float(C) * (dw * dx) (+ mw * sx).
 * After the last block the 16 x 16 accumulators are transposed in registers and written as
 * out[row of x][feature]. Tiles of output features are shared out among OpenMP threads; rows of
 * x go in panels of PANEL_TILES tiles, so that a panel's packed x stays in the core's L2.
 *
 * Linux hands out the tile registers' 8 KiB of state only to a process that asked for it
 * (`amx_request_permission`, once, before the first tile instruction).
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define QK 32          /* quants per block */
#define TILE 16        /* output features, and rows of x, per tile */
#define PANEL_TILES 8  /* tiles of 16 rows of x per panel: 128 rows */
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* 1 when Linux lets this process use the tile registers (asked once per process) */
int amx_request_permission(void) {
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

struct tile_config {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16]; /* bytes per row of each tile */
    uint8_t rows[16];
};

static void configure_tiles(void) { /* per thread: the tile shapes above */
    struct tile_config c;
    memset(&c, 0, sizeof c);
    c.palette_id = 1;
    for (int i = 0; i < 4; i += 2) { /* tiles 0, 2: A, int8 [16, 32]; 1, 3: B, int8 [8, 16 x 4] */
        c.rows[i] = TILE, c.colsb[i] = QK;
        c.rows[i + 1] = QK / 4, c.colsb[i + 1] = 64;
    }
    for (int i = 4; i < 8; i++) c.rows[i] = TILE, c.colsb[i] = 64; /* 4-7: C, int32 [16, 16] */
    _tile_loadconfig(&c);
}

static inline float half_to_float(const uint8_t *p) { return _cvtsh_ss((uint16_t)(p[0] | (p[1] << 8))); }

/* roundf on 16 floats (halves away from zero, as quantize_rows_q8 and the VNNI kernel round):
 * t = trunc(y), then t +- 1 where |y - t| >= 0.5 (y - t is exact) */
static inline __m512i round_half_away(__m512 y) {
    __m512 t = _mm512_roundscale_ps(y, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __mmask16 up = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(y, t)), _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    __m512 one = _mm512_or_ps(_mm512_set1_ps(1.0f), _mm512_and_ps(y, _mm512_set1_ps(-0.0f)));
    return _mm512_cvttps_epi32(_mm512_mask_add_ps(t, up, t, one));
}

/* Rows [16 t, 16 t + 16) of x [M, K] (those past M as zeros) quantized in blocks of 32, as
 * quantize_rows_q8 does (dx = max |x| / 127, qx = roundf(x / dx): halves away from zero),
 * into the tile layout: xp [nb, 8, 64] int8, dxp [nb, 16] and sxp [nb, 16] (dx * sum(qx)). */
static void quantize_pack_tile(const float *x, int64_t M, int64_t K, int64_t t, int8_t *xp, float *dxp,
                               float *sxp) {
    const int64_t nb = K / QK;
    for (int r = 0; r < TILE; r++) {
        const int64_t m = t * TILE + r;
        for (int64_t b = 0; b < nb; b++) {
            int8_t q[QK];
            float d = 0.0f, sum = 0.0f;
            if (m < M) {
                __m512 v0 = _mm512_loadu_ps(x + m * K + b * QK), v1 = _mm512_loadu_ps(x + m * K + b * QK + 16);
                float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
                d = amax / 127.0f;
                __m512 id = _mm512_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
                __m512i q0 = round_half_away(_mm512_mul_ps(v0, id));
                __m512i q1 = round_half_away(_mm512_mul_ps(v1, id));
                _mm_storeu_si128((__m128i *)q, _mm512_cvtsepi32_epi8(q0));
                _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtsepi32_epi8(q1));
                sum = d * (float)_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
            } else {
                memset(q, 0, QK);
            }
            int32_t words[QK / 4];
            memcpy(words, q, QK);
            for (int k4 = 0; k4 < QK / 4; k4++) /* quants 4 k4..4 k4 + 3 of row r */
                memcpy(xp + (b * (QK / 4) + k4) * 64 + r * 4, &words[k4], 4);
            dxp[b * TILE + r] = d;
            sxp[b * TILE + r] = sum;
        }
    }
}

/* 16 x 16 floats transposed in registers: r[i] lane j <-> r[j] lane i */
static inline void transpose16(__m512 r[16]) {
    __m512 t[16], u[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);     /* per 128-bit lane: a0 b0 a1 b1 */
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]); /* a2 b2 a3 b3 */
    }
    for (int i = 0; i < 16; i += 4) { /* rows i..i + 3: u[i + k] lane L = their column 4L + k */
        u[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
        u[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int k = 0; k < 4; k++) { /* gather lane L of u[k], u[4 + k], u[8 + k], u[12 + k] */
        __m512 v0 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0x44), v1 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0xEE);
        __m512 v2 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0x44), v3 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0xEE);
        r[k] = _mm512_shuffle_f32x4(v0, v2, 0x88);
        r[4 + k] = _mm512_shuffle_f32x4(v0, v2, 0xDD);
        r[8 + k] = _mm512_shuffle_f32x4(v1, v3, 0x88);
        r[12 + k] = _mm512_shuffle_f32x4(v1, v3, 0xDD);
    }
}

/* The bytes of a weight row of nb blocks of 32 (qtype 0 Q8_0, 1 Q4_0, 2 Q4_1, 3 Q4_K, 4 Q5_K) */
static int64_t weight_row_bytes(int qtype, int64_t nb) {
    static const int64_t bytes[] = {34, 18, 20};
    return qtype <= 2 ? nb * bytes[qtype] : nb / 8 * (qtype == 3 ? 144 : 176);
}

/* Q4_K's and Q5_K's 6-bit scale and minimum of sub-block j, from their 12 packed bytes */
static inline void scale_min_k(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* A Q4_K or Q5_K row as quants q [K] (0..15 or 0..31), and per 32-weight sub-block b the scale
 * dw[b * 16] = d sc and the minimum mw[b * 16] = -dmin m (w = dw q + mw), as
 * cpu_quantized_matmul_int8.c's decode_row */
static void decode_k_row(const uint8_t *row, int qtype, int64_t nb, int8_t *q, float *dw, float *mw) {
    const int64_t block_bytes = qtype == 3 ? 144 : 176;
    for (int64_t sb = 0; sb < nb / 8; sb++) {
        const uint8_t *blk = row + sb * block_bytes, *qh = blk + 16, *qs = blk + (qtype == 3 ? 16 : 48);
        float d = half_to_float(blk), dmin = half_to_float(blk + 2);
        for (int j = 0; j < 8; j++) {
            int sc, m;
            scale_min_k(blk + 4, j, &sc, &m);
            const int64_t b = sb * 8 + j;
            dw[b * TILE] = d * (float)sc;
            mw[b * TILE] = -(dmin * (float)m);
            const uint8_t *bytes = qs + (j / 2) * 32;
            for (int i = 0; i < QK; i++) {
                int v = j % 2 ? bytes[i] >> 4 : bytes[i] & 0x0F;
                if (qtype == 4) v |= ((qh[i] >> j) & 1) << 4;
                q[b * QK + i] = (int8_t)v;
            }
        }
    }
}

/* Features [n0, n0 + 16) of W (those past N as zero rows) made ready for tile A: the first
 * block's quants, the bytes from one row to the next (lda) and from one block to the next
 * (Q8_0's rows as stored when the tile is whole, else decoded into q [16, K]), and each block's
 * scales dw [nb, 16] and minima mw [nb, 16]. */
static const int8_t *prepare_weights(const uint8_t *w, int64_t N, int64_t K, int qtype, int64_t n0,
                                     int8_t *q, float *dw, float *mw, int64_t *lda, int64_t *block_step) {
    const int64_t nb = K / QK, block_bytes = qtype == 0 ? 34 : (qtype == 1 ? 18 : 20);
    const int64_t row_bytes = weight_row_bytes(qtype, nb), rows = N - n0 < TILE ? N - n0 : TILE;
    if (qtype >= 3) { /* Q4_K, Q5_K */
        *lda = K, *block_step = QK;
        memset(q, 0, (size_t)(TILE * K));
        memset(dw, 0, (size_t)(nb * TILE * 4));
        memset(mw, 0, (size_t)(nb * TILE * 4));
        for (int64_t i = 0; i < rows; i++) decode_k_row(w + (n0 + i) * row_bytes, qtype, nb, q + i * K, dw + i, mw + i);
        return q;
    }
    for (int i = 0; i < TILE; i++)
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = w + (n0 + i) * row_bytes + b * block_bytes;
            dw[b * TILE + i] = i < rows ? half_to_float(blk) : 0.0f;
            mw[b * TILE + i] = i < rows && qtype == 2 ? half_to_float(blk + 2) : 0.0f;
        }
    if (qtype == 0 && rows == TILE) {
        *lda = row_bytes, *block_step = block_bytes;
        return (const int8_t *)(w + n0 * row_bytes + 2);
    }
    *lda = K, *block_step = QK;
    memset(q + rows * K, 0, (size_t)((TILE - rows) * K));
    for (int64_t i = 0; i < rows; i++)
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = w + (n0 + i) * row_bytes + b * block_bytes;
            int8_t *qb = q + i * K + b * QK;
            if (qtype == 0) {
                memcpy(qb, blk + 2, QK);
                continue;
            } /* 16 bytes -> 32 nibbles, low ones first */
            __m128i packed = _mm_loadu_si128((const __m128i *)(blk + (qtype == 1 ? 2 : 4)));
            __m128i low = _mm_and_si128(packed, _mm_set1_epi8(0x0F));
            __m128i high = _mm_and_si128(_mm_srli_epi16(packed, 4), _mm_set1_epi8(0x0F));
            if (qtype == 1) {
                low = _mm_sub_epi8(low, _mm_set1_epi8(8));
                high = _mm_sub_epi8(high, _mm_set1_epi8(8));
            }
            _mm_storeu_si128((__m128i *)qb, low);
            _mm_storeu_si128((__m128i *)(qb + 16), high);
        }
    return q;
}

/* Block b's 16 x 16 int32 sums into dst, on tile registers A, B, C (by number) */
#define AMX_BLOCK(A, B, C, b, dst)                                  \
    do {                                                            \
        _tile_loadd(A, a + (b) * block_step, lda);                  \
        _tile_loadd(B, xp + (b) * QK * TILE, 64);                   \
        _tile_zero(C);                                              \
        _tile_dpbssd(C, A, B);                                      \
        _tile_stored(C, dst, 64);                                   \
    } while (0)

/* out[16 t + r, n0 + i] for one tile of x (t) and one of W (a, dw, mw), all nb blocks.
 * Software-pipelined: the tiles' sums of blocks [b0, b0 + 4) are stored into one half of `ring`
 * while AVX-512 scales those of the 4 blocks before, from the other half, so that the vector
 * loads never wait on a tile store still in flight, and the tile unit and the vector units work
 * at once (4 tiles of sums, and two pairs of A and B tiles, so that no tile is rewritten while
 * an instruction before may still read it). */
static inline __attribute__((always_inline)) void tile_product(
    float *out, int64_t M, int64_t N, int64_t n0, int64_t t, int64_t nb, const int8_t *a, int64_t lda,
    int64_t block_step, const float *dw, const float *mw, const int8_t *xp, const float *dxp, const float *sxp,
    int with_min, int32_t *ring /* [2][4][16 x 16] */) {
    __m512 acc[TILE];
    for (int i = 0; i < TILE; i++) acc[i] = _mm512_setzero_ps();
#define SCALE_BLOCK(b, c)                                                                              \
    do {                                                                                               \
        __m512 dx = _mm512_loadu_ps(dxp + (b) * TILE), sx = _mm512_loadu_ps(sxp + (b) * TILE);          \
        for (int i = 0; i < TILE; i++) {                                                               \
            __m512 sums = _mm512_cvtepi32_ps(_mm512_load_si512((c) + i * TILE));                       \
            acc[i] = _mm512_fmadd_ps(sums, _mm512_mul_ps(dx, _mm512_set1_ps(dw[(b) * TILE + i])), acc[i]); \
            if (with_min) acc[i] = _mm512_fmadd_ps(sx, _mm512_set1_ps(mw[(b) * TILE + i]), acc[i]);   \
        }                                                                                              \
    } while (0)
    const int64_t slot = TILE * TILE; /* one block's sums in the ring */
    if (0 < nb) AMX_BLOCK(0, 1, 4, 0, ring);
    if (1 < nb) AMX_BLOCK(2, 3, 5, 1, ring + slot);
    if (2 < nb) AMX_BLOCK(0, 1, 6, 2, ring + 2 * slot);
    if (3 < nb) AMX_BLOCK(2, 3, 7, 3, ring + 3 * slot);
    for (int64_t b0 = 0; b0 < nb; b0 += 4) { /* blocks b0 + 4.. into one half, b0.. out of the other */
        int32_t *drain = ring + (b0 / 4 % 2) * 4 * slot, *fill = ring + (b0 / 4 % 2 ^ 1) * 4 * slot;
        if (b0 + 4 < nb) AMX_BLOCK(0, 1, 4, b0 + 4, fill);
        SCALE_BLOCK(b0, drain);
        if (b0 + 5 < nb) AMX_BLOCK(2, 3, 5, b0 + 5, fill + slot);
        if (b0 + 1 < nb) SCALE_BLOCK(b0 + 1, drain + slot);
        if (b0 + 6 < nb) AMX_BLOCK(0, 1, 6, b0 + 6, fill + 2 * slot);
        if (b0 + 2 < nb) SCALE_BLOCK(b0 + 2, drain + 2 * slot);
        if (b0 + 7 < nb) AMX_BLOCK(2, 3, 7, b0 + 7, fill + 3 * slot);
        if (b0 + 3 < nb) SCALE_BLOCK(b0 + 3, drain + 3 * slot);
    }
#undef SCALE_BLOCK
    transpose16(acc); /* acc[r] lane i: row 16 t + r of x, feature n0 + i */
    const __mmask16 features = N - n0 < TILE ? (__mmask16)((1u << (N - n0)) - 1) : 0xFFFF;
    for (int r = 0; r < TILE && t * TILE + r < M; r++) _mm512_mask_storeu_ps(out + (t * TILE + r) * N + n0, features, acc[r]);
}

/* out [M, N] float32 = x [M, K] float32 times W^T, W [N, weight_row_bytes] (qtype 0 Q8_0, 1 Q4_0,
 * 2 Q4_1, 3 Q4_K, 4 Q5_K); amx_request_permission must have succeeded */
void quantized_matmul_amx(float *out, const float *x, const uint8_t *w, int64_t M, int64_t N, int64_t K,
                          int qtype, int num_threads) {
    const int64_t nb = K / QK, m_tiles = (M + TILE - 1) / TILE, n_tiles = (N + TILE - 1) / TILE;
    const int64_t x_tile_bytes = nb * QK * TILE; /* one tile of x, packed */
    int8_t *xp = aligned_alloc(64, (size_t)(m_tiles * x_tile_bytes));
    float *dxp = aligned_alloc(64, (size_t)(m_tiles * nb * TILE * 4)), *sxp = aligned_alloc(64, (size_t)(m_tiles * nb * TILE * 4));
#pragma omp parallel num_threads(num_threads)
    {
#pragma omp for schedule(static)
        for (int64_t t = 0; t < m_tiles; t++)
            quantize_pack_tile(x, M, K, t, xp + t * x_tile_bytes, dxp + t * nb * TILE, sxp + t * nb * TILE);
        configure_tiles();
        int8_t *q = aligned_alloc(64, (size_t)(TILE * K));
        float *dw = aligned_alloc(64, (size_t)(nb * TILE * 4)), *mw = aligned_alloc(64, (size_t)(nb * TILE * 4));
        int32_t *ring = aligned_alloc(64, 2 * 4 * TILE * TILE * 4);
        const int64_t panels = (m_tiles + PANEL_TILES - 1) / PANEL_TILES;
#pragma omp for schedule(static)
        for (int64_t job = 0; job < panels * n_tiles; job++) {
            const int64_t panel = job / n_tiles, n0 = job % n_tiles * TILE;
            int64_t lda, block_step;
            const int8_t *a = prepare_weights(w, N, K, qtype, n0, q, dw, mw, &lda, &block_step);
            const int64_t t_end = (panel + 1) * PANEL_TILES < m_tiles ? (panel + 1) * PANEL_TILES : m_tiles;
            for (int64_t t = panel * PANEL_TILES; t < t_end; t++) {
                const int8_t *xt = xp + t * x_tile_bytes;
                const float *dxt = dxp + t * nb * TILE, *sxt = sxp + t * nb * TILE;
                if (qtype >= 2) tile_product(out, M, N, n0, t, nb, a, lda, block_step, dw, mw, xt, dxt, sxt, 1, ring);
                else tile_product(out, M, N, n0, t, nb, a, lda, block_step, dw, mw, xt, dxt, sxt, 0, ring);
            }
        }
        _tile_release();
        free(q);
        free(dw);
        free(mw);
        free(ring);
    }
    free(xp);
    free(dxp);
    free(sxp);
}
