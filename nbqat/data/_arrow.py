"""The pyarrow side of the loader: reading a CSV / Parquet file, and its columns as NumPy.

A CSV file is read by pyarrow's multithreaded reader in blocks of :data:`_BLOCK_BYTES`: the
numeric columns parsed straight to float64, the entity column dictionary-encoded (so the
entities are factorised on the small dictionary, not on every row). The columns are then
handed out one at a time (:class:`ArrowColumns`) and dropped from the table as they are
consumed, so their buffers are freed as the loader goes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["ArrowColumns", "read_table"]

#: Block size of the CSV read (blocks are parsed in parallel; the column types not forced
#: are inferred from the first block).
_BLOCK_BYTES = 1 << 20

#: The null spelling of the first CSV read (a missing cell, as ``DataFrame.to_csv`` writes NaN).
_EMPTY = ""


def read_table(
    path: Path,
    cols: list[str],
    entity_col: str | None,
    parquet: bool,
    numeric: list[str],
    time_col: str | None = None,
) -> Any:
    """The needed columns of a CSV / Parquet file (pyarrow; pandas' C parser without it).

    CSV: pyarrow's multithreaded reader with the ``numeric`` columns parsed straight to
    float64 (empty cells as nulls) and the entity column as ``dictionary<int32, string>``, its
    buffers from the system allocator and handed back to the OS right after the read
    (:func:`_return_freed_memory`), so the peak is the parse, not the parse plus what
    follows. A file with pyarrow's other null spellings (``"NA"``, ...) in the ``numeric`` or
    ``time_col`` columns is read again with them as nulls, and one whose ``numeric`` columns
    do not all parse as numbers with inferred types, so that the checks that follow can name
    the line of the missing or bad value.
    """
    try:
        import pyarrow as pa
        import pyarrow.csv as pacsv
    except ImportError:  # pragma: no cover - pyarrow is a declared dependency
        import pandas as pd

        if parquet:
            return pd.read_parquet(path, columns=cols)
        dtype = {entity_col: str} if entity_col else None
        return pd.read_csv(path, usecols=cols, dtype=dtype, dtype_backend="numpy_nullable")
    if parquet:
        import pyarrow.parquet as pq

        return ArrowColumns(pq.read_table(path, columns=cols))
    types = {entity_col: pa.dictionary(pa.int32(), pa.string())} if entity_col else {}
    pool = pa.system_memory_pool()
    opts = pacsv.ReadOptions(block_size=_BLOCK_BYTES)

    def read(column_types: dict | None, **kw: Any) -> Any:
        conv = pacsv.ConvertOptions(include_columns=cols, column_types=column_types, **kw)
        return pacsv.read_csv(path, opts, convert_options=conv, memory_pool=pool)

    typed = {**types, **dict.fromkeys(numeric, pa.float64())}
    table = None
    try:
        # First with one null spelling, the empty cell (matching every cell against all of
        # pyarrow's spellings costs about a tenth of the read): "NaN" parses as NaN, which
        # the checks treat as missing, and another spelling ("NA", ...) in a float64 column
        # fails the read; a time column read as text holding one is read again, as below.
        table = read(typed, null_values=[_EMPTY])
        if time_col is not None and _has_null_spelling(table.column(time_col)):
            table = None
    except pa.ArrowInvalid:
        pass
    if table is None:
        try:  # every null spelling of pyarrow's as a missing cell
            table = read(typed)
        except pa.ArrowInvalid:
            # A value that is not a number (or a time zone mix, a short row): inferred
            # types, so the checks that follow can name the line.
            table = read(types or None)
    _return_freed_memory()
    return ArrowColumns(table)


def _has_null_spelling(column: Any) -> bool:
    """Whether a text column holds one of pyarrow's null spellings other than the empty cell
    (``"NA"``, ``"null"``, ...)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv
    import pyarrow.types as pat

    if not (pat.is_string(column.type) or pat.is_large_string(column.type)):
        return False
    others = [v for v in pacsv.ConvertOptions().null_values if v != _EMPTY]
    spellings = pa.array(others, type=column.type)
    return bool(pc.any(pc.is_in(column, value_set=spellings)).as_py())


def _return_freed_memory() -> None:
    """glibc's ``malloc_trim(0)``: give the reader's freed parse buffers back to the OS (a
    no-op where the C library has no such call)."""
    import ctypes

    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError, TypeError):
        pass


