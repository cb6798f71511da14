/* y = x W^T with W in llama.cpp's Q8_0, Q4_0 or Q4_1 blocks and x quantized to 8-bit blocks:
 * integer dot products, as llama.cpp's CPU kernels do (cpu_quantized_matmul_int8.py builds and
 * calls this file; its docstring says why).
 *
 * x's rows are first cut into blocks of 32 and each block quantized to int8 with one float
 * scale (dx = max |x| / 127, qx = round(x / dx)); `sx` is dx * sum(qx), the block's sum, which
 * Q4_1's minimum needs. Then, for a weight block with scale dw (and Q4_1's minimum mw):
 *
 *     Q8_0   sum_j x_j w_j ~ dx * dw * sum_j qx_j qw_j
 *     Q4_0                 ~ dx * dw * sum_j qx_j (q_j - 8)
 *     Q4_1                 ~ dx * dw * sum_j qx_j q_j + mw * sx
 *
 * and the K-quants alike, per sub-block of 32 (Q4_K, Q5_K: dw = d sc, mw = -dmin m) or of 16
 * (Q6_K: each half of a 32-block with its own scale, on its own four of the eight int32 lanes
 * that a 32-byte vpdpbusd sums into; lane l sums products 4l..4l + 3).
 *
 * The 32 products of a block are summed in int32 exactly. With AVX-512 VNNI, `vpdpbusd` does
 * two blocks' 64 byte products in one instruction, but it multiplies unsigned bytes by signed
 * ones; so x is stored as qx + 128 (0..255) and each weight block carries -128 * sum(qw), the
 * term that removes the offset again, as the accumulator's starting value. With AVX2 but no
 * AVX-512 VNNI (AMD's Zen 3, Intel before Ice Lake), llama.cpp's AVX2 sums: `vpmaddubsw`
 * multiplies unsigned bytes by signed ones and adds pairs into int16, so it takes |qw| and qx
 * given qw's sign (`vpsignb`), whose products sum to qx qw; a pair is at most 2 * 128 * 127 =
 * 32,512, inside int16 (no saturation: x is rounded to -127..127), and `vpmaddwd` with ones
 * adds the pairs into the same eight int32 lanes as vpdpbusd (lane l: products 4l..4l + 3).
 * x is read as signed bytes there (qx, not qx + 128: no offset term). Without either the same
 * sums are plain C loops (`kernel_isa()` says which of the three was compiled). Output features
 * are shared out among OpenMP threads; each weight row is decoded once into the thread's stack
 * and used by every row of x.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include <immintrin.h>
#define HAVE_VNNI 1
#define HAVE_AVX2 0
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define HAVE_VNNI 0
#define HAVE_AVX2 1
#else
#define HAVE_VNNI 0
#define HAVE_AVX2 0
#endif

#define QK 32
#define LANES 8 /* int32 sums per block in a vpdpbusd: a block's scale is repeated this often */

static inline float half_to_float(const uint8_t *p) { /* little-endian IEEE float16 */
    uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
#if HAVE_VNNI || HAVE_AVX2
    return _cvtsh_ss(h); /* (F16C, exact) */
#endif
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
    float value;
    if (exponent == 0) value = ldexpf((float)mantissa, -24);
    else if (exponent == 31) value = mantissa ? NAN : INFINITY;
    else value = ldexpf((float)(1024 + mantissa), (int)exponent - 25);
    uint32_t bits;
    memcpy(&bits, &value, 4);
    bits |= sign;
    memcpy(&value, &bits, 4);
    return value;
}

/* x [M, K] float32 -> xu [M, K] uint8 (qx + 128), dx [M, K / 32 * LANES] (each block's scale,
 * repeated), sx [M, K / 32] (dx * sum(qx)) */
