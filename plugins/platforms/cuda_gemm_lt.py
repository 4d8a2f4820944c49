"""cuBLASLt called directly (ctypes), so a projection can run an algorithm other than the heuristic's first (issue 17).

Why: torch runs ``F.linear`` through cuBLAS (or, with ``preferred_blas_library("cublaslt")``, cuBLASLt's first
heuristic result). At the 8B run's 200-272-row decode steps those picks sit at 0.70-0.80 of the byte/FLOP roofline
and vary by 10-20 % between neighbouring row counts (docs/performance.md, sessions 9-10); cuBLASLt's heuristic
returns more candidates (other tiles, K splits, stage counts) that may run faster for one shape and row count.
This module asks for them, describes each by its configuration attributes (algorithm id, tile, K split, reduction,
swizzle, custom option, stages, inner and cluster shapes: :func:`describe`), and runs one. Nothing here picks:
``benchmarks/gemm_lt_bench.py`` measures the candidates; a table of measured picks keys on those attributes,
so a pick is found again in the heuristic's list of the same library and card, or not used.

``y[M, N] = x[M, K] @ w[N, K]^T`` as torch's cuBLAS call does it (column-major ``y^T = op_T(w) x^T``), bf16/fp16
in and out, fp32 compute and scale. Reduction schemes are limited to ones without in-place atomics
(``REDUCTION_MASK``), so every algorithm returned gives the same bits on every run.
"""

from __future__ import annotations

import ctypes
import glob
import os

CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF = 0, 2, 14
CUBLAS_COMPUTE_32F = 68
DESC_TRANSA, DESC_TRANSB = 3, 4
OP_N, OP_T = 0, 1
PREF_MAX_WORKSPACE_BYTES, PREF_REDUCTION_SCHEME_MASK = 1, 3
REDUCTION_MASK = 0x6  # COMPUTE_TYPE | OUTPUT_TYPE (NONE always allowed); not INPLACE (output-buffer atomics)
#: cublasLtMatmulAlgoConfigAttributes_t: name -> (id, ctypes type)
CONFIG = {"algo": (0, ctypes.c_int32), "tile": (1, ctypes.c_uint32), "splitk": (2, ctypes.c_uint32),
          "reduction": (3, ctypes.c_uint32), "swizzle": (4, ctypes.c_uint32), "custom": (5, ctypes.c_uint32),
          "stages": (6, ctypes.c_uint32), "inner": (7, ctypes.c_uint16), "cluster": (8, ctypes.c_uint16)}
WORKSPACE_BYTES = 32 << 20

_Algo = ctypes.c_uint64 * 8


