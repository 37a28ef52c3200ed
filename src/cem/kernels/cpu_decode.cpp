// The CPU decode kernel of CEM attention's query side (cem/kernels/cpu_decode.py): for bf16 ĥ (B, N, D) and the
// K·J queries moved to ĥ's space (B, K·J, D, already scaled by 1/τ),
//
//     out_q = Σ_j softmax_j(ĥ_j · q_q + b_qj) ĥ_j,   b_kij = -m_k (q_start + i - j) + s_k [q_start + i = j], -inf for j > q_start + i
//
// (query q = k·J + i), in one pass over ĥ: blocks of rows, an online softmax, bf16 products with float32
// accumulation (AVX512-BF16 dot products), the logits and the softmax in float32 and the probabilities rounded to
// bf16 for the value product as the two-GEMM form does. Threads split the rows (flash-decoding), merged at the end.
// Built with -mavx512f -mavx512bw -mavx512bf16; called only where the CPU has them (cpu_decode.py decides).

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace {

constexpr int JB = 64;       // rows per block
constexpr int G = 4;         // queries per logits tile (4 rows by 4 queries); the queries are padded to a multiple
constexpr int GV = 12;       // queries per values tile
constexpr int PS = 8;        // row pairs per values sub-block (16 rows stay in L1)
constexpr int PREFETCH = 8;  // rows ahead prefetched (to L3/L2) by the logits tiles
constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

inline __m512 exp512(__m512 x) {  // e^x for x <= 0 (x - max), relative error ~2e-7; -inf -> 0
  const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
  const __m512 ln2hi = _mm512_set1_ps(0.693359375f), ln2lo = _mm512_set1_ps(-2.12194440e-4f);
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, ln2hi, x);
  r = _mm512_fnmadd_ps(n, ln2lo, r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);  // p · 2^n (0 below the float range)
}

inline uint16_t to_bf16(float f) {  // round to nearest even, as PyTorch's float -> bfloat16 (NaN kept a NaN)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

// reduce16(v)[kRed[i]] = Σ_lanes v[i]: 16 horizontal sums at once
inline __m512 reduce16(const __m512* v) {
  __m512 t[8], u[4], w[2];
  for (int i = 0; i < 8; ++i)
    t[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[i], v[i + 8], 0x44), _mm512_shuffle_f32x4(v[i], v[i + 8], 0xEE));
  for (int i = 0; i < 4; ++i)
    u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(t[i], t[i + 4], 0x88), _mm512_shuffle_f32x4(t[i], t[i + 4], 0xDD));
  for (int i = 0; i < 2; ++i)
    w[i] = _mm512_add_ps(_mm512_shuffle_ps(u[i], u[i + 2], 0x44), _mm512_shuffle_ps(u[i], u[i + 2], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], 0x88), _mm512_shuffle_ps(w[0], w[1], 0xDD));
}

struct Maps {  // kRed (above) and kUnpack: acc's column order within 32 columns (see values_tile)
  int red[16], unpack[32];
  Maps() {
    __m512 v[16];
    for (int i = 0; i < 16; ++i) v[i] = _mm512_set1_ps((float)i);
    alignas(64) float o[16];
    _mm512_store_ps(o, reduce16(v));
    for (int e = 0; e < 16; ++e) red[(int)(o[e] / 16.0f + 0.5f)] = e;
    // unpacklo/hi_epi16(row a, row b): 32-bit element e of part t holds column 8 (e / 4) + 4 t + e % 4
    for (int t = 0; t < 2; ++t)
      for (int e = 0; e < 16; ++e) unpack[(e / 4) * 8 + t * 4 + (e % 4)] = t * 16 + e;
  }
};

const Maps& maps() {
  static const Maps m;
  return m;
}