void quantize_rows_q8(const float *x, int64_t M, int64_t K, uint8_t *xu, float *dx, float *sx) {
    int64_t nb = K / QK;
    for (int64_t i = 0; i < M * nb; i++) {
        const float *v = x + i * QK;
        float amax = 0.0f;
        for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(v[j]));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int j = 0; j < QK; j++) {
            int q = (int)roundf(v[j] * id);
            xu[i * QK + j] = (uint8_t)(q + 128);
            sum += q;
        }
        for (int l = 0; l < LANES; l++) dx[i * LANES + l] = d;
        sx[i] = d * (float)sum;
    }
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

/* A weight row decoded for the dot products: q [K] quants as signed bytes, dw [nb * LANES]
 * each lane's scale (a 32-block's scale repeated; Q6_K's two 16-weight halves take lanes 0-3
 * and 4-7), mw [nb] each 32-block's additive term (Q4_1's minimum, the K-quants' -dmin m),
 * bias [nb * LANES] int32 (each block's lanes sum to -128 * sum(q)) */
static void decode_row(const uint8_t *row, int qtype, int64_t nb, int8_t *q, float *dw, int32_t *bias,
                       float *mw) {
    if (qtype <= 2) { /* Q8_0, Q4_0, Q4_1: blocks of 32 */
        const int64_t block_bytes = qtype == 0 ? 34 : (qtype == 1 ? 18 : 20);
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = row + b * block_bytes;
            int8_t *qb = q + b * QK;
            float d = half_to_float(blk);
            mw[b] = qtype == 2 ? half_to_float(blk + 2) : 0.0f;
            for (int l = 0; l < LANES; l++) dw[b * LANES + l] = d;
            if (qtype == 0) {
                memcpy(qb, blk + 2, QK);
                continue;
            }
            const uint8_t *qs = blk + (qtype == 1 ? 2 : 4);
#if HAVE_VNNI || HAVE_AVX2 /* 16 bytes -> 32 nibbles, low ones first */
            __m128i packed = _mm_loadu_si128((const __m128i *)qs);
            __m128i low = _mm_and_si128(packed, _mm_set1_epi8(0x0F));
            __m128i high = _mm_and_si128(_mm_srli_epi16(packed, 4), _mm_set1_epi8(0x0F));
            __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(low), high, 1);
            if (qtype == 1) v = _mm256_sub_epi8(v, _mm256_set1_epi8(8));
            _mm256_storeu_si256((__m256i *)qb, v);
#else
            int offset = qtype == 1 ? 8 : 0;
            for (int j = 0; j < QK / 2; j++) {
                qb[j] = (int8_t)((qs[j] & 0x0F) - offset);
                qb[j + QK / 2] = (int8_t)((qs[j] >> 4) - offset);
            }
#endif
        }
    } else if (qtype <= 4) { /* Q4_K, Q5_K: super-blocks of 8 sub-blocks of 32 */
        const int64_t block_bytes = qtype == 3 ? 144 : 176;
        for (int64_t sb = 0; sb < nb / 8; sb++) {
            const uint8_t *blk = row + sb * block_bytes;
            float d = half_to_float(blk), dmin = half_to_float(blk + 2);
            const uint8_t *qh = blk + 16, *qs = blk + (qtype == 3 ? 16 : 48);
            for (int j = 0; j < 8; j++) {
                int sc, m;
                scale_min_k(blk + 4, j, &sc, &m);
                int64_t b = sb * 8 + j;
                for (int l = 0; l < LANES; l++) dw[b * LANES + l] = d * (float)sc;
                mw[b] = -(dmin * (float)m);
                const uint8_t *bytes = qs + (j / 2) * 32;
                for (int i = 0; i < QK; i++) {
                    int v = (j % 2 ? bytes[i] >> 4 : bytes[i] & 0x0F);
                    if (qtype == 4) v |= ((qh[i] >> j) & 1) << 4;
                    q[b * QK + i] = (int8_t)v;
                }
            }
        }
    } else { /* Q6_K: super-blocks of 256, 16 scales of 16 weights */
        for (int64_t sb = 0; sb < nb / 8; sb++) {
            const uint8_t *blk = row + sb * 210, *ql = blk, *qh = blk + 128;
            const int8_t *sc = (const int8_t *)(blk + 192);
            float d = half_to_float(blk + 208);
            for (int h = 0; h < 2; h++)          /* each half of 128 weights: */
                for (int part = 0; part < 4; part++) /* its four runs of 32 */
                    for (int k = 0; k < 32; k++) {
                        int low = (ql[h * 64 + (part % 2) * 32 + k] >> (4 * (part / 2))) & 0x0F;
                        int high = (qh[h * 32 + k] >> (2 * part)) & 0x03;
                        q[sb * 256 + h * 128 + part * 32 + k] = (int8_t)((low | (high << 4)) - 32);
                    }
            for (int s16 = 0; s16 < 16; s16++)
                for (int l = 0; l < LANES / 2; l++) dw[(sb * 8 + s16 / 2) * LANES + (s16 % 2) * 4 + l] = d * (float)sc[s16];
            for (int j = 0; j < 8; j++) mw[sb * 8 + j] = 0.0f;
        }
    }
