"""Fetching the default corpus once: Debian's package ``trans-de-en`` (the Ding
German-English dictionary), with apt where it exists, else over HTTPS from
Debian's archive with a pinned sha256; unpacked with the standard library."""
import os
import pathlib
import shutil
import subprocess
import tempfile

from minitf.nmt.deb import download, extract_deb
from minitf.nmt.errors import CommandFailed, DataError

#: Where the Ding dictionary lives inside the Debian package ``trans-de-en``.
DING_PACKAGE = "trans-de-en"
DING_MEMBER = pathlib.Path("usr/share/trans/de-en")

_CORPUS_HINT = ("pass your own corpus with --train-src/--train-tgt --valid-src/--valid-tgt "
                "(plain UTF-8 text, one sentence per line)")


#: The package file fetched over HTTPS where apt is missing: pinned by name, size and sha256
#: (the same file as ``apt-get download trans-de-en`` on Debian 12).
DING_DEB = "trans-de-en_1.9-6_all.deb"
DING_DEB_PATH = "pool/main/d/ding/" + DING_DEB
DING_DEB_SHA256 = "45f6b4cf1c434776fba6811d7bc522efabb5425c43ba8afd0e289bf9e2e53df4"
DING_DEB_SIZE = 6276816
#: Debian's archive; ``MINITF_DEBIAN_MIRROR`` replaces it (another mirror, or a test's local server).
DEBIAN_ARCHIVE = "https://deb.debian.org/debian"
#: The archive's permanent copy of the same file, by its sha1 (tried when the pool no longer has it).
DING_DEB_SNAPSHOT = "https://snapshot.debian.org/file/72c711ad89bff6de764306923b6d65ed49779bc2"


def fetch_default_corpus(cache_dir, use_apt=None, base_url=None):
    """Return the path of the Ding de-en dictionary, fetching it once if needed.

    apt comes first where it exists (``apt-get download trans-de-en``); without
    apt, or when apt cannot get the package, the pinned .deb is downloaded over
    HTTPS from Debian's archive and its sha256 checked. The package is unpacked
    with the standard library (:mod:`minitf.nmt.deb`) in a private temp folder
    that is renamed into place only when complete, so the cache never holds a
    half-written corpus.

    Parameters
    ----------
    cache_dir : str or path-like
        Folder that holds ``trans-de-en/usr/share/trans/de-en`` once fetched.
    use_apt : bool or None
        None: apt where ``apt-get`` exists, unless ``MINITF_NO_APT=1``.
    base_url : str or None
        Debian archive to download from; default ``MINITF_DEBIAN_MIRROR`` or
        :data:`DEBIAN_ARCHIVE` (then :data:`DING_DEB_SNAPSHOT` as a second try).

    Returns
    -------
    pathlib.Path
        The dictionary file (UTF-8 text in Ding format, see :func:`parse_ding`).

    Raises
    ------
    DataError
        Neither apt nor the download could provide the package (one line, saying why).
    """
    cache_dir = pathlib.Path(cache_dir)
    final_dir = cache_dir / DING_PACKAGE
    corpus = final_dir / DING_MEMBER
    if corpus.is_file():
        return corpus
    if use_apt is None:
        use_apt = shutil.which("apt-get") is not None and os.environ.get("MINITF_NO_APT") != "1"
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise DataError(f"cannot create the corpus cache folder {str(cache_dir)!r} ({error}); "
                        "pass a writable --cache-dir") from None
    # Work in a private temp folder and rename the finished tree into place, so an
    # interrupted fetch never leaves a half-extracted corpus behind.
    work = pathlib.Path(tempfile.mkdtemp(prefix=f".{DING_PACKAGE}-", dir=cache_dir))
    try:
        apt_error = None
        deb = None
        if use_apt:
            try:
                deb = _apt_download(work)
            except DataError as error:
                apt_error = error
        if deb is None:
            deb = _https_download(work, base_url, apt_error)
        extracted = work / "root"
        try:
            extract_deb(deb, extracted, member=DING_MEMBER.as_posix())
        except DataError as error:
            raise DataError(f"{deb.name}: {error}; {_CORPUS_HINT}") from None
        if not (extracted / DING_MEMBER).is_file():
            raise DataError(f"package {DING_PACKAGE} has no {DING_MEMBER}; the package layout "
                            f"changed, so {_CORPUS_HINT}")
        if final_dir.exists() and not corpus.is_file():
            shutil.rmtree(final_dir)  # a stale tree without the corpus: ours to replace
        try:
            os.rename(extracted, final_dir)
        except OSError:
            if not corpus.is_file():  # not a concurrent fetch that won the race
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return corpus


def _https_download(work, base_url, apt_error):
    """Download the pinned .deb into ``work``; a DataError names apt's failure too."""
    base = base_url or os.environ.get("MINITF_DEBIAN_MIRROR") or DEBIAN_ARCHIVE
    urls = [base.rstrip("/") + "/" + DING_DEB_PATH]
    if base == DEBIAN_ARCHIVE:
        urls.append(DING_DEB_SNAPSHOT)
    try:
        return download(urls, work / DING_DEB, DING_DEB_SHA256, size=DING_DEB_SIZE,
                        what=f"Debian package {DING_PACKAGE}")
    except DataError as error:
        apt_text = str(apt_error).replace(f"; {_CORPUS_HINT}", "")  # the hint is said once, below
        before = f"apt failed ({apt_text}), and " if apt_error is not None else ""
        raise DataError(f"{before}{error}; check the network connection or {_CORPUS_HINT}") from None


def _apt_download(work):
    """Run ``apt-get download`` in ``work`` and return the path of the .deb."""
    try:
        _run(["apt-get", "download", DING_PACKAGE], cwd=work, what="apt-get download")
    except CommandFailed as error:
        if "Unable to locate package" in error.detail or error.detail.startswith("E:"):
            raise DataError(f"apt-get cannot get package {DING_PACKAGE} ({error.detail}; "
                            "`apt-get update` as root may help)") from None
        raise
    debs = sorted(work.glob(f"{DING_PACKAGE}_*.deb"))
    if not debs:
        raise DataError(f"apt-get download {DING_PACKAGE} reported success but wrote no .deb")
    return debs[0]


def _run(command, cwd, what):
    """Run a command quietly; any failure becomes a one-line DataError."""
    try:
        result = subprocess.run(command, cwd=cwd, capture_output=True, text=True,
                                timeout=600, check=False)
    except FileNotFoundError:
        raise DataError(f"{command[0]} is not installed, so apt is unavailable; "
                        f"{_CORPUS_HINT}") from None
    except (OSError, subprocess.TimeoutExpired) as error:
        raise DataError(f"{what} failed ({error}); {_CORPUS_HINT}") from None
    if result.returncode != 0:
        lines = [line for line in (result.stderr + result.stdout).splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("E:")]
        detail = (errors or lines or [f"exit status {result.returncode}"])[-1].strip()
        raise CommandFailed(what, detail, _CORPUS_HINT)
    return result