// acc[k][·] += Σ_{p0 <= p < p1} (p_k,2p, p_k,2p+1) · (h_2p[·], h_2p+1[·]) for NQ queries; the rows' pairs are
// interleaved within 128-bit lanes (unpacklo/hi), so acc holds each 32 columns in the kUnpack order
template <int NQ>
inline void values_tile(const uint16_t* h, int64_t row_stride, int64_t nb, int64_t d, int64_t p0, int64_t p1, const uint32_t* pq,
                        float* acc) {
  for (int64_t c = 0; c < d; c += 32) {
    __m512 a[NQ][2];
    for (int k = 0; k < NQ; ++k)
      for (int t = 0; t < 2; ++t) a[k][t] = _mm512_loadu_ps(acc + k * d + c + 16 * t);
    for (int64_t p = p0; p < p1; ++p) {
      const uint16_t* ra = h + 2 * p * row_stride + c;
      __m512i va = _mm512_loadu_si512(ra);
      __m512i vb = 2 * p + 1 < nb ? _mm512_loadu_si512(ra + row_stride) : _mm512_setzero_si512();
      __m512i h0 = _mm512_unpacklo_epi16(va, vb), h1 = _mm512_unpackhi_epi16(va, vb);
      for (int k = 0; k < NQ; ++k) {
        __m512i pv = _mm512_set1_epi32((int)pq[k * (JB / 2) + p]);
        a[k][0] = _mm512_dpbf16_ps(a[k][0], (__m512bh)h0, (__m512bh)pv);
        a[k][1] = _mm512_dpbf16_ps(a[k][1], (__m512bh)h1, (__m512bh)pv);
      }
    }
    for (int k = 0; k < NQ; ++k)
      for (int t = 0; t < 2; ++t) _mm512_storeu_ps(acc + k * d + c + 16 * t, a[k][t]);
  }
}

struct Query {  // the queries and their bias terms
  const uint16_t* q;   // (nq, d), nq a multiple of G (zero rows past the real ones)
  int64_t nq, n_real;  // padded and real count
  int64_t per_head;    // J: query row k·J + i is head k, position q_start + i
  int64_t q_start;
  const float* slopes;  // m_k (K,)
  const float* self_bias;  // s_k (K,)
};