#if !HAVE_AVX2 /* (the AVX2 sums read x without the offset) */
    for (int64_t b = 0; b < nb; b++) { /* each block's offset term, lane by lane */
#if HAVE_VNNI
        __m256i v = _mm256_loadu_si256((const __m256i *)(q + b * QK));
        __m256i offset = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8((char)128), v);
        _mm256_storeu_si256((__m256i *)(bias + b * LANES), _mm256_sub_epi32(_mm256_setzero_si256(), offset));
#else
        for (int l = 0; l < LANES; l++) {
            int32_t sum = 0;
            for (int j = 0; j < 4; j++) sum += q[b * QK + l * 4 + j];
            bias[b * LANES + l] = -128 * sum;
        }
#endif
    }
#else
    (void)bias;
#endif
}

#if HAVE_VNNI
static inline float hsum(__m512 v) { return _mm512_reduce_add_ps(v); }

/* out[r] = sum_b dx_r[b] dw[b] (qx_r[b] . q[b]) for R rows of x: two blocks per instruction */
static inline __attribute__((always_inline)) void dot_rows(
    float *out, int64_t R, const uint8_t *xu, const float *dx, int64_t K, const int8_t *q,
    const float *dw, const int32_t *bias, int64_t nb) {
    __m512 acc[4];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b += 2) {
        __mmask64 bytes = b + 1 < nb ? ~(__mmask64)0 : (__mmask64)0xFFFFFFFFu; /* one block left */
        __mmask16 lanes = b + 1 < nb ? 0xFFFF : 0x00FF;
        __m512i w = _mm512_maskz_loadu_epi8(bytes, q + b * QK);
        __m512i start = _mm512_maskz_loadu_epi32(lanes, bias + b * LANES);
        __m512 scale_w = _mm512_maskz_loadu_ps(lanes, dw + b * LANES);
        for (int r = 0; r < R; r++) {
            __m512i xs = _mm512_maskz_loadu_epi8(bytes, xu + r * K + b * QK);
            __m512i sums = _mm512_dpbusd_epi32(start, xs, w);
            __m512 scale = _mm512_mul_ps(_mm512_maskz_loadu_ps(lanes, dx + r * nb * LANES + b * LANES), scale_w);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), scale, acc[r]);
        }
    }
    for (int r = 0; r < R; r++) out[r] = hsum(acc[r]);
}
#elif HAVE_AVX2
static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* out[r] = sum_b dx_r[b] dw[b] (qx_r[b] . q[b]) for R rows of x, here x's signed quants (xs):
 * one block per instruction, |q| and the sign of q moved onto x (llama.cpp's AVX2 sums) */
static inline __attribute__((always_inline)) void dot_rows(
    float *out, int64_t R, const uint8_t *xs, const float *dx, int64_t K, const int8_t *q,
    const float *dw, const int32_t *bias, int64_t nb) {
    (void)bias;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[4];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m256i w = _mm256_loadu_si256((const __m256i *)(q + b * QK));
        __m256i w_abs = _mm256_abs_epi8(w); /* (-128 -> 0x80, read as unsigned 128) */
        __m256 scale_w = _mm256_loadu_ps(dw + b * LANES);
        for (int r = 0; r < R; r++) {
            __m256i x = _mm256_loadu_si256((const __m256i *)(xs + r * K + b * QK));
            __m256i pairs = _mm256_maddubs_epi16(w_abs, _mm256_sign_epi8(x, w)); /* [16] int16 */
            __m256i sums = _mm256_madd_epi16(pairs, ones);                        /* [8] int32 */
            __m256 scale = _mm256_mul_ps(_mm256_loadu_ps(dx + r * nb * LANES + b * LANES), scale_w);
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), scale, acc[r]);
        }
    }
    for (int r = 0; r < R; r++) out[r] = hsum(acc[r]);
}
#else
static inline void dot_rows(float *out, int64_t R, const uint8_t *xu, const float *dx, int64_t K,
                            const int8_t *q, const float *dw, const int32_t *bias, int64_t nb) {
    for (int r = 0; r < R; r++) {
        float acc = 0.0f;
        for (int64_t b = 0; b < nb; b++)
            for (int l = 0; l < LANES; l++) { /* lane l: products 4l..4l + 3, as vpdpbusd's */
                int32_t sum = bias[b * LANES + l];
                for (int j = 4 * l; j < 4 * l + 4; j++) sum += (int32_t)xu[r * K + b * QK + j] * (int32_t)q[b * QK + j];
                acc += dx[r * nb * LANES + b * LANES + l] * dw[b * LANES + l] * (float)sum;
            }
        out[r] = acc;
    }
}
#endif

