/* y = x W^T with x float32 and W in llama.cpp's Q8_0, Q4_0, Q4_1, Q4_K, Q5_K or Q6_K blocks:
 * each block decoded to float32, then float32 FMAs (cpu_quantized_matmul_fp32.py builds and
 * calls this file; its docstring says why).
 *
 * The decoded weights are the reference's (`gguf_quants.dequantize`) bit for bit: every formula
 * is computed in the same float32 operations in the same order (Q8_0 d q and Q4_0 d (q - 8) are
 * exact products; Q4_1 d q + m and the K-quants' d sc q - dmin m round once, at the sum, after
 * exact products, so a fused multiply-add gives the same float). Only the dot products' order
 * differs from `F.linear`'s.
 *
 * How work maps (output features split among OpenMP threads in panels of PANEL):
 *
 *     for each panel of PANEL output features (one thread):
 *         decode its PANEL rows of W into w [PANEL, K] float32      (the thread's buffer, in L1)
 *         for each group of 3 rows of x:                            (x [3, K]: in L1 too)
 *             for each 4 features of the panel:
 *                 out[3 rows, 4 features] = 12 dot products of length K
 *
 * The micro-kernel holds 12 accumulators (3 rows x 4 features, 8 lanes each: lane l sums
 * k = l, l + 8, ...), the 3 rows' vectors of x, and one vector of W: 16 of AVX2's 16 registers;
 * per 8 values of k it loads 7 vectors and does 12 FMAs. So each weight is decoded once per call
 * and serves every row of x, and each loaded vector serves 3 or 4 FMAs. The 8 lanes are summed
 * at the end (a tree of horizontal adds). Without AVX2 and FMA the same loops are plain C.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define HAVE_AVX2 1
#else
#define HAVE_AVX2 0
#endif
#if defined(__F16C__)
#include <immintrin.h>
#endif
#ifndef ORDER
#define ORDER 0
#endif

#ifndef PANEL
#define PANEL 8 /* output features decoded at a time, per thread (a multiple of COLS) */
#endif
#ifndef ROWS
#define ROWS 3 /* rows of x per micro-kernel */
#endif
#ifndef COLS
#define COLS 4 /* output features per micro-kernel (at most 4) */
#endif

static inline float half_to_float(const uint8_t *p) { /* little-endian IEEE float16, exactly */
    uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
    uint32_t bits;
    if (exponent == 31) { /* infinity or NaN: the payload shifted, as the hardware does */
        bits = sign | 0x7F800000u | (mantissa << 13);
    } else if (exponent != 0) {
        bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
    } else if (mantissa == 0) {
        bits = sign;
    } else { /* subnormal: normalise */
        int e = -1;
        do {
            mantissa <<= 1;
            e++;
        } while (!(mantissa & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((mantissa & 0x3FF) << 13);
    }
    float value;
    memcpy(&value, &bits, 4);
    return value;
#endif
}

/* ---- decoding: one row of W's blocks -> w [K] float32 ---- */

static inline void decode_q4_32(const uint8_t *qs, float d, const float *m, int offset, float *w) {
    /* 16 bytes of nibbles -> 32 weights (low nibbles first): d (q - offset), + *m if m */
#if HAVE_AVX2
    __m128i packed = _mm_loadu_si128((const __m128i *)qs);
    __m128i mask = _mm_set1_epi8(0x0F), shift = _mm_set1_epi8((char)offset);
    __m128i halves[2] = {_mm_sub_epi8(_mm_and_si128(packed, mask), shift),
                         _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(packed, 4), mask), shift)};
    __m256 vd = _mm256_set1_ps(d);
    for (int h = 0; h < 2; h++) {
        __m256 lo = _mm256_mul_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(halves[h])));
        __m256 hi = _mm256_mul_ps(
            vd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(halves[h], 8))));
        if (m) {
            lo = _mm256_add_ps(lo, _mm256_set1_ps(*m));
            hi = _mm256_add_ps(hi, _mm256_set1_ps(*m));
        }
        _mm256_storeu_ps(w + 16 * h, lo);
        _mm256_storeu_ps(w + 16 * h + 8, hi);
    }
#else
    for (int j = 0; j < 16; j++) {
        w[j] = d * (float)((qs[j] & 0x0F) - offset);
        w[j + 16] = d * (float)((qs[j] >> 4) - offset);
        if (m) {
            w[j] += *m;
            w[j + 16] += *m;
        }
    }
