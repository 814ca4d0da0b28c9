"""Data from a Debian package, shared by both models' default corpora: one pinned .deb, got by ``apt-get download``
where apt exists (unless ``MINITF_NO_APT=1``), else over HTTPS from Debian's archive (``MINITF_DEBIAN_MIRROR``, then
the snapshot) through :func:`minitf.training.download.download`; then only the named regular files of its ``data.tar``
unpacked with the standard library, refusing links, oversized files and decompression bombs."""
import bz2
import dataclasses
import gzip
import io
import lzma
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zlib

from minitf.training.download import download, mirror_base, sigterm_raises
from minitf.training.errors import CommandFailed, DataError

#: ``MINITF_DEBIAN_MIRROR`` replaces it (another mirror, or a test's local server).
DEBIAN_ARCHIVE = "https://deb.debian.org/debian"
MIRROR_VARIABLE = "MINITF_DEBIAN_MIRROR"
#: ``MINITF_NO_APT=1`` skips apt where it exists (the HTTPS path only).
NO_APT_VARIABLE = "MINITF_NO_APT"


@dataclasses.dataclass(frozen=True)
class DebianPackage:
    """One pinned .deb: ``name`` (as apt knows it), ``pool_path`` under the archive, ``size`` in bytes, ``sha256``,
    and ``snapshot``: the archive's permanent copy by sha1 (tried when the pool no longer has it), or None."""
    name: str
    pool_path: str
    size: int
    sha256: str
    snapshot: str = None

    @property
    def filename(self):
        return self.pool_path.rsplit("/", 1)[-1]


def make_cache(folder):
    """Create the cache folder; a one-line DataError when it cannot be."""
    try:
        pathlib.Path(folder).mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise DataError(f"cannot create the corpus cache folder {str(folder)!r} ({error}); "
                        "pass a writable --cache-dir") from None


def fetch_package(package, cache_dir, unpack, *, hint, use_apt=None, base_url=None, progress=True, log=None):
    """Get ``package`` (a :class:`DebianPackage`) once and return ``unpack(deb_path)``: by apt (``use_apt`` None:
    where ``apt-get`` exists, unless ``MINITF_NO_APT=1``), else, or when apt or ``unpack`` of apt's file fails
    with a DataError, the pinned .deb from ``base_url`` (default ``MINITF_DEBIAN_MIRROR`` or Debian's archive, then
    its snapshot) into ``cache_dir``, a cut download resumed next time. The .deb and apt's temp folder go on
    success, error and SIGTERM (which raises inside). A one-line DataError ends with ``hint`` (what to do)."""
    cache_dir = pathlib.Path(cache_dir)
    if use_apt is None:
        use_apt = shutil.which("apt-get") is not None and os.environ.get(NO_APT_VARIABLE) != "1"
    make_cache(cache_dir)
    with sigterm_raises():  # SIGTERM raises, so that every finally below cleans up
        apt_error = None
        if use_apt:
            work = pathlib.Path(tempfile.mkdtemp(prefix=f".{package.name}-apt-", dir=cache_dir))
            try:
                return unpack(_apt_download(package, work, hint))
            except DataError as error:
                apt_error = error
            finally:
                shutil.rmtree(work, ignore_errors=True)
        deb = _https_download(package, cache_dir, base_url, apt_error, hint, progress, log)
        try:
            return unpack(deb)
        finally:
            deb.unlink(missing_ok=True)


def _https_download(package, cache_dir, base_url, apt_error, hint, progress, log):
    """Download the pinned .deb into the cache; a DataError names apt's failure too."""
    base = (base_url or mirror_base(MIRROR_VARIABLE, DEBIAN_ARCHIVE)).rstrip("/")
    urls = [base + "/" + package.pool_path]
    if base == DEBIAN_ARCHIVE and package.snapshot:
        urls.append(package.snapshot)
    try:
        return download(urls, cache_dir / package.filename, size=package.size, sha256=package.sha256,
                        what=f"Debian package {package.name}", progress=progress,
                        log=log or (lambda note: print(note, file=sys.stderr)))
    except DataError as error:
        apt_text = str(apt_error).replace(f"; {hint}", "")  # the hint is said once, below
        before = f"apt failed ({apt_text}), and " if apt_error is not None else ""
        raise DataError(f"{before}{error}; or set {MIRROR_VARIABLE} to another Debian mirror, or {hint}") from None


