"""Reading one file out of a Debian package (``.deb``) with the standard library.

A ``.deb`` is an ``ar`` archive (``!<arch>\\n``, then 60-byte member headers)
holding ``debian-binary``, ``control.tar.*`` and ``data.tar.*``; the files of the
package are in ``data.tar.xz`` (or ``.gz``, ``.bz2``, uncompressed). Only the one
regular file asked for is ever written, and never more than :data:`MAX_MEMBER_BYTES`
of it (a package is input from the network: a decompression bomb is refused).
"""
import bz2
import gzip
import io
import lzma
import pathlib
import tarfile
import zlib

from minitf.nmt.errors import DataError

#: The most bytes unpacked: the file itself (the Ding dictionary has about 14 MB), and
#: everything the ``data.tar`` stream holds up to it. A package beyond them is refused.
MAX_MEMBER_BYTES = 64 << 20
MAX_DATA_TAR_BYTES = 256 << 20
_BLOCK = 1 << 16

_AR_MAGIC = b"!<arch>\n"
_DECOMPRESS = {".xz": lzma.open, ".gz": gzip.open, ".bz2": bz2.open, "": lambda f: f}


def ar_members(data):
    """``{name: bytes}`` of an ``ar`` archive (the format of a ``.deb``).

    Raises
    ------
    DataError
        Not an ar archive, or a member header or size that does not fit the file.
    """
    if not data.startswith(_AR_MAGIC):
        raise DataError("not a Debian package (.deb): the file does not start with an ar archive header")
    members, offset = {}, len(_AR_MAGIC)
    while offset < len(data):
        header = data[offset:offset + 60]
        if len(header) < 60 or header[58:60] != b"`\n":
            raise DataError(f"damaged Debian package: bad ar member header at byte {offset}")
        name = header[:16].decode("ascii", "replace").strip().rstrip("/")
        try:
            size = int(header[48:58].decode("ascii").strip())
        except ValueError:
            raise DataError(f"damaged Debian package: bad size of ar member {name!r}") from None
        start = offset + 60
        if start + size > len(data):
            raise DataError(f"damaged Debian package: member {name!r} is cut short")
        members[name] = data[start:start + size]
        offset = start + size + (size % 2)  # members are 2-byte aligned
    return members


class _Capped:
    """A read-only stream that refuses to give more than ``limit`` bytes in all."""

    def __init__(self, stream, limit, name):
        self.stream, self.limit, self.name, self.count = stream, limit, name, 0

    def read(self, n=-1):
        block = self.stream.read(self.limit + 1 - self.count if n is None or n < 0 else n)
        self.count += len(block)
        if self.count > self.limit:
            raise DataError(f"{self.name} unpacks to more than {self.limit >> 20} MiB (a decompression "
                            "bomb, or not the package expected); refused")
        return block


def extract_member(deb_path, member, out):
    """Copy the regular file ``member`` (``usr/share/trans/de-en``) of a ``.deb``'s
    ``data.tar.*`` into the open binary file ``out``.

    Nothing else of the package is written anywhere, so no member name (``../x``,
    ``/etc/x``) can reach outside; the member itself must be a regular file (not a
    symlink, hardlink or device) of at most :data:`MAX_MEMBER_BYTES`, and at most
    :data:`MAX_DATA_TAR_BYTES` of the tar stream are unpacked to find it.

    Raises
    ------
    DataError
        Not a .deb, no ``data.tar``, a damaged or over-large tar, no such member or
        not a regular file.
    """
    members = ar_members(pathlib.Path(deb_path).read_bytes())
    names = [n for n in members if n.startswith("data.tar")]
    if not names:
        raise DataError(f"damaged Debian package: no data.tar member (members: {sorted(members)})")
    name = names[0]
    suffix = name[len("data.tar"):]
    if suffix not in _DECOMPRESS:
        raise DataError(f"{name} is compressed in a way Python's standard library cannot read")
    try:
        stream = _Capped(_DECOMPRESS[suffix](io.BytesIO(members[name])), MAX_DATA_TAR_BYTES, name)
        with tarfile.open(fileobj=stream, mode="r|") as archive:
            for info in archive:
                path = info.name
                while path.startswith("./"):
                    path = path[2:]
                if path != member:
                    continue
                if not info.isreg():
                    raise DataError(f"{member} in the package is not a regular file (a link or device); refused")
                if info.size > MAX_MEMBER_BYTES:
                    raise DataError(f"{member} in the package has {info.size} bytes, more than the "
                                    f"{MAX_MEMBER_BYTES >> 20} MiB expected of it; refused")
                source = archive.extractfile(info)
                while block := source.read(_BLOCK):
                    out.write(block)
                return
    except DataError:
        raise
    except (tarfile.TarError, EOFError, OSError, ValueError, lzma.LZMAError, zlib.error) as error:
        raise DataError(f"damaged Debian package: cannot read {name} ({error})") from None
    raise DataError(f"the package has no {member}; its layout changed")
