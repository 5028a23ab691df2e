"""IDX files (the MNIST format): a strict reader and a deterministic gzip writer.

Layout (big-endian): two zero bytes, a type byte (0x08 = uint8, ...), a byte with the number of dimensions
D, then D uint32 sizes, then exactly prod(sizes) items. MNIST images are 0x00000803 (N, 28, 28) and labels
0x00000801 (N,). The reader accepts a raw file or a gzip one (recognised by its magic bytes) and checks that
the data size equals the product of the dimensions exactly.

The writer produces gzip files whose bytes depend only on the array and the file name: the gzip header
has mtime 0 and a fixed name field, and the deflate stream is made of *stored* (uncompressed) blocks that
we lay out ourselves. Compressed deflate output depends on the zlib build (zlib and zlib-ng produce
different streams), which would break the md5 checks of the offline datasets on another machine.
"""

from __future__ import annotations

import gzip
import os
import struct
import zlib
from pathlib import Path

import numpy as np

from gpunn.errors import GpunnError
from gpunn.io import atomic_path

GZIP_MAGIC = b"\x1f\x8b"

# IDX type byte -> big-endian dtype
IDX_TYPES = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}

_REDOWNLOAD = "delete it and run the download again"


def _gunzip(path: Path, raw: bytes) -> bytes:
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:
        # BadGzipFile is an OSError; a cut stream is an EOFError; bad deflate data is a zlib.error
        reason = str(exc) or type(exc).__name__
        raise GpunnError(f"{path}: corrupt gzip stream ({reason}); {_REDOWNLOAD}") from None


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file (raw or gzip) into a native-endian array of the shape its header gives."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise GpunnError(f"{path}: file not found; download or generate the dataset first") from None
    except OSError as exc:
        raise GpunnError(f"{path}: cannot read ({exc.strerror or exc})") from None
    data = _gunzip(path, raw) if raw[:2] == GZIP_MAGIC else raw

    if len(data) < 4:
        raise GpunnError(f"{path}: truncated IDX file: {len(data)} bytes, shorter than the 4-byte magic; "
                         f"{_REDOWNLOAD}")
    zero, type_code, ndim = struct.unpack(">HBB", data[:4])
    magic = int.from_bytes(data[:4], "big")
    if zero != 0 or type_code not in IDX_TYPES:
        raise GpunnError(f"{path}: not an IDX file: bad magic number 0x{magic:08X} (expected 0x000008DD, "
                         f"e.g. 0x00000803 for images, 0x00000801 for labels); {_REDOWNLOAD}")
    if ndim == 0:
        raise GpunnError(f"{path}: bad IDX header: magic 0x{magic:08X} declares 0 dimensions; {_REDOWNLOAD}")
    header_len = 4 + 4 * ndim
    if len(data) < header_len:
        raise GpunnError(f"{path}: truncated IDX file: header declares {ndim} dimensions but the file has "
                         f"only {len(data)} bytes; {_REDOWNLOAD}")
    dims = struct.unpack(f">{ndim}I", data[4:header_len])
    dtype = IDX_TYPES[type_code]
    n_items = 1
    for d in dims:
        n_items *= d
    expected = n_items * dtype.itemsize
    found = len(data) - header_len
    shape_txt = "x".join(str(d) for d in dims)
    if found < expected:
        what = f"{n_items} items" if ndim == 1 else f"{shape_txt} = {n_items} items"
        if dtype.itemsize > 1:
            what += f" ({expected} bytes)"
        raise GpunnError(f"{path}: truncated IDX file: header says {what}, found {found} bytes; {_REDOWNLOAD}")
    if found > expected:
        raise GpunnError(f"{path}: {found - expected} trailing bytes after the {shape_txt} data the IDX header "
                         f"declares; {_REDOWNLOAD}")
    array = np.frombuffer(data, dtype=dtype, count=n_items, offset=header_len).reshape(dims)
    return array.astype(dtype.newbyteorder("="), copy=True)


# ----------------------------------------------------------------------------------------------------------
# deterministic gzip writing


class StoredGzipWriter:
    """A write-only file object that wraps what it is given in a gzip stream of stored deflate blocks.

    The output depends only on the bytes written and `name`: mtime 0, OS byte 255, blocks of 65535 bytes
    (the last one holds the remainder). Call close() (or use it as a context manager) to write the trailer.
    """

    BLOCK = 65535

    def __init__(self, fileobj, name: str = ""):
        self._out = fileobj
        self._pending = bytearray()
        self._crc = 0
        self._size = 0
        self._closed = False
        flags = 0x08 if name else 0x00
        header = GZIP_MAGIC + bytes([8, flags]) + b"\x00\x00\x00\x00" + bytes([0, 255])
        if name:
            header += name.encode("latin-1") + b"\x00"
        self._out.write(header)

    def _block(self, chunk: bytes | bytearray, final: bool) -> None:
        n = len(chunk)
        self._out.write(bytes([1 if final else 0]) + struct.pack("<HH", n, n ^ 0xFFFF))
        self._out.write(chunk)

    def write(self, data) -> int:
        if self._closed:
            raise ValueError("write to a closed StoredGzipWriter")
        data = memoryview(data).cast("B")
        self._crc = zlib.crc32(data, self._crc)
        self._size += len(data)
        self._pending += data
        if len(self._pending) > self.BLOCK:
            n_full = (len(self._pending) - 1) // self.BLOCK  # always keep a non-empty remainder
            view = memoryview(self._pending)
            for i in range(n_full):
                self._block(view[i * self.BLOCK:(i + 1) * self.BLOCK], final=False)
            view.release()
            del self._pending[: n_full * self.BLOCK]
        return len(data)

    def tell(self) -> int:
        return self._size

    def flush(self) -> None:
        pass

    def close(self) -> None:
        if self._closed:
            return
        self._block(bytes(self._pending), final=True)
        self._pending = bytearray()
        self._out.write(struct.pack("<II", self._crc & 0xFFFFFFFF, self._size & 0xFFFFFFFF))
        self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()


def gzip_name_field(path: str | os.PathLike) -> str:
    """The name stored in the gzip header: the file name without '.gz', as the gzip tool stores it."""
    name = Path(path).name
    return name[:-3] if name.endswith(".gz") else name


def idx_header(array: np.ndarray) -> bytes:
    if array.dtype != np.uint8:
        raise TypeError(f"write_idx writes uint8 arrays only, got {array.dtype}")
    if array.ndim < 1 or array.ndim > 255:
        raise ValueError(f"an IDX array needs 1..255 dimensions, got {array.ndim}")
    return struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)


def write_idx(path: str | os.PathLike, array: np.ndarray) -> None:
    """Write a uint8 array as a gzip IDX file, atomically; the bytes depend only on the array and file name."""
    array = np.ascontiguousarray(array)
    header = idx_header(array)
    with atomic_path(path) as tmp, open(tmp, "wb") as fh, StoredGzipWriter(fh, gzip_name_field(path)) as gz:
        gz.write(header)
        gz.write(array.reshape(-1).data)
