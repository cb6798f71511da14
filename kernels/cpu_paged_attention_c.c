/* Decode paged attention on a CPU with AVX-512 (cpu_paged_attention_c.py builds and calls this
 * file; its docstring says why it exists beside the numba kernel).
 *
 * Decode only: sequence i has one query token (row i of query and out) at position
 * seq_lens[i] - 1, and it sees the positions 0 .. seq_lens[i] - 1, which live in the blocks
 * block_tables[i] lists (position p: block block_tables[i][p / block_size], slot p % block_size).
 * Per query head h (KV head h / group) it computes, over the keys t it sees,
 *
 *     s_t = scale * q . k_t          out = sum_t exp(s_t - max_u s_u) v_t / sum_t exp(s_t - max_u s_u)
 *
 * with the online softmax, over chunks of CHUNK = 16 consecutive positions (a chunk may span
 * blocks when block_size < 16, or be part of one when it is larger):
 *
 *     m_new = max(m, max_t s_t)             l   = l * exp(m - m_new) + sum_t exp(s_t - m_new)
 *     acc   = acc * exp(m - m_new) + sum_t exp(s_t - m_new) v_t          m = m_new
 *
 * and out = acc / l at the end. Only the positions < seq_len are ever loaded: a stale or NaN
 * slot past them cannot reach the output.
 *
 * Scores, 16 keys at once: per (query row, key) the head_dim / 16 FMAs leave one vector of 16
 * partial products; the 16 keys' vectors are then reduced together into ONE vector whose lane t
 * is key t's score (hsum16: 30 shuffles and 15 adds for 16 scores, where 16 horizontal sums
 * take 4 shuffle-add steps each on a vector that holds one score). The exp is Cephes' expf
 * polynomial on those 16 lanes at once (exp16; the numba kernel's exp_nonpositive, the same
 * constants), then acc = acc * alpha + sum_t p_t v_t with nd FMAs per key, acc in registers
 * (nd = head_dim / 16; head_dim 64 and 128 are compiled with nd a constant, loops unrolled).
 *
 * Prefetch: a decode reads every K/V line once, from DRAM, and the block table sends each block
 * to an address the hardware prefetcher cannot guess. While it computes a chunk, the kernel asks
 * for the next chunk's lines (K and V, the item's heads) into L2, a few per key of each row's
 * score loop: asked all at once at the chunk's start they stalled the core (kernels/README.md).
 *
 * Layout: query, out [num_seqs, num_heads, head_dim]; caches [num_blocks, block_size,
 * num_kv_heads, head_dim]; block_tables [num_seqs, max_blocks] int32; seq_lens [num_seqs] int32.
 * The block ids and table lengths were checked by the caller's plan (cpu_paged_attention_numba.
 * plan): none is re-checked here. head_dim is a multiple of 16.
 *
 * Work items: (sequence, kv_per_item consecutive KV heads), handed to OpenMP's threads one at a
 * time (schedule(dynamic, 1): contexts differ in length). With all KV heads in an item, a key's
 * K (and V) rows of all its heads are one contiguous run of memory.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#define CHUNK 16 /* keys per score vector */
/* Tuning knobs (-D at compile time, for measuring; kernels/README.md): PREFETCH 0 asks for
 * nothing ahead; PF_DIST is how many chunks ahead it asks; PF_HINT which cache level (T1: L2;
 * T0, into L1, measured slower: a chunk of K and V with all KV heads is 24 KB of SmolLM2's, and
 * two of them do not fit L1's 32 KB). */
#ifndef PREFETCH
#define PREFETCH 1
#endif
#ifndef PF_HINT
#define PF_HINT _MM_HINT_T1
#endif
#ifndef PF_DIST
#define PF_DIST 1
#endif

/* 16 vectors a[0..15] -> one vector whose lane t is the sum of a[t]'s 16 lanes. */
static inline __m512 hsum16(const __m512 *a) {
    __m512 b[8], c[4], d[2];
    /* Per 128-bit lane: [a0+a2, a1+a3 of a[2i] and a[2i+1], interleaved] */
    for (int i = 0; i < 8; i++)
        b[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                             _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    /* Per 128-bit lane k: the lane-k sums of a[4j], a[4j + 1], a[4j + 2], a[4j + 3] */
    for (int j = 0; j < 4; j++)
        c[j] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * j], b[2 * j + 1], 0x44),
                             _mm512_shuffle_ps(b[2 * j], b[2 * j + 1], 0xEE));
    /* Then the four 128-bit lanes added: lanes 0+1, 2+3 of two c's, and again */
    for (int j = 0; j < 2; j++)
        d[j] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * j], c[2 * j + 1], 0x88),
                             _mm512_shuffle_f32x4(c[2 * j], c[2 * j + 1], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(d[0], d[1], 0x88),
                         _mm512_shuffle_f32x4(d[0], d[1], 0xDD));
}

