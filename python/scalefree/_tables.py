"""Tables as users hold them, as numpy columns without a copy where one is not needed: the
one helper every Python entry point that takes data (``graph.pagerank``,
``SparsePageRank``, ``mf.MatrixFactorization.fit``, ``mf.split_ratings``, ``mf.load_ratings``)
passes its input through.

Accepted, besides the tuples of arrays the entry points always took:

* a pandas ``DataFrame``: numpy-backed columns are viewed (``Series.to_numpy(copy=False)``);
* a pyarrow ``Table`` / ``RecordBatch``, a polars ``DataFrame`` and any object that exports
  the Arrow C data interface (``__arrow_c_stream__`` / ``__arrow_c_array__`` PyCapsules):
  imported with pyarrow (``pa.table``, no copy), each column viewed as numpy when it is one
  chunk (``to_numpy(zero_copy_only=True)``), else its chunks joined once;
* a 2-D numpy array: its columns, viewed;
* a scipy sparse matrix: its coordinates (row, column, value), as COO (viewed if it is COO).

Columns are chosen by name (``columns=["src", "dst"]``) or default to the first two integer
columns (and for ratings the first numeric column after them), as the Parquet readers do.
Nulls and non-numeric columns raise :class:`~scalefree.errors.InvalidArgumentError`.
"""

from __future__ import annotations

import numpy as np

from .errors import InvalidArgumentError

ID, NUMBER = "id", "number"


def is_table(data) -> bool:
    """Whether ``data`` is one of the table forms above (not a tuple of arrays or a path)."""
    if isinstance(data, np.ndarray):
        return data.ndim == 2
    if _is_sparse(data) or _is_pandas(data):
        return True
    return hasattr(data, "__arrow_c_stream__") or hasattr(data, "__arrow_c_array__") or _is_pyarrow(data)


def _is_sparse(data) -> bool:
    try:
        import scipy.sparse as sp
    except ImportError:
        return False
    return sp.issparse(data)


def _is_pandas(data) -> bool:
    return type(data).__module__.split(".")[0] == "pandas" and hasattr(data, "columns") and hasattr(data, "dtypes")


def _is_pyarrow(data) -> bool:
    return type(data).__module__.split(".")[0] == "pyarrow" and hasattr(data, "column_names")


def _choose(names: list[str], kinds_of: dict, want: tuple[str, ...], columns, what: str) -> list[str]:
    """The column names to read: ``columns`` checked, or the default rule."""
    if columns is not None:
        columns = list(columns)
        if len(columns) != len(want):
            raise InvalidArgumentError(f"{what}: expected {len(want)} column names, got {columns}")
        for name, k in zip(columns, want):
            if name not in kinds_of:
                raise InvalidArgumentError(f"{what}: no column {name!r} (columns: {', '.join(map(str, names))})")
            if kinds_of[name] is None or (k == ID and kinds_of[name] != ID):
                raise InvalidArgumentError(f"{what}: column {name!r} is not {'an integer' if k == ID else 'a numeric'} column")
        return columns
    ints = [n for n in names if kinds_of[n] == ID][:2]
    if len(ints) < 2:
        raise InvalidArgumentError(f"{what}: expected two integer id columns, found columns {list(names)} (choose them with columns=)")
    out = list(ints)
    if len(want) == 3:
        after = names[names.index(ints[1]) + 1:]
        num = [n for n in after if kinds_of[n] is not None]
        if not num:
            raise InvalidArgumentError(f"{what}: expected a numeric rating column after {ints}, found columns {list(names)}")
        out.append(num[0])
    return out


def _np_kind(dtype) -> str | None:
    kind = np.dtype(dtype).kind if isinstance(dtype, np.dtype) else getattr(dtype, "kind", None)
    return ID if kind in ("i", "u") else NUMBER if kind == "f" else None


def _check(name, a: np.ndarray, what: str) -> np.ndarray:
    if a.dtype.kind == "f" and np.isnan(a).any():
        raise InvalidArgumentError(f"{what}: column {name!r} has nulls / NaN")
    return a


def table_columns(data, want: tuple[str, ...], columns=None, what: str = "data") -> list[np.ndarray]:
    """The columns of the table ``data`` (:func:`is_table`), as numpy arrays, views where the
    memory allows. ``want``: ``(ID, ID)`` for edges, ``(ID, ID, NUMBER)`` for ratings."""
    if isinstance(data, np.ndarray):
        if data.ndim != 2 or data.shape[1] < len(want):
            raise InvalidArgumentError(f"{what}: a 2-D array needs at least {len(want)} columns, got shape {data.shape}")
        if want[0] == ID and data.dtype.kind not in "iu" and len(want) == 2:
            raise InvalidArgumentError(f"{what}: an edge array must hold integer ids, got {data.dtype}")
        return [data[:, k] for k in range(len(want))]
    if _is_sparse(data):
        coo = data if data.format == "coo" else data.tocoo()
        out = [coo.row, coo.col]
        return out + [coo.data] if len(want) == 3 else out
    if _is_pandas(data):
        names = list(data.columns)
        kinds = {n: _np_kind(data[n].dtype) for n in names}
        chosen = _choose(names, kinds, want, columns, what)
        out = []
        for n in chosen:
            s = data[n]
            if s.isna().any():
                raise InvalidArgumentError(f"{what}: column {n!r} has nulls")
            out.append(s.to_numpy(copy=False) if isinstance(s.dtype, np.dtype) else s.to_numpy(dtype=s.dtype.numpy_dtype))
        return out
    try:
        import pyarrow as pa
    except ImportError:
        raise InvalidArgumentError(f"{what}: reading an Arrow table ({type(data).__name__}) needs pyarrow "
                                   "(pip install pyarrow), or pass numpy arrays") from None
    if isinstance(data, pa.RecordBatch):
        table = pa.Table.from_batches([data])
    elif isinstance(data, pa.Table):
        table = data
    elif hasattr(data, "__arrow_c_stream__"):
        table = pa.table(data)
    else:
        table = pa.Table.from_batches([pa.record_batch(data)])
    names = table.column_names

    def kind(t):
        return ID if pa.types.is_integer(t) else NUMBER if pa.types.is_floating(t) else None

    kinds = {n: kind(table.schema.field(n).type) for n in names}
    out = []
    for n in _choose(names, kinds, want, columns, what):
        col = table.column(n)
        if col.null_count:
            raise InvalidArgumentError(f"{what}: column {n!r} has {col.null_count} nulls")
        chunks = [c.to_numpy(zero_copy_only=True) for c in col.chunks]
        out.append(_check(n, chunks[0] if len(chunks) == 1 else np.concatenate(chunks) if chunks else
                          np.zeros(0, col.type.to_pandas_dtype()), what))
    return out