// One range [j_begin, j_end) of rows: the running max m (nq), sum l (nq) and unnormalised acc (nq, d).
void pass_range(const uint16_t* hn, int64_t row_stride, int64_t n, int64_t d, const Query& qs, int64_t j_begin, int64_t j_end,
                float* m, float* l, float* acc) {
  const int* kred = maps().red;
  const int64_t nq = qs.nq, nc = d / 32;
  std::vector<float> s(nq * JB);
  std::vector<uint32_t> pp(nq * (JB / 2));
  std::fill(m, m + nq, NEG_INF);
  std::fill(l, l + nq, 0.0f);
  std::fill(acc, acc + nq * d, 0.0f);
  for (int64_t j0 = j_begin; j0 < j_end; j0 += JB) {
    const int64_t nb = std::min<int64_t>(JB, j_end - j0), np = (nb + 1) / 2;
    // 1. logits s[q][r] = ĥ_j0+r · q: tiles of 4 rows by G queries, the rows PREFETCH ahead prefetched
    int64_t r = 0;
    for (; r + 4 <= nb; r += 4) {
      const uint16_t* h0 = hn + (j0 + r) * row_stride;
      if (j0 + r + PREFETCH + 4 <= n)
        for (int i = 0; i < 4; ++i) {
          const char* line = (const char*)(h0 + (PREFETCH + i) * row_stride);
          for (int64_t o = 0; o < 2 * d; o += 64) _mm_prefetch(line + o, _MM_HINT_T2);
        }
      for (int64_t g = 0; g < nq; g += G) {
        __m512 a[4 * G];
        for (int i = 0; i < 4 * G; ++i) a[i] = _mm512_setzero_ps();
        for (int64_t c = 0; c < nc; ++c) {
          __m512i hv[4];
          for (int i = 0; i < 4; ++i) hv[i] = _mm512_loadu_si512(h0 + i * row_stride + c * 32);
          for (int k = 0; k < G; ++k) {
            __m512i qv = _mm512_loadu_si512(qs.q + (g + k) * d + c * 32);
            for (int i = 0; i < 4; ++i) a[4 * k + i] = _mm512_dpbf16_ps(a[4 * k + i], (__m512bh)hv[i], (__m512bh)qv);
          }
        }
        alignas(64) float red[16];
        _mm512_store_ps(red, reduce16(a));
        for (int k = 0; k < G; ++k)
          for (int i = 0; i < 4; ++i) s[(g + k) * JB + r + i] = red[kred[4 * k + i]];
      }
    }
    for (; r < nb; ++r) {
      const uint16_t* h0 = hn + (j0 + r) * row_stride;
      for (int64_t g = 0; g < nq; g += G) {
        __m512 a[G];
        for (int k = 0; k < G; ++k) a[k] = _mm512_setzero_ps();
        for (int64_t c = 0; c < nc; ++c) {
          __m512i hv = _mm512_loadu_si512(h0 + c * 32);
          for (int k = 0; k < G; ++k)
            a[k] = _mm512_dpbf16_ps(a[k], (__m512bh)hv, (__m512bh)_mm512_loadu_si512(qs.q + (g + k) * d + c * 32));
        }
        for (int k = 0; k < G; ++k) s[(g + k) * JB + r] = _mm512_reduce_add_ps(a[k]);
      }
    }
    // 2. the bias and the online softmax: p = exp(logit - m'), as bf16 pairs (p_j, p_j+1)
    for (int64_t qi = 0; qi < nq; ++qi) {
      float* sq = s.data() + qi * JB;
      uint32_t* pq = pp.data() + qi * (JB / 2);
      float bmax = NEG_INF;
      if (qi < qs.n_real) {
        const int64_t head = qi / qs.per_head, pos = qs.q_start + qi % qs.per_head;
        const float slope = qs.slopes[head], sb = qs.self_bias[head];
        for (int64_t rr = 0; rr < nb; ++rr) {
          const int64_t j = j0 + rr;
          if (j > pos) {
            sq[rr] = NEG_INF;
            continue;
          }
          const float rel = (float)(pos - j);
          float b = -slope * rel;
          b = b + sb * (j == pos ? 1.0f : 0.0f);
          sq[rr] = sq[rr] + b;
          bmax = std::max(bmax, sq[rr]);
        }
      }
      if (bmax == NEG_INF) {  // nothing visible in this block (or a padding query)
        std::fill(pq, pq + np, 0u);
        continue;
      }
      for (int64_t rr = nb; rr < 2 * np; ++rr) sq[rr] = NEG_INF;
      const float mnew = std::max(m[qi], bmax);
      const float alpha = std::exp(m[qi] - mnew);  // 0 for the first visible block
      const __m512 mv = _mm512_set1_ps(mnew);
      alignas(64) float e[JB];
      float sum = 0.0f;
      for (int64_t rr = 0; rr < 2 * np; rr += 16) {
        const int64_t left = 2 * np - rr;
        const __mmask16 mk = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
        const __m512 x = _mm512_mask_loadu_ps(_mm512_set1_ps(NEG_INF), mk, sq + rr);
        const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(NEG_INF), _CMP_NEQ_OQ);
        const __m512 ex = _mm512_maskz_mov_ps(live, exp512(_mm512_sub_ps(x, mv)));
        _mm512_store_ps(e + rr, ex);
        sum += _mm512_reduce_add_ps(ex);
      }
      for (int64_t p = 0; p < np; ++p) pq[p] = (uint32_t)to_bf16(e[2 * p]) | ((uint32_t)to_bf16(e[2 * p + 1]) << 16);
      l[qi] = l[qi] * alpha + sum;
      m[qi] = mnew;
      if (alpha != 1.0f) {
        const __m512 av = _mm512_set1_ps(alpha);
        float* aq = acc + qi * d;
        for (int64_t c = 0; c < d; c += 16) _mm512_storeu_ps(aq + c, _mm512_mul_ps(_mm512_loadu_ps(aq + c), av));
      }
    }
    // 3. values: PS pairs of rows at a time, GV (then G) queries per tile
    const uint16_t* hb = hn + j0 * row_stride;
    for (int64_t p0 = 0; p0 < np; p0 += PS) {
      const int64_t p1 = std::min<int64_t>(np, p0 + PS);
      int64_t g = 0;
      for (; g + GV <= nq; g += GV) values_tile<GV>(hb, row_stride, nb, d, p0, p1, pp.data() + g * (JB / 2), acc + g * d);
      for (; g < nq; g += G) values_tile<G>(hb, row_stride, nb, d, p0, p1, pp.data() + g * (JB / 2), acc + g * d);
    }
  }
}

}  // namespace