/* exp(x) for x <= 0 on 16 lanes (Cephes' expf, as exp_nonpositive in the numba file): x clamped
 * at -87 (exp = 1.6e-38, still normal), n = round(x / ln 2), r = x - n ln 2 (ln 2 in two parts),
 * exp(r) a degree-7 polynomial, times 2^n (scalef: the exponent added, no rounding). */
static inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f),
                                                    _mm512_set1_ps(0.5f)),
                                    _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    x = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), x);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(y, n);
}

/* The largest lane of x, in every lane (four shuffle-and-max steps, no scalar). */
static inline __m512 max_all16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_shuffle_f32x4(x, x, 0x4E)); /* 256-bit halves swapped */
    x = _mm512_max_ps(x, _mm512_shuffle_f32x4(x, x, 0xB1)); /* 128-bit lanes swapped */
    x = _mm512_max_ps(x, _mm512_permute_ps(x, 0x4E));       /* pairs swapped */
    return _mm512_max_ps(x, _mm512_permute_ps(x, 0xB1));    /* neighbours swapped */
}

/* The online-softmax step of one query row over one chunk of c <= 16 keys (k[t], v[t]: key t's
 * head_dim floats of K and V), nd = head_dim / 16 vectors a row. q: the row's query, pre-scaled;
 * acc: its head_dim accumulators; m: its running max in every lane; l: its running sum of
 * weights, lane-wise (added up at the end). Inlined with constant c == 16 and nd (4 or 8): the
 * loops unrolled, q and acc in registers. Keys t >= c are never loaded. */
static inline __attribute__((always_inline)) void
row_chunk(const float *q, float *acc, __m512 *m, __m512 *l, const float *const *k,
          const float *const *v, const int c, const int64_t nd, const float *kc, const float *vc,
          const int64_t *pf, int64_t pf_n) {
    /* scores: per key, nd FMAs leave a vector of 16 partial products; hsum16 turns the 16 keys'
     * vectors into one vector of 16 scores (lanes t >= c: 0, masked below) */
    __m512 part[CHUNK];
    for (int t = 0; t < CHUNK; t++) part[t] = _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int t = 0; t < c; t++) {
        /* the row's share of the lines to ask for, a few per key */
        for (int64_t i = t * pf_n / CHUNK; i < (t + 1) * pf_n / CHUNK; i++) {
            _mm_prefetch((const char *)(kc + pf[i]), PF_HINT);
            _mm_prefetch((const char *)(vc + pf[i]), PF_HINT);
        }
        __m512 s = _mm512_mul_ps(_mm512_loadu_ps(q), _mm512_loadu_ps(k[t]));
        for (int64_t j = 1; j < nd; j++)
            s = _mm512_fmadd_ps(_mm512_loadu_ps(q + 16 * j), _mm512_loadu_ps(k[t] + 16 * j), s);
        part[t] = s;
    }
    const __mmask16 valid = (__mmask16)((1u << c) - 1u);
    const __m512 s = _mm512_mask_blend_ps(valid, _mm512_set1_ps(-INFINITY), hsum16(part));
    const __m512 m_new = _mm512_max_ps(*m, max_all16(s));
    /* alpha = exp(m - m_new): before the first chunk m = -inf, clamped to 1.6e-38, times an
     * empty state (acc = 0, l = 0) is still 0 */
    const __m512 alpha = exp16(_mm512_sub_ps(*m, m_new));
    const __m512 p = _mm512_maskz_mov_ps(valid, exp16(_mm512_sub_ps(s, m_new)));
    *l = _mm512_fmadd_ps(*l, alpha, p);
    *m = m_new;
    /* acc = acc * alpha + sum_t p_t v_t: per key one broadcast weight, nd FMAs */
    float pw[CHUNK] __attribute__((aligned(64)));
    _mm512_store_ps(pw, p);
    __m512 a[nd];
    for (int64_t j = 0; j < nd; j++) a[j] = _mm512_mul_ps(_mm512_loadu_ps(acc + 16 * j), alpha);
