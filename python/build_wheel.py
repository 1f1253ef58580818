#!/usr/bin/env python3
"""Builds the fairgo_torch wheel with libfairgo.so inside, without pip,
setuptools or a network (make wheel runs it):

    python3 python/build_wheel.py --lib lib/libfairgo.so --out dist

A wheel is a zip of the package, the library and a .dist-info directory
(METADATA, WHEEL, RECORD; PEP 427 and 491). The metadata come from
python/pyproject.toml. The platform tag is manylinux_2_<N>_<arch>, where
2.N is the newest glibc symbol version the library needs (read from its
ELF version references), so that pip installs it exactly where it loads.
Prints the wheel's path.
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
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    machine, = struct.unpack_from("<H", data, 0x12)
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = []
    for i in range(shnum):
        _, sh_type, _, _, sh_offset, sh_size, sh_link, sh_info, _, _ = struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
        sections.append((sh_type, sh_offset, sh_size, sh_link, sh_info))
    newest = None
    for sh_type, off, _, link, count in sections:
        if sh_type != 0x6FFFFFFE:  # SHT_GNU_verneed
            continue
        strtab = sections[link][1]

        def string(o):
            end = data.index(b"\0", strtab + o)
            return data[strtab + o:end].decode()

        for _ in range(count):
            _, vn_cnt, _, vn_aux, vn_next = struct.unpack_from("<HHIII", data, off)
            aux = off + vn_aux
            for _ in range(vn_cnt):
                _, _, _, vna_name, vna_next = struct.unpack_from("<IHHII", data, aux)
                m = re.fullmatch(r"GLIBC_2\.(\d+)(?:\.\d+)?", string(vna_name))
                if m:
                    newest = max(newest or 0, int(m[1]))
                aux += vna_next
            if vn_next == 0:
                break
            off += vn_next
    return MACHINES.get(machine), newest


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
    for src in sorted((HERE / PACKAGE).glob("*.py")):
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
    files[f"{info}/METADATA"] = ("\n".join(md) + "\n").encode()
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
    p.add_argument("--lib", type=Path, required=True, help="libfairgo.so to bundle (make libfairgo)")
    p.add_argument("--out", type=Path, default=Path("dist"), help="directory of the wheel")
    args = p.parse_args(argv)
    print(build(args.lib, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
