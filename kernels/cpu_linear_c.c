/* y = x W^T (+ b) in float32 on a CPU with AVX-512, W packed once into panels of 32 output
 * features (cpu_linear_c.py builds and calls this file; its docstring says why it exists).
 *
 * Panels: W [N, K] becomes panels [ceil(N / 32), K, 32]: panels[p, k, j] = W[32 p + j, k]
 * (0 where 32 p + j >= N). A panel is one contiguous run of K * 32 floats, read front to back:
 * at k its 32 weights are two vectors. Each thread takes a contiguous range of panels, so the
 * weights it reads from memory are one long sequential stream.
 *
 * Micro-kernel: R <= 8 rows of x by one panel. 2 R accumulator vectors (16 at R = 8) stay in
 * registers over the whole K loop; per k, two loads of W, R broadcasts of x[r, k] and 2 R FMAs:
 *
 *     acc[r][0:16]  += x[r, k] * panel[k, 0:16]      acc[r][16:32] += x[r, k] * panel[k, 16:32]
 *
 * y[r, 32 p + j] = acc[r][j] (+ b[32 p + j]), each output the sum over k in order, in float32.
 * R = 8 for all rows but the last few (R compiled as a constant for 1 .. 8, loops unrolled).
 *
 * Rows in chunks of ROW_CHUNK: the panels loop runs once per chunk, so a prefill's x, which
 * every panel reads again, stays in cache (a chunk of 1,024 rows of 1,536 floats is 6 MB).
 *
 * Layout: x [M, K] and y [M, N] row-major contiguous; panels as above, contiguous; bias [N] or
 * NULL. No argument is checked here: the caller (cpu_linear_c.py) did.
 */
#include <immintrin.h>
#include <stdint.h>

#define PANEL 32       /* output features per panel: two 16-float vectors */
#define ROWS 8         /* rows of x per micro-kernel call */
#define ROW_CHUNK 1024 /* rows per pass over the panels */

/* y[r, 0 .. n - 1] (n <= 32, this panel's valid columns) for R rows of x against one panel. */
static inline __attribute__((always_inline)) void
tile(float *y, const float *x, const float *panel, const float *bias, int64_t K, int64_t N,
     int64_t n, const int R) {
    __m512 lo[ROWS], hi[ROWS];
    for (int r = 0; r < R; r++) {
        lo[r] = _mm512_setzero_ps();
        hi[r] = _mm512_setzero_ps();
    }
    for (int64_t k = 0; k < K; k++) {
        const __m512 w_lo = _mm512_loadu_ps(panel + k * PANEL);
        const __m512 w_hi = _mm512_loadu_ps(panel + k * PANEL + 16);
        for (int r = 0; r < R; r++) {
            const __m512 xb = _mm512_set1_ps(x[r * K + k]);
            lo[r] = _mm512_fmadd_ps(xb, w_lo, lo[r]);
            hi[r] = _mm512_fmadd_ps(xb, w_hi, hi[r]);
        }
    }
    /* columns 0..15 and 16..31 of the panel that lie inside y's N columns */
    const __mmask16 m_lo = n >= 16 ? 0xFFFF : (__mmask16)((1u << n) - 1u);
    const __mmask16 m_hi = n >= 32 ? 0xFFFF : n <= 16 ? 0 : (__mmask16)((1u << (n - 16)) - 1u);
    const __m512 b_lo = bias ? _mm512_maskz_loadu_ps(m_lo, bias) : _mm512_setzero_ps();
    const __m512 b_hi = bias ? _mm512_maskz_loadu_ps(m_hi, bias + 16) : _mm512_setzero_ps();
    for (int r = 0; r < R; r++) {
        _mm512_mask_storeu_ps(y + r * N, m_lo, _mm512_add_ps(lo[r], b_lo));
        _mm512_mask_storeu_ps(y + r * N + 16, m_hi, _mm512_add_ps(hi[r], b_hi));
    }
}

void linear_panels(float *y,             /* [M, N], written */
                   const float *x,       /* [M, K] */
                   const float *panels,  /* [ceil(N / 32), K, 32] */
                   const float *bias,    /* [N] or NULL */
                   int64_t M, int64_t N, int64_t K, int num_threads) {
    const int64_t num_panels = (N + PANEL - 1) / PANEL;
#pragma omp parallel num_threads(num_threads)
    for (int64_t first = 0; first < M; first += ROW_CHUNK) {
        const int64_t last = first + ROW_CHUNK < M ? first + ROW_CHUNK : M;
#pragma omp for schedule(static)
        for (int64_t p = 0; p < num_panels; p++) {
            const float *panel = panels + p * K * PANEL;
            const float *b = bias ? bias + p * PANEL : 0;
            const int64_t n = N - p * PANEL < PANEL ? N - p * PANEL : PANEL;
            for (int64_t row = first; row < last; row += ROWS) {
                float *yr = y + row * N + p * PANEL;
                const float *xr = x + row * K;
                switch (last - row < ROWS ? last - row : ROWS) {
                case 1: tile(yr, xr, panel, b, K, N, n, 1); break;
                case 2: tile(yr, xr, panel, b, K, N, n, 2); break;
                case 3: tile(yr, xr, panel, b, K, N, n, 3); break;
                case 4: tile(yr, xr, panel, b, K, N, n, 4); break;
                case 5: tile(yr, xr, panel, b, K, N, n, 5); break;
                case 6: tile(yr, xr, panel, b, K, N, n, 6); break;
                case 7: tile(yr, xr, panel, b, K, N, n, 7); break;
                default: tile(yr, xr, panel, b, K, N, n, 8);
                }
            }
        }
    }
}