#if HAVE_AVX2
/* Q4_0 and Q4_1 with AVX2, eight rows of x to a vector: lane r of every vector is row r.
 *
 * The row-by-row sums above spend a sign, a vpmaddubsw, a vpmaddwd, a conversion, a product of
 * scales and an FMA on every block of every (row of x, feature) pair, and then use one of the
 * eight lanes' worth of float work. Here x is packed so that one 32-byte vector holds the same
 * four quants (a quad) of eight rows; a feature's four quants, broadcast to all eight lanes,
 * multiply all eight rows in one vpmaddubsw. The 4-bit quants q are kept unsigned (0..15: for
 * Q4_0 the -8 comes back as -8 sum(qx), exact in int32), so they need no sign trick, and a pair
 * sum is at most 2 * 15 * 127 = 3,810: the eight quads of a block add up in int16 (at most
 * 30,480) before one vpmaddwd widens them. Per block, feature and eight rows: 8 vpmaddubsw and
 * 8 int16 adds, then one vpmaddwd, conversion and FMA (and Q4_1's minimum, an FMA). WR features
 * are decoded together and share each loaded vector of x. */
#define XR 8 /* rows of x in a vector */
#define WR 4 /* weight rows decoded together */

static void decode_q4_unsigned(const uint8_t *row, int qtype, int64_t nb, uint8_t *q, float *dw, float *mw) {
    const int64_t block_bytes = qtype == 1 ? 18 : 20;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * block_bytes, *qs = blk + (qtype == 1 ? 2 : 4);
        dw[b] = half_to_float(blk);
        mw[b] = qtype == 2 ? half_to_float(blk + 2) : 0.0f;
        __m128i packed = _mm_loadu_si128((const __m128i *)qs); /* low nibbles: quants 0..15 */
        __m128i low = _mm_and_si128(packed, _mm_set1_epi8(0x0F));
        __m128i high = _mm_and_si128(_mm_srli_epi16(packed, 4), _mm_set1_epi8(0x0F));
        _mm256_storeu_si256((__m256i *)(q + b * QK), _mm256_inserti128_si256(_mm256_castsi128_si256(low), high, 1));
    }
}