// hn (B, N, D) bf16 (unit column stride), q (B, K·J, D) bf16 (scaled by 1/τ), slopes and self_bias (K,) float32 ->
// (B, K·J, D) bf16; D a multiple of 32.
torch::Tensor decode_attention(torch::Tensor hn, torch::Tensor q, torch::Tensor slopes, torch::Tensor self_bias, int64_t q_start) {
  TORCH_CHECK(hn.dim() == 3 && q.dim() == 3 && slopes.dim() == 1 && self_bias.dim() == 1, "decode_attention: hn (B, N, D), q (B, K·J, D), slopes and self_bias (K,)");
  TORCH_CHECK(hn.scalar_type() == at::kBFloat16 && q.scalar_type() == at::kBFloat16, "decode_attention: hn and q in bfloat16");
  TORCH_CHECK(slopes.scalar_type() == at::kFloat && self_bias.scalar_type() == at::kFloat, "decode_attention: slopes and self_bias in float32");
  TORCH_CHECK(hn.stride(2) == 1, "decode_attention: hn's rows must be contiguous");
  const int64_t b = hn.size(0), n = hn.size(1), d = hn.size(2), nq = q.size(1), heads = slopes.size(0);
  TORCH_CHECK(d % 32 == 0 && q.size(0) == b && q.size(2) == d && self_bias.size(0) == heads && heads > 0 && nq % heads == 0 && n >= 1,
              "decode_attention: shapes");
  const int64_t per_head = nq / heads;
  TORCH_CHECK(q_start >= 0 && q_start + per_head <= n, "decode_attention: the queries' positions must be cached");
  const int64_t nqp = (nq + G - 1) / G * G;
  auto qp = torch::zeros({b, nqp, d}, q.options());
  qp.narrow(1, 0, nq).copy_(q);
  auto sl = slopes.contiguous(), sb = self_bias.contiguous();
  auto out = torch::empty({b, nq, d}, q.options());
  // rows split into ranges (whole blocks) over the threads: one range per thread and batch row, merged below
  const int64_t blocks = (n + JB - 1) / JB;
  const int64_t ranges = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), blocks / 4));
  const int64_t per_range = (blocks + ranges - 1) / ranges * JB;
  std::vector<float> m(b * ranges * nqp), l(b * ranges * nqp), acc(b * ranges * nqp * d);
  const uint16_t* hp = reinterpret_cast<const uint16_t*>(hn.data_ptr<at::BFloat16>());
  const uint16_t* qpp = reinterpret_cast<const uint16_t*>(qp.data_ptr<at::BFloat16>());
  at::parallel_for(0, b * ranges, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t i = t / ranges, rg = t % ranges;
      const int64_t j_begin = rg * per_range, j_end = std::min<int64_t>(n, j_begin + per_range);
      Query qs{qpp + i * nqp * d, nqp, nq, per_head, q_start, sl.data_ptr<float>(), sb.data_ptr<float>()};
      if (j_begin >= j_end) {
        std::fill(m.begin() + t * nqp, m.begin() + (t + 1) * nqp, NEG_INF);
        std::fill(l.begin() + t * nqp, l.begin() + (t + 1) * nqp, 0.0f);
        continue;
      }
      pass_range(hp + i * hn.stride(0), hn.stride(1), n, d, qs, j_begin, j_end, m.data() + t * nqp, l.data() + t * nqp,
                 acc.data() + t * nqp * d);
    }
  });
  const int* unpack = maps().unpack;
  uint16_t* op = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  std::vector<float> merged(d), w(ranges);
  for (int64_t i = 0; i < b; ++i)
    for (int64_t qi = 0; qi < nq; ++qi) {
      float mx = NEG_INF, den = 0.0f;
      for (int64_t rg = 0; rg < ranges; ++rg) mx = std::max(mx, m[(i * ranges + rg) * nqp + qi]);
      for (int64_t rg = 0; rg < ranges; ++rg) {
        const float mr = m[(i * ranges + rg) * nqp + qi];
        w[rg] = mr == NEG_INF ? 0.0f : std::exp(mr - mx);
        den += w[rg] * l[(i * ranges + rg) * nqp + qi];
      }
      std::fill(merged.begin(), merged.end(), 0.0f);
      for (int64_t rg = 0; rg < ranges; ++rg) {
        if (w[rg] == 0.0f) continue;
        const float* a = acc.data() + ((i * ranges + rg) * nqp + qi) * d;
        for (int64_t c = 0; c < d; ++c) merged[c] += w[rg] * a[c];
      }
      const float inv = den > 0.0f ? 1.0f / den : 0.0f;
      for (int64_t c = 0; c < d; ++c) op[(i * nq + qi) * d + c] = to_bf16(merged[(c & ~31) + unpack[c & 31]] * inv);
    }
  return out;
}