#endif
}

static void decode_row(const uint8_t *row, int qtype, int64_t K, float *w) {
    if (qtype == 0) { /* Q8_0: d, 32 int8; w = q d */
        for (int64_t b = 0; b < K / 32; b++, row += 34, w += 32) {
            float d = half_to_float(row);
            const int8_t *q = (const int8_t *)(row + 2);
#if HAVE_AVX2
            __m256 vd = _mm256_set1_ps(d);
            for (int j = 0; j < 32; j += 8) {
                __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + j)));
                _mm256_storeu_ps(w + j, _mm256_mul_ps(_mm256_cvtepi32_ps(v), vd));
            }
#else
            for (int j = 0; j < 32; j++) w[j] = (float)q[j] * d;
#endif
        }
    } else if (qtype == 1) { /* Q4_0: d, 16 bytes of nibbles; w = d (q - 8) */
        for (int64_t b = 0; b < K / 32; b++, row += 18, w += 32)
            decode_q4_32(row + 2, half_to_float(row), NULL, 8, w);
    } else if (qtype == 2) { /* Q4_1: d, m, 16 bytes of nibbles; w = d q + m */
        for (int64_t b = 0; b < K / 32; b++, row += 20, w += 32) {
            float m = half_to_float(row + 2);
            decode_q4_32(row + 4, half_to_float(row), &m, 0, w);
        }
    } else if (qtype == 5) { /* Q6_K: ql 128, qh 64, 16 int8 scales, d; w = (d sc) (q - 32) */
        for (int64_t b = 0; b < K / 256; b++, row += 210, w += 256) {
            float d = half_to_float(row + 208);
            const int8_t *sc = (const int8_t *)(row + 192);
            for (int h = 0; h < 2; h++) { /* each half of 128: ql 64 bytes, qh 32 */
                const uint8_t *ql = row + 64 * h, *qh = row + 128 + 32 * h;
                for (int g = 0; g < 4; g++) { /* 32 weights: ql's low (g < 2) or high nibbles */
                    int start = 128 * h + 32 * g, shift = (g >> 1) * 4;
                    const uint8_t *lo = ql + (g & 1) * 32;
                    float s0 = d * (float)sc[start / 16], s1 = d * (float)sc[start / 16 + 1];
                    for (int j = 0; j < 32; j++) {
                        int q = ((lo[j] >> shift) & 0x0F) | (((qh[j] >> (2 * g)) & 0x03) << 4);
                        w[start + j] = (j < 16 ? s0 : s1) * (float)(q - 32);
                    }
                }
            }
        }
    } else { /* Q4_K, Q5_K: d, dmin, 12 bytes of 6-bit scales and minimums, (qh 32), qs 128 */
        const int64_t nbytes = qtype == 3 ? 144 : 176;
        for (int64_t b = 0; b < K / 256; b++, row += nbytes, w += 256) {
            float d = half_to_float(row), dmin = half_to_float(row + 2);
            const uint8_t *s = row + 4, *qs = row + (qtype == 3 ? 16 : 48), *qh = row + 16;
            for (int i = 0; i < 8; i++) { /* sub-block i: low (i even) or high nibbles */
                int sc, mn;
                if (i < 4) {
                    sc = s[i] & 63;
                    mn = s[i + 4] & 63;
                } else {
                    sc = (s[i + 4] & 0x0F) | ((s[i - 4] >> 2) & 0x30);
                    mn = (s[i + 4] >> 4) | ((s[i] >> 2) & 0x30);
                }
                float scale = d * (float)sc, minimum = dmin * (float)mn;
                const uint8_t *src = qs + (i >> 1) * 32;
                int shift = (i & 1) * 4;
                for (int j = 0; j < 32; j++) {
                    int q = (src[j] >> shift) & 0x0F;
                    if (qtype == 4) q |= ((qh[j] >> i) & 1) << 4;
                    w[32 * i + j] = scale * (float)q - minimum;
                }
            }
        }
    }
}

/* ---- the micro-kernel: out[R rows, cols] = x[R, K] . w[4, K]^T ---- */

#if HAVE_AVX2
static inline __m128 sum_lanes4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    /* (sum of a0's 8 lanes, of a1's, a2's, a3's) */
    __m256 s = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}
#endif