#pragma GCC unroll 16
    for (int t = 0; t < c; t++) {
        const __m512 pt = _mm512_set1_ps(pw[t]);
        for (int64_t j = 0; j < nd; j++)
            a[j] = _mm512_fmadd_ps(pt, _mm512_loadu_ps(v[t] + 16 * j), a[j]);
    }
    for (int64_t j = 0; j < nd; j++) _mm512_storeu_ps(acc + 16 * j, a[j]);
}

/* The arguments every work item reads. */
typedef struct {
    const float *query, *key_cache, *value_cache;
    float *out;
    const int32_t *block_tables, *seq_lens;
    int64_t max_blocks, block_size, num_heads, head_dim, group, kv_per_item, key_stride;
    float scale;
} Args;

/* Slot offsets (in floats, at KV head first_kv) of the keys at positions start .. end - 1. */
static inline void chunk_offsets(int64_t *dst, const int32_t *table, int64_t start, int64_t end,
                                 int64_t block_size, int64_t key_stride, int64_t head_offset) {
    for (int64_t pos = start; pos < end; pos++)
        dst[pos - start] =
            ((int64_t)table[pos / block_size] * block_size + pos % block_size) * key_stride +
            head_offset;
}

/* Ask memory for lines 0 .. lines - 1 of K and of V at these keys' offsets, keys t = first,
 * first + step, ... < n. */
static inline void prefetch_keys(const Args *a, const int64_t *offset, int64_t first, int64_t n,
                                 int64_t step, int64_t lines) {
    for (int64_t t = first; t < n; t += step)
        for (int64_t b = 0; b < lines * 16; b += 16) {
            _mm_prefetch((const char *)(a->key_cache + offset[t] + b), PF_HINT);
            _mm_prefetch((const char *)(a->value_cache + offset[t] + b), PF_HINT);
        }
}

/* Work item: sequence seq, KV heads first_kv .. first_kv + kv_per_item - 1 and their query
 * heads (rows = kv_per_item * group). nd = head_dim / 16, a constant where inlined. q, acc:
 * the thread's [rows, head_dim] scratch; m, l: [rows]. */