namespace {

// y[n][r] = w_r · x[n] for rows r0 <= r < r1 of w (row stride ws), NT tokens x[n] (D) at a time; float32 sums
template <int NT>
void dot_rows(const uint16_t* w, int64_t ws, int64_t r0, int64_t r1, int64_t d, const uint16_t* x, int64_t xs, float* y, int64_t ys) {
  const int64_t nc = d / 32;
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) {
    const uint16_t* w0 = w + r * ws;
    if (r + PREFETCH + 4 <= r1)
      for (int i = 0; i < 4; ++i) {
        const char* line = (const char*)(w0 + (PREFETCH + i) * ws);
        for (int64_t o = 0; o < 2 * d; o += 64) _mm_prefetch(line + o, _MM_HINT_T2);
      }
    __m512 a[4 * NT];
    for (int i = 0; i < 4 * NT; ++i) a[i] = _mm512_setzero_ps();
    for (int64_t c = 0; c < nc; ++c) {
      __m512i wv[4];
      for (int i = 0; i < 4; ++i) wv[i] = _mm512_loadu_si512(w0 + i * ws + c * 32);
      for (int n = 0; n < NT; ++n) {
        __m512i xv = _mm512_loadu_si512(x + n * xs + c * 32);
        for (int i = 0; i < 4; ++i) a[4 * n + i] = _mm512_dpbf16_ps(a[4 * n + i], (__m512bh)wv[i], (__m512bh)xv);
      }
    }
    for (int n = 0; n < NT; ++n)
      for (int i = 0; i < 4; ++i) y[n * ys + r + i] = _mm512_reduce_add_ps(a[4 * n + i]);
  }
  for (; r < r1; ++r) {
    __m512 a[NT];
    for (int n = 0; n < NT; ++n) a[n] = _mm512_setzero_ps();
    for (int64_t c = 0; c < nc; ++c) {
      __m512i wv = _mm512_loadu_si512(w + r * ws + c * 32);
      for (int n = 0; n < NT; ++n) a[n] = _mm512_dpbf16_ps(a[n], (__m512bh)wv, (__m512bh)_mm512_loadu_si512(x + n * xs + c * 32));
    }
    for (int n = 0; n < NT; ++n) y[n * ys + r] = _mm512_reduce_add_ps(a[n]);
  }
}