#if HAVE_AVX2 && defined(__GNUC__) && defined(__x86_64__)
#ifndef ASM_KERNEL
#define ASM_KERNEL 1
#endif
#else
#undef ASM_KERNEL
#define ASM_KERNEL 0
#endif

#if HAVE_AVX2 && ASM_KERNEL
/* The 3 x 4 micro-kernel's loop in assembly: 3 rows of x in registers, each row of W loaded
 * once per 8 values of k (7 loads, 12 FMAs). Written with intrinsics, gcc 12 keeps one vector of
 * x in a register and reads W's 4 vectors 3 times each as FMA memory operands (15 loads for 12
 * FMAs), and the loop is then bound by loads, not FMAs. */
static void kernel_3x4(const float *x, const float *w, int64_t K, float *out, int64_t ldo, int cols) {
    __m256 a00, a01, a02, a03, a10, a11, a12, a13, a20, a21, a22, a23; /* zeroed in the asm */
    __m256 t0, t1, t2, t3;
    const float *xp = x, *wp = w, *w3 = w + 3 * K;
    int64_t steps = K / 8;
    const int64_t stride = K * 4; /* bytes between rows of x, and of W */
    __asm__(
        "vxorps %[a00], %[a00], %[a00]\n\t"
        "vxorps %[a01], %[a01], %[a01]\n\t"
        "vxorps %[a02], %[a02], %[a02]\n\t"
        "vxorps %[a03], %[a03], %[a03]\n\t"
        "vxorps %[a10], %[a10], %[a10]\n\t"
        "vxorps %[a11], %[a11], %[a11]\n\t"
        "vxorps %[a12], %[a12], %[a12]\n\t"
        "vxorps %[a13], %[a13], %[a13]\n\t"
        "vxorps %[a20], %[a20], %[a20]\n\t"
        "vxorps %[a21], %[a21], %[a21]\n\t"
        "vxorps %[a22], %[a22], %[a22]\n\t"
        "vxorps %[a23], %[a23], %[a23]\n\t"
        "1:\n\t"
        "vmovups (%[x]), %[t0]\n\t"
        "vmovups (%[x],%[s]), %[t1]\n\t"
        "vmovups (%[x],%[s],2), %[t2]\n\t"
        "vmovups (%[w]), %[t3]\n\t"
        "vfmadd231ps %[t3], %[t0], %[a00]\n\t"
        "vfmadd231ps %[t3], %[t1], %[a10]\n\t"
        "vfmadd231ps %[t3], %[t2], %[a20]\n\t"
        "vmovups (%[w],%[s]), %[t3]\n\t"
        "vfmadd231ps %[t3], %[t0], %[a01]\n\t"
        "vfmadd231ps %[t3], %[t1], %[a11]\n\t"
        "vfmadd231ps %[t3], %[t2], %[a21]\n\t"
        "vmovups (%[w],%[s],2), %[t3]\n\t"
        "vfmadd231ps %[t3], %[t0], %[a02]\n\t"
        "vfmadd231ps %[t3], %[t1], %[a12]\n\t"
        "vfmadd231ps %[t3], %[t2], %[a22]\n\t"
        "vmovups (%[w3]), %[t3]\n\t"
        "vfmadd231ps %[t3], %[t0], %[a03]\n\t"
        "vfmadd231ps %[t3], %[t1], %[a13]\n\t"
        "vfmadd231ps %[t3], %[t2], %[a23]\n\t"
        "add $32, %[x]\n\t"
        "add $32, %[w]\n\t"
        "add $32, %[w3]\n\t"
        "dec %[n]\n\t"
        "jnz 1b\n\t"
        : [a00] "=&x"(a00), [a01] "=&x"(a01), [a02] "=&x"(a02), [a03] "=&x"(a03), [a10] "=&x"(a10),
          [a11] "=&x"(a11), [a12] "=&x"(a12), [a13] "=&x"(a13), [a20] "=&x"(a20), [a21] "=&x"(a21),
          [a22] "=&x"(a22), [a23] "=&x"(a23), [t0] "=&x"(t0), [t1] "=&x"(t1), [t2] "=&x"(t2),
          [t3] "=&x"(t3), [x] "+r"(xp), [w] "+r"(wp), [w3] "+r"(w3), [n] "+r"(steps)
        : [s] "r"(stride)
        : "cc", "memory");
    __m256 sums[3][4] = {{a00, a01, a02, a03}, {a10, a11, a12, a13}, {a20, a21, a22, a23}};
    for (int r = 0; r < 3; r++) {
        __m128 s = sum_lanes4(sums[r][0], sums[r][1], sums[r][2], sums[r][3]);
        if (cols == 4) {
            _mm_storeu_ps(out + r * ldo, s);
        } else {
            float t[4];
            _mm_storeu_ps(t, s);
            for (int c = 0; c < cols; c++) out[r * ldo + c] = t[c];
        }
    }
}
#endif

