"""LightGBM's single-row fast prediction path, reached through its C API.

Owns one thing: predicting one feature row in a few microseconds. ``Booster.predict`` costs
≈ 35 µs of fixed Python overhead per call (input checks, array allocation); the C API's
``LGBM_BoosterPredictForMatSingleRowFast`` with a config prepared once (``num_threads=1``, so
OpenMP never oversubscribes a shared core) is ≈ 3 µs (research/router.md §2.5). lightgbm's
Python package does not wrap it, so this module calls it through ctypes on the booster's
handle; when the symbol or handle is missing it falls back to ``Booster.predict`` with one
thread, which is slower but gives the same numbers.
"""

from __future__ import annotations

import ctypes
import weakref

import lightgbm as lgb
import numpy as np

__all__ = ["RowPredictor"]

_C_API_PREDICT_NORMAL = 0
_C_API_DTYPE_FLOAT64 = 1


def _lib() -> ctypes.CDLL | None:
    try:
        from lightgbm.basic import _LIB  # private, but the only handle on the loaded library
    except ImportError:  # pragma: no cover - depends on the lightgbm build
        return None
    if not hasattr(_LIB, "LGBM_BoosterPredictForMatSingleRowFast"):
        return None  # pragma: no cover
    return _LIB


def _free_fast_config(lib: ctypes.CDLL, handle: ctypes.c_void_p) -> None:
    lib.LGBM_FastConfigFree(handle)


class RowPredictor:
    """Predicts one float64 row of ``n_features`` values with a booster, on one thread.

    ``row`` is a preallocated input buffer: writing features straight into it (e.g.
    ``FeatureBuilder.row_at(now_s, out=predictor.row)``) and calling ``predict_row()`` avoids
    every per-call allocation and pointer conversion. Not thread-safe (one shared buffer): use
    one predictor per thread or event loop.
    """

    __slots__ = (
        "__weakref__",
        "_args",
        "_booster",
        "_fn",
        "_out",
        "n_features",
        "row",
        "uses_fast_path",
    )

    def __init__(self, booster: lgb.Booster, n_features: int) -> None:
        self._booster = booster  # keeps the booster handle alive as long as the fast config
        self.n_features = n_features
        self.row = np.zeros(n_features, dtype=np.float64)
        self._out = np.zeros(1, dtype=np.float64)
        self._fn = None
        self._args: tuple[object, ...] = ()
        self.uses_fast_path = False
        lib = _lib()
        handle = getattr(booster, "_handle", None)
        if lib is None or not isinstance(handle, ctypes.c_void_p):
            return  # pragma: no cover - fallback for other lightgbm builds
        fast = ctypes.c_void_p()
        rc = lib.LGBM_BoosterPredictForMatSingleRowFastInit(
            handle,
            ctypes.c_int(_C_API_PREDICT_NORMAL),
            ctypes.c_int(0),  # start_iteration
            ctypes.c_int(-1),  # all iterations
            ctypes.c_int(_C_API_DTYPE_FLOAT64),
            ctypes.c_int32(n_features),
            ctypes.c_char_p(b"num_threads=1"),
            ctypes.byref(fast),
        )
        if rc != 0:  # pragma: no cover
            return
        weakref.finalize(self, _free_fast_config, lib, fast)
        out_len = ctypes.c_int64(0)
        # Pointers built once: the buffers never move, and ctypes conversions cost microseconds.
        self._args = (
            fast,
            ctypes.c_void_p(self.row.ctypes.data),
            ctypes.byref(out_len),
            ctypes.c_void_p(self._out.ctypes.data),
            out_len,  # kept alive for the byref above
        )
        self._fn = lib.LGBM_BoosterPredictForMatSingleRowFast
        self.uses_fast_path = True

    def predict_row(self) -> float:
        """Raw model output for the row currently held in ``self.row``."""
        fn = self._fn
        if fn is not None:
            a = self._args
            if fn(a[0], a[1], a[2], a[3]) != 0:
                raise RuntimeError("LightGBM fast single-row predict failed")
            return float(self._out[0])
        out = self._booster.predict(self.row.reshape(1, -1), num_threads=1)
        return float(np.asarray(out).ravel()[0])

    def predict(self, row: np.ndarray) -> float:
        """Raw model output for ``row`` (copied into the preallocated buffer first)."""
        if row.shape != (self.n_features,):
            raise ValueError(f"row must have shape ({self.n_features},), got {row.shape}")
        np.copyto(self.row, row)
        return self.predict_row()