static inline __attribute__((always_inline)) void
attend_item(const Args *a, int64_t seq, int64_t first_kv, const int64_t nd, float *q, float *acc,
            __m512 *m, __m512 *l, int64_t *pf) {
    const int64_t head_dim = 16 * nd, rows = a->kv_per_item * a->group;
    const int64_t first_head = first_kv * a->group;
    const int64_t seq_len = a->seq_lens[seq];
    const int32_t *table = a->block_tables + seq * a->max_blocks;
    const int64_t lines = a->kv_per_item * nd; /* cache lines of one key's K in this item */
    const int64_t head_offset = first_kv * head_dim;
    const float *qrow = a->query + (seq * a->num_heads + first_head) * head_dim;
    for (int64_t r = 0; r < rows * nd; r++) {
        _mm512_store_ps(q + 16 * r,
                        _mm512_mul_ps(_mm512_loadu_ps(qrow + 16 * r), _mm512_set1_ps(a->scale)));
        _mm512_store_ps(acc + 16 * r, _mm512_setzero_ps());
    }
    for (int64_t r = 0; r < rows; r++) {
        m[r] = _mm512_set1_ps(-INFINITY);
        l[r] = _mm512_setzero_ps();
    }
    int64_t offset[CHUNK], ahead[CHUNK];
    const float *kp[CHUNK], *vp[CHUNK];
    /* The first PF_DIST chunks asked for at once (nothing to compute yet). */
    for (int64_t start = 0; PREFETCH && start < PF_DIST * CHUNK && start < seq_len;
         start += CHUNK) {
        const int64_t end = start + CHUNK < seq_len ? start + CHUNK : seq_len;
        chunk_offsets(ahead, table, start, end, a->block_size, a->key_stride, head_offset);
        prefetch_keys(a, ahead, 0, end - start, 1, lines);
    }
    for (int64_t start = 0; start < seq_len; start += CHUNK) {
        const int c = seq_len - start < CHUNK ? (int)(seq_len - start) : CHUNK;
        chunk_offsets(offset, table, start, start + c, a->block_size, a->key_stride, head_offset);
        /* The chunk PF_DIST ahead: the block table sends it to addresses the hardware
         * prefetcher cannot guess. Its keys are asked for a few per row, spread over this
         * chunk's rows: asked all at once, they queued and stalled the core (README). */
        const int64_t pf_start = start + PF_DIST * CHUNK;
        int64_t pf_keys = 0;
        if (PREFETCH && pf_start < seq_len) {
            pf_keys = seq_len - pf_start < CHUNK ? seq_len - pf_start : CHUNK;
            chunk_offsets(ahead, table, pf_start, pf_start + pf_keys, a->block_size,
                          a->key_stride, head_offset);
            for (int64_t t = 0; t < pf_keys; t++)
                for (int64_t b = 0; b < lines; b++) pf[t * lines + b] = ahead[t] + 16 * b;
        }
        const int64_t pf_lines = pf_keys * lines;
        for (int64_t h = 0; h < a->kv_per_item; h++) {
            for (int t = 0; t < c; t++) {
                kp[t] = a->key_cache + offset[t] + h * head_dim;
                vp[t] = a->value_cache + offset[t] + h * head_dim;
            }
            for (int64_t g = 0; g < a->group; g++) {
                const int64_t r = h * a->group + g;
                const int64_t lo = r * pf_lines / rows, hi = (r + 1) * pf_lines / rows;
                if (c == CHUNK)
                    row_chunk(q + r * head_dim, acc + r * head_dim, &m[r], &l[r], kp, vp, CHUNK,
                              nd, a->key_cache, a->value_cache, pf + lo, hi - lo);
                else
                    row_chunk(q + r * head_dim, acc + r * head_dim, &m[r], &l[r], kp, vp, c, nd,
                              a->key_cache, a->value_cache, pf + lo, hi - lo);
            }
        }
    }
    float *orow = a->out + (seq * a->num_heads + first_head) * head_dim;
    for (int64_t r = 0; r < rows; r++) {
        /* every row saw its own position, whose weight is exp(0)-ish: l >= 1 */
        const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(l[r]));
        for (int64_t j = 0; j < nd; j++)
            _mm512_storeu_ps(orow + r * head_dim + 16 * j,
                             _mm512_mul_ps(_mm512_load_ps(acc + r * head_dim + 16 * j), inv));
    }
}

void paged_attention_decode_c(float *out,                  /* [num_seqs, num_heads, head_dim] */
                              const float *query,          /* [num_seqs, num_heads, head_dim] */
                              const float *key_cache,      /* [blocks, bs, kv_heads, head_dim] */
                              const float *value_cache,    /* the same */
                              const int32_t *block_tables, /* [num_seqs, max_blocks] */
                              const int32_t *seq_lens,     /* [num_seqs] */
                              int64_t num_seqs, int64_t max_blocks, int64_t block_size,
                              int64_t num_kv_heads, int64_t num_heads, int64_t head_dim,
                              float scale, int64_t kv_per_item, int num_threads) {
    const Args a = {query, key_cache, value_cache, out, block_tables, seq_lens, max_blocks,
                    block_size, num_heads, head_dim, num_heads / num_kv_heads, kv_per_item,
                    num_kv_heads * head_dim, scale};
    const int64_t items_per_seq = num_kv_heads / kv_per_item;
    const int64_t rows = kv_per_item * a.group, nd = head_dim / 16;

#pragma omp parallel num_threads(num_threads)
    {
        /* The thread's scratch: the item's queries (pre-scaled) and online-softmax state. */
        float q[rows * head_dim] __attribute__((aligned(64)));
        float acc[rows * head_dim] __attribute__((aligned(64)));
        __m512 m[rows], l[rows];
        int64_t pf[CHUNK * kv_per_item * nd]; /* offsets of the lines to ask for */
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < num_seqs * items_per_seq; item++) {
            const int64_t seq = item / items_per_seq;
            const int64_t first_kv = (item % items_per_seq) * kv_per_item;
            /* head_dim 64 and 128 compiled with nd constant (unrolled, in registers) */
            if (nd == 4)
                attend_item(&a, seq, first_kv, 4, q, acc, m, l, pf);
            else if (nd == 8)
                attend_item(&a, seq, first_kv, 8, q, acc, m, l, pf);
            else
                attend_item(&a, seq, first_kv, nd, q, acc, m, l, pf);
        }
    }
}