static inline __attribute__((always_inline)) void micro_kernel(
    const int R, const float *x, const float *w, int64_t K, float *out, int64_t ldo, int cols) {
    /* x: R rows, K apart; w: COLS rows, K apart; out: R rows, ldo apart; cols <= COLS stored */
#if HAVE_AVX2 && ASM_KERNEL
    if (R == 3 && COLS == 4) { /* (see kernel_3x4) */
        kernel_3x4(x, w, K, out, ldo, cols);
        return;
    }
#endif
#if HAVE_AVX2
    __m256 acc[4][COLS]; /* (R <= 4 rows used) */
    for (int r = 0; r < R; r++)
        for (int c = 0; c < COLS; c++) acc[r][c] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k += 8) {
#if ORDER == 1
        __m256 wv[COLS];
        for (int c = 0; c < COLS; c++) wv[c] = _mm256_loadu_ps(w + c * K + k);
        for (int r = 0; r < R; r++) {
            __m256 xv = _mm256_loadu_ps(x + r * K + k);
            for (int c = 0; c < COLS; c++) acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
        }
#else
        __m256 xv[4];
        for (int r = 0; r < R; r++) xv[r] = _mm256_loadu_ps(x + r * K + k);
        for (int c = 0; c < COLS; c++) {
            __m256 wv = _mm256_loadu_ps(w + c * K + k);
            for (int r = 0; r < R; r++) acc[r][c] = _mm256_fmadd_ps(xv[r], wv, acc[r][c]);
        }
#endif
    }
    for (int r = 0; r < R; r++) {
        __m256 z = _mm256_setzero_ps();
        __m128 s = sum_lanes4(acc[r][0], COLS > 1 ? acc[r][COLS > 1 ? 1 : 0] : z,
                              COLS > 2 ? acc[r][COLS > 2 ? 2 : 0] : z,
                              COLS > 3 ? acc[r][COLS > 3 ? 3 : 0] : z);
        if (cols == COLS) {
            _mm_storeu_ps(out + r * ldo, s);
        } else {
            float t[COLS];
            _mm_storeu_ps(t, s);
            for (int c = 0; c < cols; c++) out[r * ldo + c] = t[c];
        }
    }
#else
    for (int r = 0; r < R; r++)
        for (int c = 0; c < cols; c++) {
            float lane[8] = {0};
            for (int64_t k = 0; k < K; k += 8)
                for (int l = 0; l < 8; l++) lane[l] += x[r * K + k + l] * w[c * K + k + l];
            out[r * ldo + c] = ((lane[0] + lane[1]) + (lane[2] + lane[3])) +
                               ((lane[4] + lane[5]) + (lane[6] + lane[7]));
        }
#endif
}

typedef void (*kernel_fn)(const float *, const float *, int64_t, float *, int64_t, int);
#define KERNEL(R)                                                                                  \
    static void kernel_##R(const float *x, const float *w, int64_t K, float *out, int64_t ldo,   \
                           int cols) {                                                           \
        micro_kernel(R, x, w, K, out, ldo, cols);                                                \
    }
KERNEL(1)
KERNEL(2)
KERNEL(3)
KERNEL(4)
static const kernel_fn KERNELS[] = {NULL, kernel_1, kernel_2, kernel_3, kernel_4}; /* by rows */

static const int64_t BLOCK_SIZE[] = {32, 32, 32, 256, 256, 256};
static const int64_t BLOCK_BYTES[] = {34, 18, 20, 144, 176, 210};

