#!/usr/bin/env python3
"""An independent reader/writer of zoff's .zckpt checkpoint container (format version 1,
documented in include/zoff/ckpt.h), in plain Python (no numpy): the crash test compares
checkpoints with it, and fuzz/make_seeds.py writes seed files with it.

    zckpt.py verify  DIR [--cache FILE]
                                    every step_* directory of DIR (or DIR alone when it is a
                                    step directory, DIR/step_N): COMPLETE marker present and
                                    well-formed, every rank file valid, every CRC right (with a
                                    cache file, data CRCs of files verified before are skipped;
                                    headers and indexes are always checked)
    zckpt.py compare A B [--prefix P]...
                                    A and B (step directories or .zckpt files) hold the same
                                    entries with bit-identical data (only names starting with a
                                    prefix, when given); prints the first difference
    zckpt.py list    FILE_OR_STEPDIR
    zckpt.py strip   FILE [--meta-key K]... [--entry NAME]...
                                    rewrite FILE without those keys of its "meta" JSON blob and
                                    without those entries: a checkpoint as an earlier zoff wrote
                                    it, for the tests of loading one

Exit status 0 = ok, 1 = a difference or an invalid checkpoint (message on stderr), 2 = usage.
"""
import os
import re
import struct
import sys

ALIGN = 4096
HEADER_BYTES = 128
ENTRY_BYTES = 256
MAGIC = b"ZOFFCKPT"
RAW = 255
DTYPE_SIZE = {0: 4, 1: 2, 2: 2, 3: 4, RAW: 1}

# CRC32C (Castagnoli, reflected 0x82F63B78), slicing-by-8 tables
_T = [[0] * 256 for _ in range(8)]
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _T[0][_i] = _c
for _i in range(256):
    for _k in range(1, 8):
        _T[_k][_i] = (_T[_k - 1][_i] >> 8) ^ _T[0][_T[_k - 1][_i] & 0xFF]