// acc[n][·] += Σ_{r0 <= r < r1} x[n][r] w_r[·] for NT tokens (acc (NT, d) float32 in the kUnpack order of values_tile),
// x[n] given as bf16 pairs px[n][(r - r0) / 2] = (x_r, x_r+1); rows in sub-blocks of 2·PS (in L1), the next prefetched
template <int NT>
void axpy_rows(const uint16_t* w, int64_t ws, int64_t r0, int64_t r1, int64_t d, const uint32_t* px, int64_t pxs, float* acc) {
  const int64_t np = (r1 - r0 + 1) / 2;
  for (int64_t p0 = 0; p0 < np; p0 += PS) {
    const int64_t p1 = std::min<int64_t>(np, p0 + PS);
    const int64_t ahead = r0 + 2 * (p0 + PS);
    if (ahead + 2 * PS <= r1)
      for (int64_t i = 0; i < 2 * PS; ++i) {
        const char* line = (const char*)(w + (ahead + i) * ws);
        for (int64_t o = 0; o < 2 * d; o += 64) _mm_prefetch(line + o, _MM_HINT_T2);
      }
    for (int64_t c = 0; c < d; c += 32) {
      __m512 a[NT][2];
      for (int n = 0; n < NT; ++n)
        for (int t = 0; t < 2; ++t) a[n][t] = _mm512_loadu_ps(acc + n * d + c + 16 * t);
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t ra_row = r0 + 2 * p;
        const uint16_t* ra = w + ra_row * ws + c;
        __m512i va = _mm512_loadu_si512(ra);
        __m512i vb = ra_row + 1 < r1 ? _mm512_loadu_si512(ra + ws) : _mm512_setzero_si512();
        __m512i h0 = _mm512_unpacklo_epi16(va, vb), h1 = _mm512_unpackhi_epi16(va, vb);
        for (int n = 0; n < NT; ++n) {
          __m512i pv = _mm512_set1_epi32((int)px[n * pxs + p]);
          a[n][0] = _mm512_dpbf16_ps(a[n][0], (__m512bh)h0, (__m512bh)pv);
          a[n][1] = _mm512_dpbf16_ps(a[n][1], (__m512bh)h1, (__m512bh)pv);
        }
      }
      for (int n = 0; n < NT; ++n)
        for (int t = 0; t < 2; ++t) _mm512_storeu_ps(acc + n * d + c + 16 * t, a[n][t]);
    }
  }
}

void check_rows(const torch::Tensor& x, const torch::Tensor& w, const char* name) {
  TORCH_CHECK(x.dim() == 3 && w.dim() == 2, name, ": x (N, G, ·), w (R, D)");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && w.scalar_type() == at::kBFloat16, name, ": x and w in bfloat16");
  TORCH_CHECK(w.stride(1) == 1 && w.size(1) % 32 == 0 && w.size(0) % x.size(1) == 0, name, ": w's rows contiguous, D a multiple of 32, G dividing R");
}

}  // namespace

// y[n, g, r] = w[g·R/G + r] · x[n, g]: x (N, G, D), w (R, D) -> (N, G, R/G) bf16 (G = 1: x wᵀ, a linear layer's
// product; G = K: each head's rows with its own vector)
torch::Tensor rows_dot(torch::Tensor x, torch::Tensor w) {
  check_rows(x, w, "rows_dot");
  const int64_t n = x.size(0), g = x.size(1), d = w.size(1), rg = w.size(0) / g;
  TORCH_CHECK(x.size(2) == d, "rows_dot: x's width");
  auto xc = x.contiguous();
  auto y = torch::empty({n, g, rg}, torch::dtype(torch::kFloat));
  const uint16_t* wp = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  const uint16_t* xp = reinterpret_cast<const uint16_t*>(xc.data_ptr<at::BFloat16>());
  float* yp = y.data_ptr<float>();
  const int64_t tiles = (rg + 63) / 64;  // threads take 64 rows of a group at a time
  at::parallel_for(0, g * tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t gi = t / tiles, r0 = (t % tiles) * 64, r1 = std::min<int64_t>(rg, r0 + 64);
      const uint16_t* wg = wp + gi * rg * w.stride(0);
      int64_t i = 0;
      for (; i + 4 <= n; i += 4) dot_rows<4>(wg, w.stride(0), r0, r1, d, xp + (i * g + gi) * d, g * d, yp + (i * g + gi) * rg, g * rg);
      for (; i < n; ++i) dot_rows<1>(wg, w.stride(0), r0, r1, d, xp + (i * g + gi) * d, g * d, yp + (i * g + gi) * rg, g * rg);
    }
  });
  return y.to(torch::kBFloat16);
}