/* out [M, N] = x [M, K] . W^T, W's rows `raw` [N, K / block * block_bytes] */
void quantized_matmul_fp32(float *out, const float *x, const uint8_t *raw, int64_t M, int64_t N,
                           int64_t K, int qtype, int threads) {
    const int64_t row_bytes = K / BLOCK_SIZE[qtype] * BLOCK_BYTES[qtype];
    const int64_t panels = (N + PANEL - 1) / PANEL;
    if (K == 0) { /* (empty sums; the assembly loop runs at least once) */
        memset(out, 0, (size_t)(M * N) * sizeof(float));
        return;
    }
#pragma omp parallel num_threads(threads)
    {
        float *w = aligned_alloc(64, (size_t)(PANEL * K) * sizeof(float)); /* K: 32 | K */
#pragma omp for schedule(static)
        for (int64_t p = 0; p < panels; p++) {
            const int64_t n0 = p * PANEL;
            const int valid = (int)(N - n0 < PANEL ? N - n0 : PANEL);
            for (int i = 0; i < valid; i++) decode_row(raw + (n0 + i) * row_bytes, qtype, K, w + i * K);
            if (valid < PANEL) memset(w + valid * K, 0, (size_t)((PANEL - valid) * K) * sizeof(float));
            for (int64_t m = 0; m < M; m += ROWS) {
                const kernel_fn kernel = KERNELS[M - m < ROWS ? M - m : ROWS];
                for (int c = 0; c < valid; c += COLS)
                    kernel(x + m * K, w + c * K, K, out + m * N + n0 + c, N,
                           valid - c < COLS ? valid - c : COLS);
            }
        }
        free(w);
    }
}

/* out [N, K] = W's float32 values (the same decoding), rows shared out among threads */
void dequantize_fp32(float *out, const uint8_t *raw, int64_t N, int64_t K, int qtype, int threads) {
    const int64_t row_bytes = K / BLOCK_SIZE[qtype] * BLOCK_BYTES[qtype];
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t n = 0; n < N; n++) decode_row(raw + n * row_bytes, qtype, K, out + n * K);
}

/* 1 where this build has the AVX2 and FMA micro-kernel, 0 where it is plain C */
int has_avx2(void) { return HAVE_AVX2; }

/* One core's float32 FMA rate, flop/s, for the bench tool to set the kernel's rate beside
 * (bench/tools/quantized_matmul.py --peak): `iterations` rounds of 10 independent chains of
 * register-only FMAs (10 > the FMA latency times the FMA ports), timed by the thread's CPU
 * clock. 0 where the build has no AVX2 and FMA. */
#include <time.h>
double fma_peak(int64_t iterations) {
#if HAVE_AVX2 && ASM_KERNEL
    struct timespec t0, t1;
    int64_t n = iterations;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    __asm__ volatile(
        "vxorps %%ymm0, %%ymm0, %%ymm0\n\t"
        "vmovaps %%ymm0, %%ymm1\n\t vmovaps %%ymm0, %%ymm2\n\t vmovaps %%ymm0, %%ymm3\n\t"
        "vmovaps %%ymm0, %%ymm4\n\t vmovaps %%ymm0, %%ymm5\n\t vmovaps %%ymm0, %%ymm6\n\t"
        "vmovaps %%ymm0, %%ymm7\n\t vmovaps %%ymm0, %%ymm8\n\t vmovaps %%ymm0, %%ymm9\n\t"
        "vmovaps %%ymm0, %%ymm14\n\t vmovaps %%ymm0, %%ymm15\n\t"
        "1:\n\t"
        "vfmadd231ps %%ymm14, %%ymm15, %%ymm0\n\t vfmadd231ps %%ymm14, %%ymm15, %%ymm1\n\t"
        "vfmadd231ps %%ymm14, %%ymm15, %%ymm2\n\t vfmadd231ps %%ymm14, %%ymm15, %%ymm3\n\t"
        "vfmadd231ps %%ymm14, %%ymm15, %%ymm4\n\t vfmadd231ps %%ymm14, %%ymm15, %%ymm5\n\t"
        "vfmadd231ps %%ymm14, %%ymm15, %%ymm6\n\t vfmadd231ps %%ymm14, %%ymm15, %%ymm7\n\t"
        "vfmadd231ps %%ymm14, %%ymm15, %%ymm8\n\t vfmadd231ps %%ymm14, %%ymm15, %%ymm9\n\t"
        "dec %0\n\t"
        "jnz 1b\n\t"
        : "+r"(n)
        :
        : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",
          "xmm14", "xmm15", "cc");
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
    double seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    return (double)iterations * 10 * 16 / seconds; /* 10 FMAs of 8 lanes, 2 flops each */
#else
    (void)iterations;
    return 0.0;
#endif
}