static void matmul_q4_avx2(float *out, const uint8_t *xu, const float *dx, const float *sx, const uint8_t *w,
                           int64_t M, int64_t N, int64_t K, int qtype, int num_threads) {
    const int64_t nb = K / QK, groups = (M + XR - 1) / XR;
    const int64_t row_bytes = nb * (qtype == 1 ? 18 : 20);
    /* xp [groups, nb, 8 quads, XR rows, 4] signed quants; dxp, sxp [groups, nb, XR] each
     * block's scale and dx sum(qx); sq8 [groups, nb, XR] 8 sum(qx) (Q4_0's offset); rows past M
     * are zeros */
    int8_t *xp = aligned_alloc(32, (size_t)(groups * nb * QK * XR));
    float *dxp = aligned_alloc(32, (size_t)(groups * nb * XR * 4));
    float *sxp = aligned_alloc(32, (size_t)(groups * nb * XR * 4));
    int32_t *sq8 = aligned_alloc(32, (size_t)(groups * nb * XR * 4));
    for (int64_t g = 0; g < groups; g++)
        for (int64_t b = 0; b < nb; b++)
            for (int r = 0; r < XR; r++) {
                int64_t row = g * XR + r, at = (g * nb + b) * XR + r;
                int32_t sum = 0;
                for (int j = 0; j < QK; j++) {
                    int8_t v = row < M ? (int8_t)(xu[row * K + b * QK + j] ^ 0x80) : 0;
                    xp[((g * nb + b) * (QK / 4) + j / 4) * XR * 4 + r * 4 + j % 4] = v;
                    sum += v;
                }
                dxp[at] = row < M ? dx[row * nb * LANES + b * LANES] : 0.0f;
                sxp[at] = row < M ? sx[row * nb + b] : 0.0f;
                sq8[at] = 8 * sum;
            }
#pragma omp parallel num_threads(num_threads)
    {
        uint8_t *q = aligned_alloc(32, (size_t)(WR * nb * QK));
        float *dw = malloc((size_t)(WR * nb * 4)), *mw = malloc((size_t)(WR * nb * 4));
        const __m256i ones = _mm256_set1_epi16(1);
#pragma omp for schedule(static)
        for (int64_t n0 = 0; n0 < N; n0 += WR) {
            int64_t features = N - n0 < WR ? N - n0 : WR;
            for (int i = 0; i < WR; i++) /* (past N: a copy of the last row, not stored) */
                decode_q4_unsigned(w + (n0 + (i < features ? i : features - 1)) * row_bytes, qtype, nb,
                                   q + i * nb * QK, dw + i * nb, mw + i * nb);
            for (int64_t g = 0; g < groups; g++) {
                __m256 acc[WR];
                for (int i = 0; i < WR; i++) acc[i] = _mm256_setzero_ps();
                for (int64_t b = 0; b < nb; b++) {
                    const int8_t *xb = xp + (g * nb + b) * QK * XR;
                    __m256i sums16[WR];
                    for (int i = 0; i < WR; i++) sums16[i] = _mm256_setzero_si256();
                    for (int quad = 0; quad < QK / 4; quad++) {
                        __m256i xv = _mm256_load_si256((const __m256i *)(xb + quad * XR * 4));
                        for (int i = 0; i < WR; i++) {
                            int32_t four;
                            memcpy(&four, q + i * nb * QK + b * QK + quad * 4, 4);
                            sums16[i] = _mm256_add_epi16(sums16[i], _mm256_maddubs_epi16(_mm256_set1_epi32(four), xv));
                        }
                    }
                    const int64_t at = (g * nb + b) * XR;
                    __m256 dxv = _mm256_load_ps(dxp + at);
                    __m256i offset = _mm256_load_si256((const __m256i *)(sq8 + at));
                    for (int i = 0; i < WR; i++) {
                        __m256i sums = _mm256_madd_epi16(sums16[i], ones); /* [XR] int32, exact */
                        if (qtype == 1) sums = _mm256_sub_epi32(sums, offset); /* sum qx (q - 8) */
                        __m256 scale = _mm256_mul_ps(dxv, _mm256_set1_ps(dw[i * nb + b]));
                        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), scale, acc[i]);
                        if (qtype == 2) acc[i] = _mm256_fmadd_ps(_mm256_load_ps(sxp + at), _mm256_set1_ps(mw[i * nb + b]), acc[i]);
                    }
                }
                for (int i = 0; i < features; i++) {
                    float lanes[XR];
                    _mm256_storeu_ps(lanes, acc[i]);
                    for (int r = 0; r < XR && g * XR + r < M; r++) out[(g * XR + r) * N + n0 + i] = lanes[r];
                }
            }
        }
        free(q);
        free(dw);
        free(mw);
    }
    free(xp);
    free(dxp);
    free(sxp);
    free(sq8);
}
#endif

