#!/usr/bin/env python3
"""Builds the fairgo_torch wheel with libfairgo.so inside, without pip,
setuptools or a network (make wheel runs it):

    python3 python/build_wheel.py --lib lib/libfairgo.so --out dist

A wheel is a zip of the package, the library and a .dist-info directory
(METADATA, WHEEL, RECORD; PEP 427 and 491). The metadata come from
python/pyproject.toml, the long description from python/README.md. The
platform tag is manylinux_2_<N>_<arch>, where 2.N is the newest glibc
symbol version the library needs (read from its ELF version references,
as `objdump -T` shows them), so that pip installs it exactly where it
loads. `make libfairgo` keeps that at 2.28 or older
(cmd/libfairgo/glibc_compat.h); python/tests/test_wheel.py checks it.
Prints the wheel's path.

    python3 python/build_wheel.py --glibc lib/libfairgo.so

prints the library's glibc needs instead: the newest version, its tag,
and every symbol newer than 2.28.
"""

import argparse
import base64
import csv
import hashlib
import io
import re
import struct
import sys
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKAGE = "fairgo_torch"
LIB_NAME = "libfairgo.so"
# Fixed timestamp of every entry: the same inputs give the same wheel.
DATE = (2026, 1, 1, 0, 0, 0)

MACHINES = {62: "x86_64", 183: "aarch64"}  # ELF e_machine


def pyproject(path: Path) -> dict:
    """The [project] table of pyproject.toml (tomllib from Python 3.11; on
    older Pythons the simple string, table and string-list values this
    project uses)."""
    try:
        import tomllib
    except ImportError:
        tomllib = None
    if tomllib is not None:
        with open(path, "rb") as f:
            return tomllib.load(f)["project"]
    text = path.read_text()
    body = re.search(r"^\[project\]\n(.*?)(?=^\[|\Z)", text, re.M | re.S)[1]
    out = {}
    for key, value in re.findall(r'^([A-Za-z-]+)\s*=\s*(".*?"|\[.*?\]|\{.*?\})\s*$', body, re.M | re.S):
        if value.startswith('"'):
            out[key] = value[1:-1]
        elif value.startswith("["):
            out[key] = re.findall(r'"([^"]*)"', value)
        else:
            out[key] = dict(re.findall(r'(\w+)\s*=\s*"([^"]*)"', value))
    return out


def elf_glibc_needs(data: bytes):
    """The ELF machine of a shared object and the newest GLIBC_2.N it
    references (from SHT_GNU_verneed), as (machine, N); N is None when it
    references no versioned glibc symbol."""
    sections = _sections(data)  # refuses what is not an ELF file first
    machine, = struct.unpack_from("<H", data, 0x12)
    newest = None
    for _, name, _ in _needed_versions(data, sections):
        v = glibc_version(name)
        if v is not None:
            newest = max(newest or 0, v[1])
    return MACHINES.get(machine), newest


def _needed_versions(data: bytes, sections):
    """The versions a shared object needs (SHT_GNU_verneed), as
    (vna_other index, version name, file) in table order."""
    for sh_type, off, _, link, count, _ in sections:
        if sh_type != SHT_GNU_VERNEED:
            continue
        strtab = sections[link][1]
        for _ in range(count):
            _, vn_cnt, vn_file, vn_aux, vn_next = struct.unpack_from("<HHIII", data, off)
            aux = off + vn_aux
            for _ in range(vn_cnt):
                _, _, vna_other, vna_name, vna_next = struct.unpack_from("<IHHII", data, aux)
                yield vna_other, _cstring(data, strtab + vna_name), _cstring(data, strtab + vn_file)
                aux += vna_next
            if vn_next == 0:
                break
            off += vn_next