class _Heuristic(ctypes.Structure):
    _fields_ = [("algo", _Algo), ("workspaceSize", ctypes.c_size_t), ("state", ctypes.c_int),
                ("wavesCount", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


_LIB: dict = {}


def library():
    """libcublasLt (the one torch loaded: same soname), with argument types set; raises OSError if absent."""
    if "lib" in _LIB:
        return _LIB["lib"]
    import torch  # noqa: F401 - loads torch's CUDA libraries first, so the soname resolves to torch's copy

    names = ["libcublasLt.so.13", "libcublasLt.so.12"]
    for d in [os.path.join(p, "lib") for p in _nvidia_dirs()]:
        names += sorted(glob.glob(os.path.join(d, "libcublasLt.so*")))
    err = None
    for name in names:
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError as e:
            err = e
    else:
        raise OSError(f"libcublasLt not found ({err})")
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    lib.cublasLtCreate.argtypes = [ctypes.POINTER(vp)]
    lib.cublasLtMatmulDescCreate.argtypes = [ctypes.POINTER(vp), ctypes.c_int, ctypes.c_int]
    lib.cublasLtMatmulDescSetAttribute.argtypes = [vp, ctypes.c_int, vp, sz]
    lib.cublasLtMatrixLayoutCreate.argtypes = [ctypes.POINTER(vp), ctypes.c_int, ctypes.c_uint64,
                                               ctypes.c_uint64, ctypes.c_int64]
    lib.cublasLtMatmulPreferenceCreate.argtypes = [ctypes.POINTER(vp)]
    lib.cublasLtMatmulPreferenceSetAttribute.argtypes = [vp, ctypes.c_int, vp, sz]
    lib.cublasLtMatmulAlgoGetHeuristic.argtypes = [vp, vp, vp, vp, vp, vp, vp, ctypes.c_int,
                                                   ctypes.POINTER(_Heuristic), ctypes.POINTER(ctypes.c_int)]
    lib.cublasLtMatmulAlgoConfigGetAttribute.argtypes = [ctypes.POINTER(_Algo), ctypes.c_int, vp, sz,
                                                         ctypes.POINTER(sz)]
    lib.cublasLtMatmul.argtypes = [vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, ctypes.POINTER(_Algo), vp, sz,
                                   vp]
    if hasattr(lib, "cublasLtGetVersion"):
        lib.cublasLtGetVersion.restype = ctypes.c_size_t
    _LIB["lib"] = lib
    return lib


def _nvidia_dirs() -> list[str]:
    try:
        import nvidia  # the wheels' namespace package (nvidia/cublas, nvidia/cu13)

        return [os.path.join(p, sub) for p in nvidia.__path__ for sub in ("cublas", "cu13", "cu12")]
    except ImportError:
        return []


def _ok(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"cuBLASLt {what}: status {status}")


def describe(algo) -> dict:
    """The configuration attributes of one algorithm (:data:`CONFIG`)."""
    lib = library()
    out = {}
    for name, (attr, ctype) in CONFIG.items():
        v, n = ctype(0), ctypes.c_size_t(0)
        st = lib.cublasLtMatmulAlgoConfigGetAttribute(ctypes.byref(algo), attr, ctypes.byref(v), ctypes.sizeof(v),
                                                      ctypes.byref(n))
        out[name] = int(v.value) if st == 0 else None  # (an attribute this library does not know)
    return out


class LtGemm:
    """One cuBLASLt handle, a workspace and cached descriptors on the current CUDA device."""

    def __init__(self) -> None:
        import torch

        self.lib = library()
        self.handle = ctypes.c_void_p()
        _ok(self.lib.cublasLtCreate(ctypes.byref(self.handle)), "create")
        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
        self.alpha, self.beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
        self._descs: dict = {}
        self._layouts: dict = {}
        self.pref = ctypes.c_void_p()
        _ok(self.lib.cublasLtMatmulPreferenceCreate(ctypes.byref(self.pref)), "preference")
        ws, mask = ctypes.c_uint64(WORKSPACE_BYTES), ctypes.c_uint32(REDUCTION_MASK)
        _ok(self.lib.cublasLtMatmulPreferenceSetAttribute(self.pref, PREF_MAX_WORKSPACE_BYTES, ctypes.byref(ws),
                                                          8), "workspace preference")
        _ok(self.lib.cublasLtMatmulPreferenceSetAttribute(self.pref, PREF_REDUCTION_SCHEME_MASK,
                                                          ctypes.byref(mask), 4), "reduction preference")

    def _desc(self, dtype):
        d = self._descs.get(dtype)
        if d is None:
            d = ctypes.c_void_p()
            _ok(self.lib.cublasLtMatmulDescCreate(ctypes.byref(d), CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc")
            t, n = ctypes.c_int32(OP_T), ctypes.c_int32(OP_N)
            _ok(self.lib.cublasLtMatmulDescSetAttribute(d, DESC_TRANSA, ctypes.byref(t), 4), "transa")
            _ok(self.lib.cublasLtMatmulDescSetAttribute(d, DESC_TRANSB, ctypes.byref(n), 4), "transb")
            self._descs[dtype] = d
        return d

    def _layout(self, rows: int, cols: int, ld: int, cuda_type: int):
        key = (rows, cols, ld, cuda_type)
        lay = self._layouts.get(key)
        if lay is None:
            lay = ctypes.c_void_p()
            _ok(self.lib.cublasLtMatrixLayoutCreate(ctypes.byref(lay), cuda_type, rows, cols, ld), "layout")
            self._layouts[key] = lay
        return lay

    def _operands(self, M: int, N: int, K: int, dtype, ld_w: int, ld_x: int, ld_y: int):
        import torch

        ct = {torch.bfloat16: CUDA_R_16BF, torch.float16: CUDA_R_16F}[dtype]
        # column-major: w [N, K] row-major = [K, N] (op T); x [M, K] = [K, M]; y [M, N] = [N, M]; lds = row strides
        return (self._desc(dtype), self._layout(K, N, ld_w, ct), self._layout(K, M, ld_x, ct),
                self._layout(N, M, ld_y, ct))

    def algos(self, M: int, N: int, K: int, dtype, count: int = 16) -> list[tuple]:
        """The heuristic's candidates for ``M`` rows of an ``[N, K]`` weight (contiguous operands): ``(algo,
        workspace bytes, waves)``, in the heuristic's order (index 0 = its pick)."""
        desc, a, b, c = self._operands(M, N, K, dtype, K, K, N)
        res = (_Heuristic * count)()
        got = ctypes.c_int(0)
        _ok(self.lib.cublasLtMatmulAlgoGetHeuristic(self.handle, desc, a, b, c, c, self.pref, count, res,
                                                    ctypes.byref(got)), "heuristic")
        return [(_Algo(*r.algo), int(r.workspaceSize), float(r.wavesCount)) for r in res[:got.value]
                if r.state == 0 and r.workspaceSize <= WORKSPACE_BYTES]

    def matmul(self, x, weight, algo, out=None):
        """``F.linear(x, weight)`` with ``algo`` on the current stream (capturable: the workspace is fixed)."""
        import torch

        M, K = x.shape
        N = weight.shape[0]
        if x.stride(1) != 1 or weight.stride(1) != 1 or weight.shape[1] != K:
            raise ValueError(f"LtGemm: x {tuple(x.shape)} / weight {tuple(weight.shape)} need unit column strides")
        if out is None:
            out = torch.empty(M, N, dtype=x.dtype, device=x.device)
        desc, a, b, c = self._operands(M, N, K, x.dtype, weight.stride(0), x.stride(0), out.stride(0))
        stream = torch.cuda.current_stream().cuda_stream
        _ok(self.lib.cublasLtMatmul(self.handle, desc, ctypes.byref(self.alpha), weight.data_ptr(), a,
                                    x.data_ptr(), b, ctypes.byref(self.beta), out.data_ptr(), c, out.data_ptr(), c,
                                    ctypes.byref(algo), self.workspace.data_ptr(), WORKSPACE_BYTES, stream),
            "matmul")
        return out


#: (device name, N, K) of the weight -> {rows: config}: a launch of exactly that many rows (the graph batch sizes
#: and the prefill chunk measured; other counts are not: the heuristic's list changes with the rows) runs the
#: candidate with ``describe``'s attributes ``config`` (measured fastest by ``benchmarks/gemm_lt_bench.py`` on that
#: card) if this library's heuristic offers it for the shape and row count, else cuBLAS (logged once); not listed:
#: ``cuda_gemm``'s other routes.
#: Session 12 batch 1 (H100 80GB HBM3, one lane of a 4x H100 call beside three busy ones, cuBLASLt 13.1.0, records
#: benchmarks/results/gemm_lt_s12b1_h100.json; ``benchmarks/gemm_lt_table.py --margin 0.03``): every
#: candidate of the 8B projections at the graph sizes the paced 512 x 1000/1000 run uses most (272: 257-272 rows,
#: ~935 of its 2,639 steps; 256-208) and at a prefill chunk's 8,192 rows, taken where it beat cuBLAS by >= 3 % in the
#: same chain (us cuBLAS -> candidate in the comments). An early check (21:24, one H100, the same engine alternating,
#: 272 x 1000/100): off -> on, 34 steps of 8,192 tokens 6.741 / 6.713 -> 6.650 / 6.658 s GPU, 79 decode steps at
#: graph size 272 1.587 / 1.590 -> 1.572 / 1.573 s (-1 %: less than the chains' sums). The qkv chunk pick is not
#: offered at 7,937 rows, so picks apply only at the row count measured. The ramp's 104-200 rows: the lead's extra
#: call s12b1y (one H100, 21:38, benchmarks/results/gemm_lt_s12b1y_h100.json), same rule; not yet run in an engine.
_C = dict(algo=66, splitk=1, reduction=0, swizzle=0, stages=35, inner=0)  # (attributes all picks share but these)
_CHUNK = 8192  # a full prefill step (max_num_batched_tokens of the 8B benchmark)
LT_TABLE: dict[tuple[str, int, int], dict[int, dict]] = {
    ("NVIDIA H100 80GB HBM3", 6144, 4096): {  # qkv_proj
        176: dict(_C, tile=328, custom=1, cluster=4),  # 25.50 -> 22.80 (s12b1y)
        208: dict(_C, tile=165, custom=2, cluster=7),  # 25.01 -> 24.04
        216: dict(_C, tile=165, custom=2, cluster=7),  # 25.60 -> 24.10
        224: dict(_C, tile=165, custom=2, cluster=7),  # 27.74 -> 24.27
        232: dict(_C, tile=165, custom=2, cluster=7),  # 26.33 -> 24.23
        _CHUNK: dict(_C, tile=201, custom=2, cluster=5),  # 615.4 -> 532.2
    },
    ("NVIDIA H100 80GB HBM3", 4096, 4096): {  # o_proj
        216: dict(_C, tile=398, custom=3, cluster=5),  # 18.57 -> 18.01
        232: dict(_C, tile=183, custom=2, cluster=9),  # 19.52 -> 17.95
        248: dict(_C, tile=183, custom=2, cluster=9),  # 18.91 -> 18.05
        256: dict(_C, tile=183, custom=2, cluster=9),  # 19.67 -> 18.08
        _CHUNK: dict(_C, tile=24, custom=7, cluster=5),  # 378.2 -> 360.2
    },
    ("NVIDIA H100 80GB HBM3", 28672, 4096): {  # gate_up_proj (at 208-272 no candidate beat cuBLAS by 3 %)
        104: dict(_C, tile=491, custom=3, cluster=5),  # 90.39 -> 86.61 (s12b1y)
        112: dict(_C, tile=21, custom=3, cluster=5),  # 90.91 -> 87.02
        120: dict(_C, tile=404, custom=1, cluster=3),  # 92.34 -> 88.16
        136: dict(_C, tile=493, custom=3, cluster=5),  # 93.36 -> 89.01
        144: dict(_C, tile=493, custom=3, cluster=5),  # 93.35 -> 89.23
        152: dict(_C, tile=493, custom=3, cluster=5),  # 94.46 -> 89.70
        160: dict(_C, tile=29, custom=1, cluster=3),  # 94.56 -> 91.41
        _CHUNK: dict(_C, tile=201, custom=2, cluster=5),  # 2,761 -> 2,573
    },
    ("NVIDIA H100 80GB HBM3", 4096, 14336): {  # down_proj
        104: dict(_C, tile=316, custom=3, cluster=5),  # 49.96 -> 44.37 (s12b1y)
        112: dict(_C, tile=15, custom=1, cluster=3),  # 49.80 -> 47.10
        120: dict(_C, tile=15, custom=1, cluster=3),  # 49.77 -> 44.64
        128: dict(_C, tile=15, custom=1, cluster=3),  # 53.09 -> 44.61
        136: dict(_C, tile=317, custom=1, cluster=3),  # 51.72 -> 45.33
        152: dict(_C, tile=318, custom=1, cluster=3),  # 52.83 -> 46.06
        168: dict(_C, tile=319, custom=1, cluster=3),  # 53.25 -> 50.47
        224: dict(_C, tile=20, splitk=2, reduction=2, custom=1, cluster=3),  # 60.62 -> 57.85
        232: dict(_C, tile=404, splitk=2, reduction=2, custom=3, cluster=5),  # 60.60 -> 58.14
        256: dict(_C, tile=135, custom=2, cluster=7),  # 58.54 -> 53.67
        272: dict(_C, tile=406, splitk=2, reduction=2, custom=1, cluster=3),  # 70.86 -> 60.75
        _CHUNK: dict(_C, tile=24, custom=7, cluster=5),  # 1,358 -> 1,302
    },
}
COUNT = 16  # heuristic candidates searched for a tabled config (the bench's --count)
_RUN: dict = {"gemm": {}, "found": {}, "name": {}, "keys": {}}


def _device_name() -> str:
    import torch

    index = torch.cuda.current_device()
    if index not in _RUN["name"]:
        _RUN["name"][index] = torch.cuda.get_device_name(index)
    return _RUN["name"][index]


def pick(M: int, N: int, K: int) -> dict | None:
    """:data:`LT_TABLE`'s config for ``M`` rows of an ``[N, K]`` weight on this card, or None."""
    shapes = _RUN.get("shapes")
    if shapes is None or shapes[0] is not LT_TABLE:  # (N, K) listed for any card: most calls stop here
        shapes = _RUN["shapes"] = (LT_TABLE, {(n, k) for _, n, k in LT_TABLE})
    if (N, K) not in shapes[1]:
        return None
    sizes = LT_TABLE.get((_device_name(), N, K))
    if not sizes:
        return None
    return sizes.get(M)


def config_key(cfg: dict) -> tuple:
    """A hashable name of ``cfg`` (cached by identity: table configs are constants)."""
    key = _RUN["keys"].get(id(cfg))
    if key is None or key[0] is not cfg:
        key = _RUN["keys"][id(cfg)] = (cfg, tuple(sorted(cfg.items())))
    return key[1]


def _gemm() -> LtGemm:
    import torch

    index = torch.cuda.current_device()
    if index not in _RUN["gemm"]:
        _RUN["gemm"][index] = LtGemm()
    return _RUN["gemm"][index]


def find(M: int, N: int, K: int, dtype, cfg: dict):
    """The heuristic's candidate with the attributes ``cfg`` for this shape and row count (cached), or None."""
    key = (_device_name(), M, N, K, dtype, config_key(cfg))
    if key not in _RUN["found"]:
        algo = None
        for cand, _ws, _waves in _gemm().algos(M, N, K, dtype, COUNT):
            if describe(cand) == cfg:
                algo = cand
                break
        said = _RUN.setdefault("said", set())
        if algo is None and (N, K, config_key(cfg)) not in said:  # (once per pick)
            import logging

            said.add((N, K, config_key(cfg)))
            logging.getLogger(__name__).warning("cuBLASLt offers no candidate %s for [%d, %d] weights at %d rows "
                                                "here: cuBLAS runs it (and any other row count it lacks)", cfg, N, K, M)
        _RUN["found"][key] = algo
    return _RUN["found"][key]


def usable(x, weight, cfg: dict):
    """The tabled candidate ``cfg`` for this call, or None (the caller's route): not offered here, or operands it
    was not chosen for (row strides other than K, bases not 256-byte aligned: the heuristic's default assumptions;
    the output is a fresh, aligned allocation)."""
    M, K = x.shape
    N = weight.shape[0]
    if x.stride(0) != K or weight.stride(0) != K or x.data_ptr() % 256 or weight.data_ptr() % 256:
        return None
    import torch

    if torch.cuda.current_device() not in _RUN["gemm"] and torch.cuda.is_current_stream_capturing():
        return None  # (its workspace is allocated outside a capture: the eager first use comes first)
    if _RUN.get("broken"):
        return None
    try:
        return find(M, N, K, x.dtype, cfg)
    except (OSError, RuntimeError) as e:  # no libcublasLt, or a call it refuses: cuBLAS from now on, said once
        import logging

        _RUN["broken"] = True
        logging.getLogger(__name__).warning("cuBLASLt picks not used: %s", e)
        return None


def linear(x, weight, algo):
    """``F.linear(x, weight)`` with ``algo`` (from :func:`usable`)."""
    return _gemm().matmul(x, weight, algo)
