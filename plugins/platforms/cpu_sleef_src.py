"""C source of SLEEF's ``expf`` (u10, with FMA) on 16 AVX-512 lanes, shared by the C kernels that must give
torch's SiLU bits: :mod:`.cpu_silu` (SiLU-and-mul) and :mod:`.cpu_fused_decode_src` (the fused decode stack).
Torch's ``Vectorized<float>::exp()`` runs this algorithm on AVX-512; both kernels transcribe it operation by
operation, so it lives in one place. Use it inside ``#if defined(__AVX512F__)`` after ``#include <immintrin.h>``.
"""

SLEEF_EXPF16 = r"""
/* SLEEF 3.x xexpf (u10) with FMA, 16 lanes: what torch's Vectorized<float>::exp() runs on AVX-512 */
static inline __m512 sleef_expf16(__m512 d) {
    __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(d, _mm512_set1_ps(1.442695040888963407359924681001892137f)));
    __m512 qf = _mm512_cvtepi32_ps(q);
    __m512 s = _mm512_fmadd_ps(qf, _mm512_set1_ps(-0.693145751953125f), d);
    s = _mm512_fmadd_ps(qf, _mm512_set1_ps(-1.428606765330187045e-06f), s);
    __m512 u = _mm512_set1_ps(0.000198527617612853646278381f);
    u = _mm512_fmadd_ps(u, s, _mm512_set1_ps(0.00139304355252534151077271f));
    u = _mm512_fmadd_ps(u, s, _mm512_set1_ps(0.00833336077630519866943359f));
    u = _mm512_fmadd_ps(u, s, _mm512_set1_ps(0.0416664853692054748535156f));
    u = _mm512_fmadd_ps(u, s, _mm512_set1_ps(0.166666671633720397949219f));
    u = _mm512_fmadd_ps(u, s, _mm512_set1_ps(0.5f));
    u = _mm512_add_ps(_mm512_set1_ps(1.0f), _mm512_fmadd_ps(_mm512_mul_ps(s, s), u, s));
    __m512i h = _mm512_srai_epi32(q, 1);  /* ldexp2k: two power-of-two factors */
    __m512 p1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(h, _mm512_set1_epi32(0x7f)), 23));
    __m512 p2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_sub_epi32(q, h),
                                                                       _mm512_set1_epi32(0x7f)), 23));
    u = _mm512_mul_ps(_mm512_mul_ps(u, p1), p2);
    u = _mm512_mask_mov_ps(u, _mm512_cmp_ps_mask(d, _mm512_set1_ps(-104.f), _CMP_LT_OQ), _mm512_setzero_ps());
    return _mm512_mask_mov_ps(u, _mm512_cmp_ps_mask(_mm512_set1_ps(100.f), d, _CMP_LT_OQ),
                              _mm512_set1_ps(__builtin_inff()));
}
"""