def _sections(data: bytes):
    """The section headers of a 64-bit little-endian ELF file, as
    (sh_type, sh_offset, sh_size, sh_link, sh_info, sh_entsize)."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    out = []
    for i in range(shnum):
        _, sh_type, _, _, sh_offset, sh_size, sh_link, sh_info, _, sh_entsize = struct.unpack_from(
            "<IIQQQQIIQQ", data, shoff + i * shentsize)
        out.append((sh_type, sh_offset, sh_size, sh_link, sh_info, sh_entsize))
    return out


def _cstring(data: bytes, at: int) -> str:
    return data[at:data.index(b"\0", at)].decode()


SHT_DYNSYM, SHT_DYNAMIC, SHT_GNU_VERNEED, SHT_GNU_VERSYM = 11, 6, 0x6FFFFFFE, 0x6FFFFFFF
DT_NEEDED = 1


def elf_needed(data: bytes):
    """The DT_NEEDED entries of a shared object: the libraries it links."""
    sections = _sections(data)
    out = []
    for sh_type, off, size, link, _, _ in sections:
        if sh_type != SHT_DYNAMIC:
            continue
        strtab = sections[link][1]
        for at in range(off, off + size, 16):
            tag, val = struct.unpack_from("<qQ", data, at)
            if tag == 0:
                break
            if tag == DT_NEEDED:
                out.append(_cstring(data, strtab + val))
    return out


def elf_versioned_imports(data: bytes):
    """The symbols a shared object takes from others with a version, as
    {name: (version, file)}: ("GLIBC_2.34", "libc.so.6") for an
    undefined pthread_create@GLIBC_2.34 (what `objdump -T` lists as
    *UND* with a version); the newest glibc one of a symbol taken twice."""
    sections = _sections(data)
    # the vna_other index of each needed version: (name, file)
    versions = {other: (name, file) for other, name, file in _needed_versions(data, sections)}
    versym = next((off for sh_type, off, *_ in sections if sh_type == SHT_GNU_VERSYM), None)
    out = {}
    for sh_type, off, size, link, _, entsize in sections:
        if sh_type != SHT_DYNSYM or versym is None:
            continue
        strtab = sections[link][1]
        for i in range(size // entsize):
            st_name, _, _, st_shndx = struct.unpack_from("<IBBH", data, off + i * entsize)
            ndx, = struct.unpack_from("<H", data, versym + 2 * i)
            ndx &= 0x7FFF
            if st_shndx != 0 or ndx not in versions:  # imports (SHN_UNDEF) with a needed version only
                continue
            name = _cstring(data, strtab + st_name)
            prev = out.get(name)
            if prev is None or (glibc_version(versions[ndx][0]) or (0, 0)) > (glibc_version(prev[0]) or (0, 0)):
                out[name] = versions[ndx]
    return out


def glibc_version(name: str):
    """(2, N) of a GLIBC_2.N or GLIBC_2.N.M version name, else None."""
    m = re.fullmatch(r"GLIBC_2\.(\d+)(?:\.\d+)?", name)
    return (2, int(m[1])) if m else None


def platform_tag(lib: bytes) -> str:
    machine, glibc = elf_glibc_needs(lib)
    if machine is None:
        raise ValueError("libfairgo.so is for an ELF machine this script does not know")
    # manylinux_2_17 is the oldest policy of a 64-bit glibc wheel.
    return f"manylinux_2_{max(glibc or 17, 17)}_{machine}"


def package_version() -> str:
    """The __version__ of fairgo_torch/_version.py: fairgo's version, the
    wheel's. Read as text, so that building needs no import of the package."""
    text = (HERE / PACKAGE / "_version.py").read_text()
    m = re.search(r'^__version__ = "([^"]+)"$', text, re.M)
    if m is None:
        raise ValueError(f"{PACKAGE}/_version.py defines no __version__")
    return m[1]


def readme_file(meta: dict):
    """pyproject.toml's readme (a path, or a table with file and
    content-type) as (path, content type); (None, None) without one."""
    readme = meta.get("readme")
    if readme is None:
        return None, None
    if isinstance(readme, dict):
        path, content_type = readme["file"], readme.get("content-type")
    else:
        path, content_type = readme, None
    if content_type is None:
        content_type = "text/markdown" if path.lower().endswith(".md") else "text/plain"
    return HERE / path, content_type