def _apt_download(package, work, hint):
    """Run ``apt-get download`` quietly in ``work`` and return the path of the .deb; a failure is one line."""
    what = "apt-get download"
    try:
        result = subprocess.run(["apt-get", "download", package.name], cwd=work, capture_output=True, text=True,
                                timeout=600, check=False)
    except FileNotFoundError:
        raise DataError(f"apt-get is not installed, so apt is unavailable; {hint}") from None
    except (OSError, subprocess.TimeoutExpired) as error:
        raise DataError(f"{what} failed ({error}); {hint}") from None
    if result.returncode != 0:
        lines = [line for line in (result.stderr + result.stdout).splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("E:")]
        detail = (errors or lines or [f"exit status {result.returncode}"])[-1].strip()
        if "Unable to locate package" in detail or detail.startswith("E:"):
            raise DataError(f"apt-get cannot get package {package.name} ({detail}; `apt-get update` as root may help)")
        raise CommandFailed(what, detail, hint)
    debs = sorted(work.glob(f"{package.name}_*.deb"))
    if not debs:
        raise DataError(f"apt-get download {package.name} reported success but wrote no .deb")
    return debs[0]


# A .deb is an ``ar`` archive holding ``debian-binary``, ``control.tar.*`` and ``data.tar.*`` (.xz, .gz, .bz2
# or plain), read with the standard library. A package comes from the network: a decompression bomb is refused.
#: The most bytes unpacked: each file (the Ding dictionary has about 14 MB), and the data.tar stream up to the last.
MAX_MEMBER_BYTES = 64 << 20
MAX_DATA_TAR_BYTES = 256 << 20
_BLOCK = 1 << 16

_AR_MAGIC = b"!<arch>\n"
_DECOMPRESS = {".xz": lzma.open, ".gz": gzip.open, ".bz2": bz2.open, "": lambda f: f}


def ar_members(data):
    """``{name: bytes}`` of an ``ar`` archive (a .deb); a DataError for a bad header or size."""
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


def extract_members(deb_path, outs):
    """Copy each regular file named in ``outs`` (``{member path: open binary file}``, paths without ``./``) of a
    .deb's ``data.tar.*`` into its file, in one pass; nothing else is written, so no member name can reach
    outside. A link or device, a file over :data:`MAX_MEMBER_BYTES`, over :data:`MAX_DATA_TAR_BYTES` of tar
    stream, a missing file, a damaged or foreign package: a one-line DataError."""
    members = ar_members(pathlib.Path(deb_path).read_bytes())
    names = [n for n in members if n.startswith("data.tar")]
    if not names:
        raise DataError(f"damaged Debian package: no data.tar member (members: {sorted(members)})")
    name = names[0]
    suffix = name[len("data.tar"):]
    if suffix not in _DECOMPRESS:
        raise DataError(f"{name} is compressed in a way Python's standard library cannot read")
    wanted = dict(outs)
    try:
        stream = _Capped(_DECOMPRESS[suffix](io.BytesIO(members[name])), MAX_DATA_TAR_BYTES, name)
        with tarfile.open(fileobj=stream, mode="r|") as archive:
            for info in archive:
                member = re.sub(r"^(?:\./)+", "", info.name)
                if member not in wanted:
                    continue
                if not info.isreg():
                    raise DataError(f"{member} in the package is not a regular file (a link or device); refused")
                if info.size > MAX_MEMBER_BYTES:
                    raise DataError(f"{member} in the package has {info.size} bytes, more than the "
                                    f"{MAX_MEMBER_BYTES >> 20} MiB expected of it; refused")
                source, out = archive.extractfile(info), wanted.pop(member)
                while block := source.read(_BLOCK):
                    out.write(block)
                if not wanted:
                    return
    except DataError:
        raise
    except (tarfile.TarError, EOFError, OSError, ValueError, lzma.LZMAError, zlib.error) as error:
        raise DataError(f"damaged Debian package: cannot read {name} ({error})") from None
    raise DataError(f"the package has no {sorted(wanted)[0]}; its layout changed")


def extract_member(deb_path, member, out):
    """:func:`extract_members` of the one file ``member`` into ``out``."""
    extract_members(deb_path, {member: out})