class ArrowColumns:
    """A pyarrow Table seen column by column: as pandas Series (:meth:`__getitem__`), as
    NumPy views of its chunks (:meth:`numeric_chunks`) or as entity codes
    (:meth:`entity_codes`); each column is dropped from the table once handed out, so its
    buffers are freed as soon as the caller lets go of them."""

    def __init__(self, table: Any) -> None:
        self.table = table

    def __len__(self) -> int:
        return int(self.table.num_rows)

    def _take(self, col: str) -> Any:
        column = self.table.column(col)
        self.table = self.table.drop_columns([col])
        return column

    def __getitem__(self, col: str) -> Any:
        return self._take(col).to_pandas()

    def numeric_chunks(self, col: str) -> list[np.ndarray] | None:
        """The chunks of a numeric column with no nulls, as read-only NumPy views of the
        Arrow buffers (no copy); ``None`` (the column kept) when the column is not of that
        kind, so the caller takes the checked path through :meth:`__getitem__`."""
        import pyarrow.types as pat

        column = self.table.column(col)
        kind = column.type
        if column.null_count or not (pat.is_floating(kind) or pat.is_integer(kind)):
            return None
        self._take(col)
        return [c.to_numpy(zero_copy_only=False) for c in column.chunks if len(c)]

    def entity_codes(self, col: str) -> tuple[np.ndarray, list[str]] | None:
        """``(codes, names)`` of a string entity column with no nulls: int32 codes numbering
        the entities in order of first appearance, and their names (whitespace stripped, as
        ``pandas.Series.str.strip`` does, so that ``" a"`` and ``"a"`` are one entity).
        ``None`` (the column kept) for another kind of column or one with nulls."""
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.types as pat

        column = self.table.column(col)
        kind = column.type
        if pat.is_dictionary(kind):
            kind = kind.value_type
        if column.null_count or not (pat.is_string(kind) or pat.is_large_string(kind)):
            return None
        self._take(col)
        if not pat.is_dictionary(column.type):  # Parquet: plain strings
            column = column.dictionary_encode()
        column = pa.table({"e": column}).unify_dictionaries().column(0)
        chunks = [c for c in column.chunks if len(c)]
        codes = np.concatenate([c.indices.to_numpy(zero_copy_only=False) for c in chunks])
        stripped = pc.utf8_trim_whitespace(chunks[0].dictionary).to_pylist()
        return _first_appearance(codes.astype(np.int32, copy=False), stripped)


def _first_appearance(codes: np.ndarray, values: list) -> tuple[np.ndarray, list[str]]:
    """Renumber ``codes`` (indices into ``values``) so that equal values share a code and the
    codes count up in order of first appearance in ``codes``; return them and the names
    (``str(value).strip()``) of the codes used, in that order."""
    # The first row of each run of equal codes: few for a file grouped by entity.
    starts = np.flatnonzero(codes[1:] != codes[:-1]) + 1
    starts = np.concatenate([np.zeros(1, np.int64), starts])
    first = np.full(len(values), len(codes), dtype=np.int64)
    np.minimum.at(first, codes[starts], starts)
    # Merge equal values (first appearance wins), then order the entities by first row.
    uniq: dict = {}
    for v in sorted(range(len(values)), key=first.__getitem__):
        if first[v] < len(codes):
            uniq.setdefault(values[v], []).append(v)
    rank = np.zeros(len(values), dtype=np.int32)
    for k, members in enumerate(uniq.values()):
        rank[members] = k
    if not np.array_equal(rank, np.arange(len(values))):
        codes = rank[codes]
    return codes, [str(u).strip() for u in uniq]