def record_line(name: str, data: bytes):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [name, f"sha256={digest}", str(len(data))]


def build(lib: Path, out: Path) -> Path:
    meta = pyproject(HERE / "pyproject.toml")
    name, version = meta["name"], package_version()
    if meta["version"] != version:
        raise ValueError(
            f"pyproject.toml's version {meta['version']} is not {PACKAGE}/_version.py's {version} (fairgo.Version)"
        )
    dist = re.sub(r"[-_.]+", "_", name).lower()
    lib_bytes = lib.read_bytes()
    tag = f"py3-none-{platform_tag(lib_bytes)}"
    info = f"{dist}-{version}.dist-info"

    files = {}
    for src in sorted([*(HERE / PACKAGE).glob("*.py"), *(HERE / PACKAGE).glob("*.cpp")]):  # the C++ hook's source too
        files[f"{PACKAGE}/{src.name}"] = src.read_bytes()
    files[f"{PACKAGE}/{LIB_NAME}"] = lib_bytes
    header = HERE.parent / "cmd" / "libfairgo" / "fairgo.h"
    files[f"{PACKAGE}/fairgo.h"] = header.read_bytes()

    md = [
        "Metadata-Version: 2.1",
        f"Name: {name}",
        f"Version: {version}",
        f"Summary: {meta['description']}",
        f"Requires-Python: {meta['requires-python']}",
    ]
    if "license" in meta:
        md.append(f"License: {meta['license'].get('text', '')}" if isinstance(meta["license"], dict) else f"License: {meta['license']}")
    md += [f"Requires-Dist: {d}" for d in meta.get("dependencies", [])]
    readme, content_type = readme_file(meta)
    if readme is not None:
        md.append(f"Description-Content-Type: {content_type}")
    text = "\n".join(md) + "\n"
    if readme is not None:
        text += "\n" + readme.read_text()  # the body of METADATA is the long description
    files[f"{info}/METADATA"] = text.encode()
    files[f"{info}/WHEEL"] = (
        "Wheel-Version: 1.0\n"
        "Generator: fairgo python/build_wheel.py\n"
        "Root-Is-Purelib: false\n"
        f"Tag: {tag}\n"
    ).encode()
    files[f"{info}/LICENSE"] = (HERE.parent / "LICENSE").read_bytes()

    rows = [record_line(n, d) for n, d in files.items()]
    rows.append([f"{info}/RECORD", "", ""])
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    files[f"{info}/RECORD"] = buf.getvalue().encode()

    out.mkdir(parents=True, exist_ok=True)
    wheel = out / f"{dist}-{version}-{tag}.whl"
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for n, d in files.items():
            zi = zipfile.ZipInfo(n, DATE)
            zi.compress_type = zipfile.ZIP_DEFLATED
            zi.external_attr = (0o755 if n.endswith(".so") else 0o644) << 16
            z.writestr(zi, d)
    return wheel


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lib", type=Path, help="libfairgo.so to bundle (make libfairgo)")
    p.add_argument("--out", type=Path, default=Path("dist"), help="directory of the wheel")
    p.add_argument("--glibc", type=Path, metavar="LIB", help="print LIB's glibc needs and build nothing")
    args = p.parse_args(argv)
    if args.glibc is not None:
        data = args.glibc.read_bytes()
        _, newest = elf_glibc_needs(data)
        print(f"newest: GLIBC_2.{newest}" if newest is not None else "newest: none")
        print(f"tag: {platform_tag(data)}")
        for sym, (ver, lib) in sorted(elf_versioned_imports(data).items()):
            if (glibc_version(ver) or (0, 0)) > (2, 28):
                print(f"{sym}@{ver} ({lib})")
        return 0
    if args.lib is None:
        p.error("--lib is required")
    print(build(args.lib, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
