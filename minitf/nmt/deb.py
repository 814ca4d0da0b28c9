"""Fetching and unpacking a Debian package without apt: HTTPS download with a
pinned sha256, and the standard library's view of a ``.deb``.

A ``.deb`` is an ``ar`` archive (``!<arch>\\n``, then 60-byte member headers)
holding ``debian-binary``, ``control.tar.*`` and ``data.tar.*``; the files of
the package are in ``data.tar.xz`` (or ``.gz``, ``.bz2``, uncompressed), which
:mod:`tarfile` reads.
"""
import hashlib
import io
import os
import pathlib
import tarfile
import urllib.error
import urllib.request

from minitf.nmt.errors import DataError

_AR_MAGIC = b"!<arch>\n"
_BLOCK = 1 << 16


def download(urls, dest, sha256, size=None, timeout=60, what="the package"):
    """Download the first of ``urls`` that answers into ``dest`` and check its sha256.

    Writes ``dest.part`` and renames it to ``dest`` only once the digest matches,
    so ``dest`` never holds a partial or wrong file; ``dest.part`` is removed on
    any failure.

    Raises
    ------
    DataError
        Every URL failed (the last reason is named), the transfer stopped early,
        or the bytes do not have the pinned sha256.
    """
    dest = pathlib.Path(dest)
    part = dest.with_name(dest.name + ".part")
    reasons = []
    for url in urls:
        try:
            digest, received = _get(url, part, timeout)
        except (urllib.error.URLError, OSError, ValueError) as error:
            part.unlink(missing_ok=True)
            if isinstance(error, urllib.error.HTTPError):
                reason = f"HTTP {error.code} {error.reason}"
            else:
                reason = getattr(error, "reason", None) or error
            reasons.append(f"{url}: {reason}")
            continue
        except BaseException:
            part.unlink(missing_ok=True)
            raise
        if size is not None and received != size:
            part.unlink(missing_ok=True)
            reasons.append(f"{url}: got {received} bytes, expected {size} (the transfer stopped early)")
            continue
        if digest != sha256:
            part.unlink(missing_ok=True)
            reasons.append(f"{url}: sha256 {digest[:16]}... differs from the pinned {sha256[:16]}... "
                           "(a corrupted or different file)")
            continue
        os.replace(part, dest)
        return dest
    raise DataError(f"could not download {what}: {reasons[-1] if reasons else 'no URL to try'}")


def _get(url, part, timeout):
    """Stream ``url`` into ``part``; returns (sha256 hex, bytes received)."""
    digest, received = hashlib.sha256(), 0
    request = urllib.request.Request(url, headers={"User-Agent": "minitf"})
    with urllib.request.urlopen(request, timeout=timeout) as response, open(part, "wb") as out:
        expected = response.headers.get("Content-Length")
        while True:
            block = response.read(_BLOCK)
            if not block:
                break
            digest.update(block)
            out.write(block)
            received += len(block)
        out.flush()
        os.fsync(out.fileno())
    if expected is not None and expected.isdigit() and int(expected) != received:
        raise ValueError(f"the server sent {received} of {expected} bytes (the transfer stopped early)")
    return digest.hexdigest(), received


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


def extract_deb(deb_path, dest, member=None):
    """Unpack the files of a ``.deb`` (its ``data.tar.*``) into the folder ``dest``.

    Parameters
    ----------
    deb_path : path-like
    dest : path-like
        Created; the package's paths (``usr/share/...``) land below it.
    member : str or None
        Unpack only this file of the package (e.g. ``usr/share/trans/de-en``).

    Raises
    ------
    DataError
        Not a .deb, no ``data.tar``, a damaged tar, or a path leaving ``dest``.
    """
    members = ar_members(pathlib.Path(deb_path).read_bytes())
    names = [n for n in members if n.startswith("data.tar")]
    if not names:
        raise DataError(f"damaged Debian package: no data.tar member (members: {sorted(members)})")
    dest = pathlib.Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    root = dest.resolve()
    try:
        with tarfile.open(fileobj=io.BytesIO(members[names[0]]), mode="r:*") as archive:
            for info in archive:
                path = info.name
                while path.startswith("./"):
                    path = path[2:]
                if path in ("", "."):                      # the archive's own root entry "./"
                    continue
                if member is not None and path != member:
                    continue
                target = (dest / path).resolve()
                if root not in target.parents:
                    raise DataError(f"damaged Debian package: {info.name!r} points outside the folder")
                if info.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                elif info.isfile():
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with archive.extractfile(info) as source, open(target, "wb") as out:
                        while block := source.read(_BLOCK):
                            out.write(block)
                # links and devices are not needed for a data file: skipped
    except DataError:
        raise
    except (tarfile.TarError, EOFError, ValueError, *_codec_errors()) as error:
        raise DataError(f"damaged Debian package: cannot read {names[0]} ({error})") from None


def _codec_errors():
    """The decompressors' own exception types (a corrupted xz stream raises LZMAError)."""
    errors = []
    for module, name in (("lzma", "LZMAError"), ("zlib", "error")):
        try:
            errors.append(getattr(__import__(module), name))
        except ImportError:
            pass
    return tuple(errors)