// y[n, g, :] = Σ_r x[n, g, r] w[g·R/G + r]: x (N, G, R/G), w (R, D) -> (N, G, D) bf16 (G = 1: x w, a tied down
// projection; G = K: Σ_r x^k_r W^k_r per head)
torch::Tensor rows_axpy(torch::Tensor x, torch::Tensor w) {
  check_rows(x, w, "rows_axpy");
  const int64_t n = x.size(0), g = x.size(1), d = w.size(1), rg = w.size(0) / g;
  TORCH_CHECK(x.size(2) == rg, "rows_axpy: x's width");
  const int64_t np = (rg + 1) / 2;
  auto xc = x.contiguous();
  std::vector<uint32_t> px(n * g * np);  // x as bf16 pairs (x_r, x_r+1), 0 past the end
  const uint16_t* xp = reinterpret_cast<const uint16_t*>(xc.data_ptr<at::BFloat16>());
  for (int64_t i = 0; i < n * g; ++i)
    for (int64_t p = 0; p < np; ++p)
      px[i * np + p] = (uint32_t)xp[i * rg + 2 * p] | ((uint32_t)(2 * p + 1 < rg ? xp[i * rg + 2 * p + 1] : 0) << 16);
  const uint16_t* wp = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  auto out = torch::empty({n, g, d}, x.options());
  uint16_t* op = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  const int* unpack = maps().unpack;
  at::parallel_for(0, g, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> acc(4 * d);
    std::vector<uint32_t> pxt(4 * np);
    for (int64_t gi = begin; gi < end; ++gi) {
      const uint16_t* wg = wp + gi * rg * w.stride(0);
      for (int64_t i = 0; i < n; i += 4) {
        const int nt = (int)std::min<int64_t>(4, n - i);
        for (int k = 0; k < nt; ++k) std::copy_n(px.data() + ((i + k) * g + gi) * np, np, pxt.data() + k * np);
        std::fill(acc.begin(), acc.end(), 0.0f);
        if (nt == 4) axpy_rows<4>(wg, w.stride(0), 0, rg, d, pxt.data(), np, acc.data());
        else
          for (int k = 0; k < nt; ++k) axpy_rows<1>(wg, w.stride(0), 0, rg, d, pxt.data() + k * np, np, acc.data() + k * d);
        for (int k = 0; k < nt; ++k)
          for (int64_t c = 0; c < d; ++c) op[((i + k) * g + gi) * d + c] = to_bf16(acc[k * d + (c & ~31) + unpack[c & 31]]);
      }
    }
  });
  return out;
}

// an operator of its own (torch.ops.cem_cpu_decode.decode_attention): the profiler records it with its shapes
TORCH_LIBRARY(cem_cpu_decode, m) {
  m.def("decode_attention(Tensor hn, Tensor q, Tensor slopes, Tensor self_bias, int q_start) -> Tensor");
  m.def("rows_dot(Tensor x, Tensor w) -> Tensor");
  m.def("rows_axpy(Tensor x, Tensor w) -> Tensor");
}

TORCH_LIBRARY_IMPL(cem_cpu_decode, CPU, m) {
  m.impl("decode_attention", &decode_attention);
  m.impl("rows_dot", &rows_dot);
  m.impl("rows_axpy", &rows_axpy);
}