def crc32c(data, crc=0):
    crc ^= 0xFFFFFFFF
    n = len(data) // 8 * 8
    t0, t1, t2, t3, t4, t5, t6, t7 = _T
    for (q,) in struct.iter_unpack("<Q", memoryview(data)[:n]):
        x = q ^ crc
        crc = (t7[x & 0xFF] ^ t6[(x >> 8) & 0xFF] ^ t5[(x >> 16) & 0xFF] ^ t4[(x >> 24) & 0xFF] ^
               t3[(x >> 32) & 0xFF] ^ t2[(x >> 40) & 0xFF] ^ t1[(x >> 48) & 0xFF] ^ t0[x >> 56])
    for b in data[n:]:
        crc = t0[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283


class Invalid(Exception):
    pass


def read_file(path, check_data=True):
    """Returns (header dict, list of entry dicts with 'data'). Raises Invalid."""
    with open(path, "rb") as f:
        b = f.read()
    if len(b) < HEADER_BYTES:
        raise Invalid("%s: %d bytes, shorter than the header" % (path, len(b)))
    if b[:8] != MAGIC:
        raise Invalid("%s: bad magic %r" % (path, b[:8]))
    (version, hbytes, align, ebytes, step, rank, flags, count, ioff, ibytes, fbytes, icrc) = struct.unpack_from(
        "<IIIIqIIQQQQI", b, 8)
    (hcrc,) = struct.unpack_from("<I", b, 124)
    if version != 1:
        raise Invalid("%s: version %d" % (path, version))
    if crc32c(b[:124]) != hcrc:
        raise Invalid("%s: header CRC mismatch" % path)
    if (hbytes, align, ebytes, flags) != (HEADER_BYTES, ALIGN, ENTRY_BYTES, 0):
        raise Invalid("%s: unsupported layout" % path)
    if any(b[76:124]):
        raise Invalid("%s: reserved header bytes are not zero" % path)
    if fbytes != len(b):
        raise Invalid("%s: file is %d bytes, header says %d" % (path, len(b), fbytes))
    if ioff < ALIGN or ioff % ALIGN or ibytes != count * ENTRY_BYTES or ioff + ibytes != fbytes:
        raise Invalid("%s: index out of bounds" % path)
    index = b[ioff:ioff + ibytes]
    if crc32c(index) != icrc:
        raise Invalid("%s: index CRC mismatch" % path)
    entries = []
    prev_end = ALIGN
    names = set()
    for i in range(count):
        rec = index[i * ENTRY_BYTES:(i + 1) * ENTRY_BYTES]
        name = rec[:128].split(b"\0", 1)[0].decode("utf-8", "replace")
        dtype, ndim = struct.unpack_from("<II", rec, 128)
        shape = list(struct.unpack_from("<8q", rec, 136))
        off, nbytes, crc = struct.unpack_from("<qqI", rec, 200)
        if not name or dtype not in DTYPE_SIZE or ndim > 8 or name in names:
            raise Invalid("%s: bad index record %d" % (path, i))
        names.add(name)
        shape = shape[:ndim]
        if not (dtype == RAW and ndim == 0):
            n = DTYPE_SIZE[dtype]
            for d in shape:
                n *= d
            if n != nbytes:
                raise Invalid("%s: entry %s: %d bytes for shape %s" % (path, name, nbytes, shape))
        if off % ALIGN or off < prev_end or off + nbytes > ioff:
            raise Invalid("%s: entry %s out of bounds" % (path, name))
        prev_end = off + nbytes
        data = b[off:off + nbytes]
        if check_data and crc32c(data) != crc:
            raise Invalid("%s: entry %s: data CRC mismatch" % (path, name))
        entries.append({"name": name, "dtype": dtype, "shape": shape, "offset": off, "bytes": nbytes,
                        "crc": crc, "data": data})
    return {"step": step, "rank": rank, "count": count}, entries


def write_file(path, step, rank, entries):
    """entries: list of (name, dtype, shape, data bytes). Writes a valid version-1 file."""
    body = bytearray(ALIGN)
    recs = bytearray()
    for name, dtype, shape, data in entries:
        while len(body) % ALIGN:
            body.append(0)
        off = len(body)
        body += data
        nb = name.encode()
        rec = bytearray(ENTRY_BYTES)
        rec[:len(nb)] = nb
        struct.pack_into("<II", rec, 128, dtype, len(shape))
        struct.pack_into("<8q", rec, 136, *(list(shape) + [0] * (8 - len(shape))))
        struct.pack_into("<qqI", rec, 200, off, len(data), crc32c(data))
        recs += rec
    while len(body) % ALIGN:
        body.append(0)
    ioff = len(body)
    hdr = bytearray(HEADER_BYTES)
    hdr[:8] = MAGIC
    struct.pack_into("<IIIIqIIQQQQI", hdr, 8, 1, HEADER_BYTES, ALIGN, ENTRY_BYTES, step, rank, 0, len(entries), ioff,
                     len(recs), ioff + len(recs), crc32c(recs))
    struct.pack_into("<I", hdr, 124, crc32c(hdr[:124]))
    body[:HEADER_BYTES] = hdr
    with open(path, "wb") as f:
        f.write(body + recs)


def rank_files(stepdir):
    return sorted(f for f in os.listdir(stepdir) if re.fullmatch(r"rank_\d{5}\.zckpt", f))


def verify_stepdir(stepdir, cache=None):
    marker = os.path.join(stepdir, "COMPLETE")
    if not os.path.isfile(marker):
        raise Invalid("%s: no COMPLETE marker" % stepdir)
    m = re.fullmatch(r"zoff-checkpoint 1\nstep (\d+)\nranks (\d+)\n", open(marker).read())
    if not m:
        raise Invalid("%s: malformed COMPLETE marker" % stepdir)
    step, ranks = int(m.group(1)), int(m.group(2))
    base = os.path.basename(os.path.normpath(stepdir))
    if base != "step_%08d" % step:
        raise Invalid("%s: marker says step %d" % (stepdir, step))
    files = rank_files(stepdir)
    if files != ["rank_%05d.zckpt" % r for r in range(ranks)]:
        raise Invalid("%s: rank files %s for %d rank(s)" % (stepdir, files, ranks))
    for r, f in enumerate(files):
        p = os.path.join(stepdir, f)
        st = os.stat(p)
        key = "%s %d %d %d" % (os.path.abspath(p), st.st_size, st.st_mtime_ns, st.st_ino)
        h, _ = read_file(p, check_data=cache is None or key not in cache)
        if cache is not None:
            cache.add(key)
        if h["step"] != step or h["rank"] != r:
            raise Invalid("%s/%s: header says step %d rank %d" % (stepdir, f, h["step"], h["rank"]))
    return step


def is_stepdir(p):
    """A step folder itself (DIR/step_NNNNNNNN, or a folder holding its COMPLETE or rank files), not a
    run folder: verify checks it alone instead of finding no step_* folder inside and passing."""
    if re.fullmatch(r"step_\d{8,}", os.path.basename(os.path.normpath(p))):
        return True
    return os.path.isdir(p) and (os.path.isfile(os.path.join(p, "COMPLETE")) or bool(rank_files(p)))


def verify_root(root, cache=None):
    """Every step_NNNNNNNN directory is complete and valid; temp (.tmp-) and .old- dirs are ignored.
    cache: a set of rank files (path, size, mtime, inode) whose data CRCs were already checked.
    root may also be one step directory: that checkpoint alone."""
    if is_stepdir(root):
        return [verify_stepdir(root, cache)]
    steps = []
    for d in sorted(os.listdir(root)):
        if not d.startswith("step_"):
            continue
        if re.fullmatch(r"step_\d{8,}\.(tmp|old)-[A-Za-z0-9_-]+", d):
            continue
        if not re.fullmatch(r"step_\d{8,}", d):
            raise Invalid("%s/%s: unexpected name" % (root, d))
        steps.append(verify_stepdir(os.path.join(root, d), cache))
    return steps


def _file_of(p):
    if os.path.isdir(p):
        if not is_stepdir(p):
            raise Invalid("%s is not a step directory (no COMPLETE, no rank_*.zckpt): give DIR/step_N or a "
                          ".zckpt file ('verify %s' lists the run's steps)" % (p, p))
        return os.path.join(p, "rank_00000.zckpt")
    return p


def compare(a, b, prefixes):
    _, ea = read_file(_file_of(a))
    _, eb = read_file(_file_of(b))
    keep = (lambda n: any(n.startswith(p) for p in prefixes)) if prefixes else (lambda n: True)
    da = {e["name"]: e for e in ea if keep(e["name"])}
    db = {e["name"]: e for e in eb if keep(e["name"])}
    if sorted(da) != sorted(db):
        raise Invalid("entries differ: only in %s: %s; only in %s: %s" % (
            a, sorted(set(da) - set(db)), b, sorted(set(db) - set(da))))
    for n in sorted(da):
        x, y = da[n], db[n]
        if (x["dtype"], x["shape"]) != (y["dtype"], y["shape"]):
            raise Invalid("entry %s: dtype/shape %s %s vs %s %s" % (n, x["dtype"], x["shape"], y["dtype"], y["shape"]))
        if x["data"] != y["data"]:
            i = next(k for k in range(len(x["data"])) if x["data"][k] != y["data"][k])
            raise Invalid("entry %s differs first at byte %d of %d" % (n, i, len(x["data"])))
    return len(da)


def strip(path, meta_keys, names):
    import json
    hdr, es = read_file(path)
    out = []
    for e in es:
        data = e["data"]
        if e["name"] in names:
            continue
        if e["name"] == "meta":
            m = json.loads(data)
            for k in meta_keys:
                m.pop(k, None)
            data = json.dumps(m, indent=1, sort_keys=True).encode()
        shape = [len(data)] if e["name"] == "meta" and e["shape"] else e["shape"]  # a blob: [] or [bytes]
        out.append((e["name"], e["dtype"], shape, data))
    write_file(path, hdr["step"], hdr["rank"], out)


def _options(rest, flag):
    vals = []
    while flag in rest:
        i = rest.index(flag)
        vals.append(rest[i + 1])
        del rest[i:i + 2]
    return vals


def main(argv):
    if len(argv) < 3 or argv[1] not in ("verify", "compare", "list", "strip"):
        sys.stderr.write(__doc__)
        return 2
    try:
        if argv[1] == "verify":
            cache, cache_file = None, None
            if len(argv) == 5 and argv[3] == "--cache":
                cache_file = argv[4]
                cache = set(open(cache_file).read().split("\n")) if os.path.exists(cache_file) else set()
            steps = verify_root(argv[2], cache)
            if cache_file:
                with open(cache_file, "w") as f:
                    f.write("\n".join(sorted(k for k in cache if k)))
            print("ok: %d complete checkpoint(s): %s" % (len(steps), " ".join(str(s) for s in steps)))
        elif argv[1] == "strip":
            rest = argv[2:]
            keys, names = _options(rest, "--meta-key"), _options(rest, "--entry")
            if len(rest) != 1:
                sys.stderr.write(__doc__)
                return 2
            strip(rest[0], keys, names)
            print("ok: %s rewritten" % rest[0])
        elif argv[1] == "compare":
            rest = argv[2:]
            prefixes = _options(rest, "--prefix")
            if len(rest) != 2:
                sys.stderr.write(__doc__)
                return 2
            n = compare(rest[0], rest[1], prefixes)
            print("ok: %d entries bit-identical" % n)
        else:
            h, es = read_file(_file_of(argv[2]))
            print("step %d rank %d, %d entries" % (h["step"], h["rank"], h["count"]))
            for e in es:
                print("  %-40s dtype %3d shape %-20s %10d bytes crc %08x" % (
                    e["name"], e["dtype"], e["shape"], e["bytes"], e["crc"]))
    except (Invalid, OSError) as e:
        sys.stderr.write("zckpt.py: %s\n" % e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