/* out [M, N] = x W^T: xu, dx, sx from quantize_rows_q8; w [N, K / 32 * block_bytes] */
void quantized_matmul_int8(float *out, const uint8_t *xu, const float *dx, const float *sx,
                           const uint8_t *w, int64_t M, int64_t N, int64_t K, int qtype,
                           int num_threads) {
    const int64_t nb = K / QK;
#if HAVE_AVX2
    if (qtype == 1 || qtype == 2) {
        matmul_q4_avx2(out, xu, dx, sx, w, M, N, K, qtype, num_threads);
        return;
    }
#endif
#if HAVE_AVX2 /* the AVX2 sums take x's quants as signed bytes: qx = (qx + 128) ^ 0x80 */
    uint8_t *xs = malloc((size_t)(M * K));
    for (int64_t i = 0; i < M * K; i++) xs[i] = xu[i] ^ 0x80;
    const uint8_t *xq = xs;
#else
    const uint8_t *xq = xu;
#endif
    const int64_t row_bytes = qtype <= 2 ? nb * (qtype == 0 ? 34 : (qtype == 1 ? 18 : 20))
                                         : nb / 8 * (qtype == 3 ? 144 : (qtype == 4 ? 176 : 210));
#pragma omp parallel num_threads(num_threads)
    {
        /* the thread's decoded weight row, used by every row of x */
        int8_t *q = aligned_alloc(64, (size_t)(nb * QK + 64));
        float *dw = aligned_alloc(64, (size_t)(nb * LANES * 4 + 64));
        int32_t *bias = aligned_alloc(64, (size_t)(nb * LANES * 4 + 64));
        float *mw = malloc((size_t)(nb * 4 + 4));
#pragma omp for schedule(static)
        for (int64_t n = 0; n < N; n++) {
            decode_row(w + n * row_bytes, qtype, nb, q, dw, bias, mw);
            float sums[4];
            for (int64_t m0 = 0; m0 < M; m0 += 4) {
                const uint8_t *x0 = xq + m0 * K;
                const float *d0 = dx + m0 * nb * LANES;
                int64_t rows = M - m0 < 4 ? M - m0 : 4;
                if (rows == 4) dot_rows(sums, 4, x0, d0, K, q, dw, bias, nb);
                else if (rows == 3) dot_rows(sums, 3, x0, d0, K, q, dw, bias, nb);
                else if (rows == 2) dot_rows(sums, 2, x0, d0, K, q, dw, bias, nb);
                else dot_rows(sums, 1, x0, d0, K, q, dw, bias, nb);
                for (int64_t r = 0; r < rows; r++) {
                    float y = sums[r];
                    if (qtype == 2 || qtype == 3 || qtype == 4) { /* + sum_b mw[b] * dx[b] sum(qx[b]) */
                        const float *s = sx + (m0 + r) * nb;
#pragma omp simd reduction(+ : y)
                        for (int64_t b = 0; b < nb; b++) y += mw[b] * s[b];
                    }
                    out[(m0 + r) * N + n] = y;
                }
            }
        }
        free(q);
        free(dw);
        free(bias);
        free(mw);
    }
#if HAVE_AVX2
    free(xs);
#endif
}

int has_vnni(void) { return HAVE_VNNI; }

/* which sums were compiled: 2 AVX-512 VNNI, 1 AVX2, 0 plain C loops */
int kernel_isa(void) { return HAVE_VNNI ? 2 : (HAVE_AVX2 ? 1 : 0); }
